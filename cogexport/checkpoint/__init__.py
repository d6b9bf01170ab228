"""The source side: find a checkpoint's files, load them safely, and hand out tensors lazily."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import CogExportError
from .base import CheckpointInfo, LazyCheckpoint
from .readers import is_deepspeed_folder
from .dcp import DcpCheckpoint
from .deepspeed_universal import UniversalCheckpoint
from .deepspeed_zero import DeepSpeedCheckpoint
from .dispatch import as_paths, open_checkpoint
from .hf_storage import HfConsolidatedCheckpoint, HfShardedCheckpoint
from .locate import ema_source
from .safetensors_files import SafetensorsCheckpoint
from .torch_state_dict import TorchStateDictCheckpoint


def open_ema(checkpoint: str | Path | Sequence[str | Path], tag: str | None = None) -> LazyCheckpoint:
    """A run's EMA weights: SAT's copy in the TAG-ema folder beside the checkpoint, else an ``ema`` state dict saved
    in the same file beside ``module`` (HunyuanVideo's releases and training runs)."""
    paths = as_paths(checkpoint)
    try:
        ema_paths, ema_tag = ema_source(paths, tag)
    except CogExportError as no_folder:
        try:
            return open_checkpoint(paths, tag, entry="ema")
        except CogExportError:
            raise CogExportError(f"{no_folder}, and the checkpoint file holds no 'ema' state dict") from None
    return open_checkpoint(ema_paths, ema_tag)


__all__ = ["CheckpointInfo", "DcpCheckpoint", "DeepSpeedCheckpoint", "HfConsolidatedCheckpoint", "HfShardedCheckpoint",
           "LazyCheckpoint", "SafetensorsCheckpoint", "TorchStateDictCheckpoint", "UniversalCheckpoint", "as_paths",
           "is_deepspeed_folder", "open_checkpoint", "open_ema"]
