"""A SAT checkpoint folder as SwissArmyTransformer's loader reads it: ``latest`` naming the iteration, and
``<iteration>/mp_rank_00_model_states.pt`` holding the weights under ``module`` (written a tensor at a time)."""

from __future__ import annotations

from typing import Mapping

from ..lazy import LazyTensor
from .folder_plan import PlannedFile, TensorFile, TextFile

ITERATION = "1"  # what the released SAT transformers use
MODEL_STATES = "mp_rank_00_model_states.pt"


def sat_files(folder: str, tensors: Mapping[str, LazyTensor]) -> list[PlannedFile]:
    prefix = f"{folder}/" if folder else ""
    return [TextFile(f"{prefix}latest", ITERATION + "\n"),
            TensorFile(f"{prefix}{ITERATION}/{MODEL_STATES}", tensors, container="torch", under="module",
                       extra={"iteration": int(ITERATION)})]
