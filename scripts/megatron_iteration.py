"""The steps every maker of a tiny Megatron-Core test run (make_megatron_*_checkpoint.py) ends with: one iteration
saved by megatron-core's own ``dist_checkpointing.save`` into ``OUT/run/iter_NNNNNNN/``, then, on rank 0, the run's
tracker and the ground truth beside the run (``OUT/truth.safetensors``, ``OUT/truth.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def save_iteration(out: Path, rank: int, iteration: int, state: dict, **save_options) -> Path:
    """``state`` saved by megatron-core into the iteration's folder (made by rank 0, waited for by every rank);
    ``save_options`` go to ``dist_checkpointing.save`` (another backend's strategy). Returns the run folder."""
    from megatron.core import dist_checkpointing

    run = Path(out) / "run"
    folder = run / f"iter_{iteration:07d}"
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    dist_checkpointing.save(state, str(folder), **save_options)
    return run


def write_truth(out: Path, run: Path, iteration: int, truth: dict, facts: dict) -> None:
    """The tracker naming the iteration, the truth's tensors and the facts the tests read about them."""
    from safetensors.torch import save_file

    (run / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    save_file({k: v.contiguous() for k, v in truth.items()}, str(Path(out) / "truth.safetensors"))
    (Path(out) / "truth.json").write_text(json.dumps(facts, indent=1))


def truth_keys(truth: dict, kind: str) -> list[str]:
    """The keys of one kind of truth (``model.`` tensors, ``master.`` fp32 masters), without the kind."""
    return sorted(key[len(kind) + 1:] for key in truth if key.startswith(f"{kind}."))
