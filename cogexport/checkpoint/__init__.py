"""The source side: find a checkpoint's files, load them safely, and hand out tensors lazily."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .base import CheckpointInfo, LazyCheckpoint
from .deepspeed_universal import UniversalCheckpoint
from .deepspeed_zero import DeepSpeedCheckpoint
from .locate import MODEL_STATES, ZERO3_MODEL_STATES, is_universal_folder, list_tags
from .safetensors_files import SafetensorsCheckpoint
from .torch_state_dict import TorchStateDictCheckpoint


def as_paths(checkpoint: str | Path | Sequence[str | Path]) -> list[Path]:
    """One path or several (rank files spread over several folders) as a list of paths."""
    if isinstance(checkpoint, (str, Path)):
        return [Path(checkpoint)]
    return [Path(p) for p in checkpoint]


def is_deepspeed_folder(folder: Path) -> bool:
    return (folder / "latest").is_file() or bool(list_tags(folder)) or any(
        MODEL_STATES.match(p.name) or ZERO3_MODEL_STATES.match(p.name) for p in folder.iterdir())


def open_checkpoint(checkpoint: str | Path | Sequence[str | Path], tag: str | None = None,
                    *, strict: bool = True) -> LazyCheckpoint:
    """Open a checkpoint as a lazy mapping of names to ``LazyTensor`` (shape and dtype known, data read on load).

    DeepSpeed save dirs, tag dirs and model-states files (several paths for multi-node runs), safetensors files
    and folders (several files: one model's parts, their tensors named after each file), and plain torch.save
    state-dict files are recognised by what they are.
    """
    paths = as_paths(checkpoint)
    if len(paths) > 1 and all(p.is_file() and p.suffix == ".safetensors" for p in paths):
        return SafetensorsCheckpoint(paths)  # one model's parts, one file each
    if len(paths) == 1 and paths[0].exists():
        path = paths[0]
        if path.is_file() and path.suffix == ".safetensors":
            return SafetensorsCheckpoint(path)
        if path.is_file() and not (MODEL_STATES.match(path.name) or ZERO3_MODEL_STATES.match(path.name)):
            return TorchStateDictCheckpoint(path)
        if path.is_dir() and is_universal_folder(path):
            return UniversalCheckpoint(path)
        if path.is_dir() and tag is not None and is_universal_folder(path / tag):  # --tag global_step9_universal
            return UniversalCheckpoint(path / tag)
        if path.is_dir() and not is_deepspeed_folder(path) and any(path.glob("*.safetensors")):
            return SafetensorsCheckpoint(path)
    return DeepSpeedCheckpoint(paths, tag, strict=strict)


__all__ = ["CheckpointInfo", "DeepSpeedCheckpoint", "LazyCheckpoint", "SafetensorsCheckpoint",
           "TorchStateDictCheckpoint", "UniversalCheckpoint", "as_paths", "is_deepspeed_folder", "open_checkpoint"]
