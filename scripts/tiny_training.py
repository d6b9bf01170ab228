"""The tiny fine-tunes' training loop, shared by every finetune_tiny_* script: CPU ranks, a few steps under real
DeepSpeed (plain, or through accelerate as CogVideo's finetune/, DiffSynth-Studio and musubi-tuner drive it) or under
FSDP2 saved with torch.distributed.checkpoint, and the ground truth written beside the checkpoint from inside the
training process. A family's script brings its model, its loss, which modules a LoRA targets and what to save.

    launch(rank_main, OUT, base=BASE, save_dir="checkpoint", world_size=2, steps=2, ...)  # the parent; in a rank:
    deepspeed, engine = train_deepspeed(model, spec, loss_of)             # plain DeepSpeed ZeRO, then
    save_deepspeed(deepspeed, engine, spec, rank)                         # OUT/checkpoint, OUT/truth.*; or
    deepspeed, accelerator = start_accelerator(spec, rank, world_size)    # accelerate's DeepSpeed integration:
    engine = train_accelerate(accelerator, model, spec, loss_of)
    save_accelerate(deepspeed, accelerator, engine, spec, rank, settings)  # OUT/checkpoint-K, OUT/truth.*; or
    with gloo_group(rendezvous, rank, world_size):                        # FSDP2 and dcp.save
        train_fsdp2_and_save(model, model.blocks, spec, rank, loss_of)   # OUT/run/checkpoint, OUT/truth.*

``loss_of(model, step)`` is the family's loss on its own made-up data for that step (seeded by step and rank, so every
rank and step sees other data).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import deepspeed_config, import_deepspeed, spawn_ranks  # noqa: E402
from make_deepspeed_checkpoint import collect_truth, write_truth  # noqa: E402

TRAIN_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ACCELERATE_TAG = "pytorch_model"  # accelerate's DeepSpeed tag for the first prepared model
SAVE_DIRS = {"deepspeed": "checkpoint", "dcp": "run/checkpoint"}  # where each writer saves, under OUT
LossOf = Callable[[nn.Module, int], torch.Tensor]


def launch(rank_main: Callable[[int, int, str, dict], None], out: str | os.PathLike,
           base: str | os.PathLike | None = None, **settings) -> Path:
    """Run ``rank_main(rank, world_size, rendezvous, spec)`` in ``settings["world_size"]`` fresh CPU processes and
    return OUT. The spec is the settings with OUT (and BASE) made absolute and ``save_dir`` made a folder of OUT."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = {**({"base": str(Path(base).resolve())} if base is not None else {}), "out": str(out), **settings}
    if "save_dir" in spec:
        spec["save_dir"] = str(out / spec["save_dir"])
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(rank_main, spec["world_size"], spec)
    return out


def config_facts(config) -> dict:
    """A model config as truth.json keeps it (tuples as lists)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in dict(config).items()}


# -- plain DeepSpeed --------------------------------------------------------------------------------------------------
class WeightEma:
    """An fp32 exponential moving average of the trained weights, as a training loop keeps it to save beside the
    module (the releases' ``ema`` entry)."""

    def __init__(self, decay: float) -> None:
        self.decay, self.weights = decay, {}

    def start(self, engine) -> None:
        # from the engine's module: DeepSpeed has cast it to the training dtype by now
        self.weights = {name: param.detach().float().clone() for name, param in engine.module.named_parameters()}

    def update(self, engine) -> None:
        for name, param in engine.module.named_parameters():
            self.weights[name].mul_(self.decay).add_(param.detach().float(), alpha=1 - self.decay)


def train_deepspeed(model: nn.Module, spec: dict, loss_of: LossOf, lr: float = 1e-2, ema: WeightEma | None = None):
    """deepspeed and a ZeRO engine (the run's stage and dtype) around ``model``'s trainable parameters, trained
    ``spec["steps"]`` steps (``ema`` kept over them)."""
    deepspeed = import_deepspeed()
    trainable = [param for param in model.parameters() if param.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable,
                                      config=deepspeed_config(spec["stage"], spec["dtype"], lr=lr))
    if ema is not None:
        ema.start(engine)
    for step in range(spec["steps"]):
        engine.backward(loss_of(engine, step))
        engine.step()
        if ema is not None:
            ema.update(engine)
    return deepspeed, engine


def save_deepspeed(deepspeed, engine, spec: dict, rank: int, client_state: dict | None = None,
                   extra_tensors: dict | None = None, facts: dict | None = None) -> None:
    """``engine.save_checkpoint(save_dir)`` and OUT/truth.* (every trainable parameter's fp32 master, taken from the
    live engine; ``extra_tensors`` and ``facts`` beside them)."""
    engine.save_checkpoint(spec["save_dir"], client_state=client_state or {})
    truth = collect_truth(deepspeed, engine, spec["stage"])
    if rank == 0:
        truth["tensors"].update(extra_tensors or {})
        write_truth({**truth, **(facts or {})}, spec, Path(spec["out"]))
    deepspeed.comm.barrier()


class OriginalLayoutModule(nn.Module):
    """Parameters under an original repo's names, whose model class is not installable: the forward renames them
    (``to_diffusers``) and runs the Diffusers model on them (``torch.func.functional_call``), so every original
    tensor trains under its original name."""

    def __init__(self, state_dict: dict[str, torch.Tensor], diffusers_model: nn.Module,
                 to_diffusers: Callable[[dict], dict]) -> None:
        super().__init__()
        for name, tensor in state_dict.items():
            owner = self
            *path, leaf = name.split(".")
            for part in path:
                if part not in owner._modules:
                    owner.add_module(part, nn.Module())
                owner = owner._modules[part]
            owner.register_parameter(leaf, nn.Parameter(tensor))
        # kept out of the module tree: its own parameters are placeholders, replaced on every call
        self._diffusers = [diffusers_model.requires_grad_(False)]
        self._to_diffusers = to_diffusers

    def forward(self, **inputs):
        weights = self._to_diffusers(dict(self.named_parameters()))
        return torch.func.functional_call(self._diffusers[0], weights, args=(), kwargs=inputs)


# -- accelerate's DeepSpeed integration -------------------------------------------------------------------------------
def accelerate_config(stage: int, dtype: str, lr: float) -> dict:
    """DeepSpeed config in the spirit of CogVideo finetune/configs/zero{2,3}.yaml, with concrete numbers for CPU."""
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
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=accelerate_config(spec["stage"], spec["dtype"], spec["lr"])),
        mixed_precision="bf16" if spec["dtype"] == "bf16" else "no",
        # Without an explicit backend accelerate finds no GPU backend, treats every rank as process 0 of 1
        # and all ranks would write rank 0's files; naming gloo makes it read rank and size from torch.
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")],
    )
    if (accelerator.num_processes, accelerator.process_index) != (world_size, rank):
        raise RuntimeError(f"accelerate sees rank {accelerator.process_index} of {accelerator.num_processes}")
    return deepspeed, accelerator


def train_accelerate(accelerator, module: nn.Module, spec: dict, loss_of: LossOf):
    """The DeepSpeed engine around ``module``, trained ``spec["steps"]`` steps. The optimizer lives in the DeepSpeed
    config, so accelerate gets a DummyOptim over the trainable parameters (as finetune/'s zero*.yaml runs do)."""
    from accelerate.utils import DummyOptim

    trainable = [param for param in module.parameters() if param.requires_grad]
    engine, _ = accelerator.prepare(module, DummyOptim(trainable, lr=spec["lr"]))
    for step in range(spec["steps"]):
        accelerator.backward(loss_of(engine, step))  # under DeepSpeed this is engine.backward + engine.step
    return engine


def save_accelerate(deepspeed, accelerator, engine, spec: dict, rank: int, settings: Callable[[str], dict],
                    after_save: Callable[[], None] | None = None) -> None:
    """``accelerator.save_state(OUT/checkpoint-K)`` and OUT/truth.* (every trainable parameter's fp32 master, and
    ``settings(checkpoint name)`` with accelerate's tag); ``after_save()`` runs on every rank in between."""
    checkpoint = Path(spec["out"]) / f"checkpoint-{spec['steps']}"
    accelerator.save_state(checkpoint)
    truth = collect_truth(deepspeed, engine, spec["stage"])
    if after_save is not None:
        after_save()
    if rank == 0:
        from safetensors.torch import save_file

        out = Path(spec["out"])
        save_file({k: v.contiguous() for k, v in truth.pop("tensors").items()}, out / "truth.safetensors")
        facts = {**truth, "settings": {**settings(checkpoint.name), "tag": ACCELERATE_TAG, "driver": "accelerate"}}
        (out / "truth.json").write_text(json.dumps(facts, indent=1))
    accelerator.wait_for_everyone()


def pick(spec: dict, *keys: str) -> dict:
    return {key: spec[key] for key in keys}


# -- LoRA -------------------------------------------------------------------------------------------------------------
def add_lora(model, rank: int, alpha: float, target_modules: list[str]):
    """Freeze ``model`` and add a PEFT LoRA adapter (``add_adapter``, as Diffusers-based trainers do) on the target
    modules: only the LoRA matrices train."""
    from peft import LoraConfig

    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=True, target_modules=target_modules))
    return model


# -- FSDP2 and torch.distributed.checkpoint ---------------------------------------------------------------------------
@contextmanager
def gloo_group(rendezvous: str, rank: int, world_size: int) -> Iterator[None]:
    """The rank's gloo process group for the body, every rank meeting at a barrier at its end."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world_size)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def shard_blocks(model: nn.Module, blocks: Iterable[nn.Module], world_size: int) -> nn.Module:
    """FSDP2 as the trainers apply it: ``fully_shard`` each block, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train_fsdp2(model: nn.Module, spec: dict, loss_of: LossOf, lr: float = 1e-2,
                save: Callable[[nn.Module, object, int], None] | None = None):
    """AdamW over ``model``, steps 1 to ``spec["steps"]``; ``save(model, optimizer, step)`` after each. Returns the
    optimizer."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(1, spec["steps"] + 1):
        loss_of(model, step).backward()
        optimizer.step()
        optimizer.zero_grad()
        if save is not None:
            save(model, optimizer, step)
    return optimizer


def save_dcp(model: nn.Module, optimizer, folder: str | os.PathLike, step: int | None = None) -> None:
    """``dcp.save({"model": ..., "optimizer": ..., "step": ...})``, as a plain FSDP2 training loop saves."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = {"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, optimizer)}
    if step is not None:
        state["step"] = step
    dcp.save(state, checkpoint_id=str(folder))


def train_fsdp2_and_save(model: nn.Module, blocks: Iterable[nn.Module], spec: dict, rank: int, loss_of: LossOf,
                         lr: float = 1e-2) -> None:
    """A plain FSDP2 training loop as SimpleTuner- or finetrainers-style code runs it (inside ``gloo_group``):
    ``blocks`` and then the root sharded, AdamW, ``dcp.save({"model", "optimizer", "step"})`` into save_dir after
    each step; the truth is the full state dict, with the model's config."""
    shard_blocks(model, blocks, spec["world_size"])
    train_fsdp2(model, spec, loss_of, lr, save=lambda model, optimizer, step: save_dcp(model, optimizer,
                                                                                      spec["save_dir"], step))
    write_full_state_truth(model, rank, spec["out"], {"config": dict(model.config), "step": spec["steps"],
                                                      "settings": pick(spec, "writer", "world_size", "steps")})


def write_full_state_truth(model: nn.Module, rank: int, out: str | os.PathLike, facts: dict) -> None:
    """OUT/truth.safetensors, the model's full state dict gathered inside training (a collective), and
    OUT/truth.json: its order and ``facts``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        from safetensors.torch import save_file

        tensors = {name: tensor.detach().clone().contiguous() for name, tensor in weights.items()}
        save_file(tensors, Path(out) / "truth.safetensors")
        truth = {"order": list(weights), **facts}
        (Path(out) / "truth.json").write_text(json.dumps(truth, indent=1, default=str))
