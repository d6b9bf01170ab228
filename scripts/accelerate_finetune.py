"""What the tiny fine-tune scripts share: training a module two steps under real DeepSpeed on CPU through accelerate's
DeepSpeed integration, the way CogVideo's finetune/, DiffSynth-Studio and musubi-tuner drive it
(``Accelerator(deepspeed_plugin=...)``, ``prepare``, ``backward``, ``save_state``), and the ground truth taken inside
the training process.

    run_ranks(train_and_save, BASE, OUT, world_size=2, steps=2, ...)  # in the parent: the ranks, each running
    deepspeed, accelerator = start_accelerator(spec, rank, world_size)       # train_and_save(rank, ..., spec):
    engine = prepare(accelerator, module, spec["lr"])
    for step in range(steps): accelerator.backward(loss_of(engine, step))
    checkpoint = save_checkpoint(accelerator, spec)          # OUT/checkpoint-K: the DeepSpeed tag dir "pytorch_model"
    truth = collect_truth(deepspeed, engine, spec["stage"])   # every trainable parameter's fp32 master, ...
    write_truth(truth, spec, settings)                        # OUT/truth.safetensors, OUT/truth.json (rank 0)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import deepspeed_config, import_deepspeed, spawn_ranks  # noqa: E402
from make_deepspeed_checkpoint import collect_truth  # noqa: E402,F401  (re-exported for the fine-tune scripts)

TAG = "pytorch_model"  # accelerate's DeepSpeed tag for the first prepared model
TRAIN_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def run_ranks(train_and_save: Callable[[int, int, str, dict], None], base: str | os.PathLike,
              out: str | os.PathLike, **settings) -> Path:
    """Run ``train_and_save(rank, world_size, rendezvous, spec)`` in ``settings["world_size"]`` fresh CPU processes,
    the spec being the run's settings with BASE and OUT made absolute; returns OUT/checkpoint-K."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = dict(base=str(Path(base).resolve()), out=str(out), **settings)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(train_and_save, spec["world_size"], spec)
    return out / f"checkpoint-{spec['steps']}"


def finetune_config(stage: int, dtype: str, lr: float) -> dict:
    """DeepSpeed config in the spirit of finetune/configs/zero{2,3}.yaml, with concrete numbers for CPU."""
    config = deepspeed_config(stage, dtype, lr=lr)
    config["gradient_clipping"] = 1.0
    if stage == 3:
        # Keep even the tiny parameters partitioned (the real default persists params < 1e5 elements whole),
        # so every trainable tensor really is split across ranks in the checkpoint.
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    return config


def start_accelerator(spec: dict, rank: int, world_size: int):
    """deepspeed (imported for CPU, gloo initialised) and an Accelerator driving it with the run's config."""
    deepspeed = import_deepspeed()  # initialises gloo through deepspeed.comm; accelerate then reuses it
    from accelerate import Accelerator, DeepSpeedPlugin
    from accelerate.utils import InitProcessGroupKwargs
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.disable_progress_bar()
    accelerator = Accelerator(
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=finetune_config(spec["stage"], spec["dtype"], spec["lr"])),
        mixed_precision="bf16" if spec["dtype"] == "bf16" else "no",
        # Without an explicit backend accelerate finds no GPU backend, treats every rank as process 0 of 1
        # and all ranks would write rank 0's files; naming gloo makes it read rank and size from torch.
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")],
    )
    if (accelerator.num_processes, accelerator.process_index) != (world_size, rank):
        raise RuntimeError(f"accelerate sees rank {accelerator.process_index} of {accelerator.num_processes}")
    return deepspeed, accelerator


def prepare(accelerator, module: torch.nn.Module, lr: float):
    """The DeepSpeed engine around ``module``; the optimizer lives in the DeepSpeed config, so accelerate gets a
    DummyOptim over the trainable parameters (as finetune/'s zero*.yaml runs do)."""
    from accelerate.utils import DummyOptim

    trainable = [param for param in module.parameters() if param.requires_grad]
    engine, _ = accelerator.prepare(module, DummyOptim(trainable, lr=lr))
    return engine


def save_checkpoint(accelerator, spec: dict) -> Path:
    checkpoint = Path(spec["out"]) / f"checkpoint-{spec['steps']}"
    accelerator.save_state(checkpoint)
    return checkpoint


def write_truth(truth: dict, spec: dict, settings: dict) -> None:
    """OUT/truth.safetensors (the tensors) and OUT/truth.json (order, names, the run's settings)."""
    from safetensors.torch import save_file

    out = Path(spec["out"])
    save_file({k: v.contiguous() for k, v in truth.pop("tensors").items()}, out / "truth.safetensors")
    (out / "truth.json").write_text(json.dumps({**truth, "settings": {**settings, "tag": TAG, "driver": "accelerate"}},
                                               indent=1))
