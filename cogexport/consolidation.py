"""``cogexport consolidate``: one set of weights from a rank-sharded DeepSpeed checkpoint.

Every name of the trained module's state_dict is written: trainable parameters (fp32 masters), frozen
parameters (their stored bits, upcast), tied aliases (a copy of their source, since safetensors cannot share
memory) and persistent buffers (in their own dtype). Files follow Hugging Face naming: ``model.safetensors`` or
``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .checkpoint import as_paths, open_checkpoint
from .checkpoint.readers import info_dict
from .errors import CogExportError
from .lazy import LazyTensor
from .precision import dtype_named
from .write.folder_plan import FolderPlan, shard_files
from .write.io_engine import IOSettings
from .write.publish_plan import write_plan
from .write.shards import plan_shards
from .write.staging import check_destination
from .write.value_watch import passed_on_note

WEIGHTS_NAME = "model.safetensors"


@dataclass
class ConsolidateResult:
    output: str
    files: list[str]
    tensors: int
    total_bytes: int
    dtype: str
    source: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def consolidation_dtypes(tensors: dict[str, LazyTensor], buffers: set[str], dtype: torch.dtype) -> dict[str, LazyTensor]:
    """Floating parameters in ``dtype``; buffers (and anything not floating) exactly as stored."""
    return {name: tensor if name in buffers or not tensor.dtype.is_floating_point else tensor.to(dtype)
            for name, tensor in tensors.items()}


def consolidate(checkpoint: str | Path | Sequence[str | Path], output: str | Path, *, dtype: str = "fp32",
                tag: str | None = None, role: str | None = None, max_shard_size: str | int = "5GB",
                overwrite: bool = False, progress: bool | None = None, workers: int | None = None,
                allow_nonfinite: bool = False) -> ConsolidateResult:
    """Write the consolidated weights of ``checkpoint`` into the folder ``output``. ``workers``: threads loading
    tensors ahead of the writer (None: one per core); in a torchrun job (``write.ranks``) each rank writes its
    share of the shards. A tensor holding NaN or infinite values is refused unless ``allow_nonfinite``."""
    target_dtype = dtype_named(dtype)
    paths, output = as_paths(checkpoint), Path(output)
    with open_checkpoint(paths, tag, entry=role) as source:
        tensors = consolidation_dtypes(dict(source), set(source.info.buffers), target_dtype)
        if not tensors:
            raise CogExportError(f"{', '.join(source.info.paths)} holds no tensors to consolidate")
        plan = plan_shards(tensors, WEIGHTS_NAME, max_shard_size)
        folder = FolderPlan(shard_files("", tensors, plan))
        passed_on = write_plan(folder, output, IOSettings(workers=workers), "consolidate", progress,
                               check=lambda: check_destination(output, source.own_folders(),
                                                               [*paths, *source.info.files], overwrite),
                               allow_nonfinite=allow_nonfinite)
        return ConsolidateResult(str(output), folder.written_paths, len(tensors), plan.total_bytes, dtype,
                                 info_dict(source.info), notes=list(filter(None, [passed_on_note(passed_on)])))
