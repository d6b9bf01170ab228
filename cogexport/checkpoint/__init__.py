"""The source side: find a checkpoint's files, load them safely, and hand out tensors lazily."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import CogExportError, RoleError, quoted
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
        except RoleError:
            raise  # the reader's own word on its EMA (a FastVideo EMA kept in per-rank pieces, ...)
        except CogExportError:
            raise CogExportError(f"{no_folder}, and the checkpoint file holds no 'ema' state dict") from None
    return open_checkpoint(ema_paths, ema_tag)


def open_weights(checkpoint: str | Path | Sequence[str | Path], tag: str | None = None, *, ema: bool = False,
                 role: str | None = None, strict: bool = True) -> LazyCheckpoint:
    """The set of weights asked for: the trained one by default; with ``role`` (``--role``) the one of that name in
    a checkpoint keeping several (a FastVideo role; a state dict beside ``module`` in a DeepSpeed or torch.save
    file); with ``ema``, ``open_ema``'s."""
    if ema and role not in (None, "ema"):
        raise CogExportError(f"--ema reads the EMA weights and --role {quoted(role)} another set: give one of them")
    return open_ema(checkpoint, tag) if ema else open_checkpoint(checkpoint, tag, strict=strict, entry=role)


__all__ = ["CheckpointInfo", "DcpCheckpoint", "DeepSpeedCheckpoint", "HfConsolidatedCheckpoint", "HfShardedCheckpoint",
           "LazyCheckpoint", "SafetensorsCheckpoint", "TorchStateDictCheckpoint", "UniversalCheckpoint", "as_paths",
           "is_deepspeed_folder", "open_checkpoint", "open_ema", "open_weights"]
