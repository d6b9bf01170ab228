"""Run real DeepSpeed training ranks on a CPU-only machine (tests, demo, benchmark).

DeepSpeed needs a few nudges to train on CPU: the CPU accelerator, gloo, no JIT-compiled
shared-memory op, and torch's own Adam. Everything here is for making checkpoints; the
cogexport tool itself never imports deepspeed.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp


def spawn_ranks(rank_main: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``rank_main(rank, world_size, rendezvous, *args)`` in ``world_size`` fresh processes."""
    # The ranks meet through a file, not a TCP port: a port picked as free can be taken by a parallel test run
    # before the ranks bind it.
    with tempfile.TemporaryDirectory(prefix="cogexport-ranks-") as folder:
        rendezvous = f"file://{Path(folder) / 'rendezvous'}"
        mp.spawn(_enter_rank, args=(rank_main, world_size, rendezvous, args), nprocs=world_size, join=True)


def _enter_rank(rank: int, rank_main: Callable[..., None], world_size: int, rendezvous: str, args: tuple) -> None:
    os.environ.update(
        DS_ACCELERATOR="cpu",
        COGEXPORT_RENDEZVOUS=rendezvous,
        OMP_NUM_THREADS="1",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    rank_main(rank, world_size, rendezvous, *args)


def import_deepspeed():
    """Import deepspeed for CPU training, skipping the 40-80 s JIT build of a comm op training does not use."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    # DeepSpeed's CPU accelerator allows fp16 training only where oneDNN has fp16 kernels (recent Intel CPUs);
    # torch runs these tiny fp16 models on any CPU, and fp16 checkpoints are a layout the reader must handle.
    get_accelerator().is_fp16_supported = lambda: True

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", init_method=os.environ["COGEXPORT_RENDEZVOUS"],
                                             rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def deepspeed_config(
    stage: int,
    dtype: str,
    *,
    sub_group_size: int | None = None,
    parameter_alignment: bool = False,
    bf16_optimizer: bool = False,
    micro_batch_size: int = 1,
    lr: float = 1e-2,
) -> dict:
    """A DeepSpeed config for one of the checkpoint variants the reader must handle."""
    zero: dict[str, Any] = {"stage": stage}
    if sub_group_size is not None:
        zero["sub_group_size"] = sub_group_size
    if parameter_alignment:
        zero["parameter_alignment"] = True
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "torch_adam": True}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 8}
    elif dtype != "fp32":
        raise ValueError(f"unknown dtype {dtype!r}")
    if bf16_optimizer:
        if dtype != "bf16" or stage != 1:
            raise ValueError("the BF16_Optimizer variant is stage 1 with bf16")
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    return config
