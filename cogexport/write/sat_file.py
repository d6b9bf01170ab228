"""A SAT checkpoint folder as SwissArmyTransformer's loader reads it: ``latest`` naming the iteration, and
``<iteration>/mp_rank_00_model_states.pt`` holding the weights under ``module`` (written a tensor at a time)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from ..lazy import LazyTensor
from .torch_archive import write_torch_archive

ITERATION = "1"  # what the released SAT transformers use
MODEL_STATES = "mp_rank_00_model_states.pt"


def write_sat_model_states(folder: Path, tensors: Mapping[str, LazyTensor],
                           on_tensor: Callable[[str, int], None] | None = None) -> list[str]:
    (folder / ITERATION).mkdir(parents=True, exist_ok=True)
    write_torch_archive(folder / ITERATION / MODEL_STATES, {"module": dict(tensors), "iteration": int(ITERATION)},
                        on_tensor)
    (folder / "latest").write_text(ITERATION + "\n", encoding="utf-8")
    return ["latest", f"{ITERATION}/{MODEL_STATES}"]
