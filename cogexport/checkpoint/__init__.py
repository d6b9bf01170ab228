"""The source side: find a checkpoint's files, load them safely, and hand out tensors lazily."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .deepspeed_zero import CheckpointInfo, DeepSpeedCheckpoint


def as_paths(checkpoint: str | Path | Sequence[str | Path]) -> list[Path]:
    """One path or several (rank files spread over several folders) as a list of paths."""
    if isinstance(checkpoint, (str, Path)):
        return [Path(checkpoint)]
    return [Path(p) for p in checkpoint]


def open_checkpoint(checkpoint: str | Path | Sequence[str | Path], tag: str | None = None,
                    *, strict: bool = True) -> DeepSpeedCheckpoint:
    """Open a checkpoint as a lazy mapping of names to ``LazyTensor`` (shape and dtype known, data read on load)."""
    return DeepSpeedCheckpoint(as_paths(checkpoint), tag, strict=strict)


__all__ = ["CheckpointInfo", "DeepSpeedCheckpoint", "as_paths", "open_checkpoint"]
