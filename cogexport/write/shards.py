"""Plan and write a sharded safetensors checkpoint the way Hugging Face libraries do.

Shards are cut by ``huggingface_hub``'s own splitter (greedy, in the given key order, decimal size units),
so file names, boundaries and the index match ``save_pretrained`` for the same tensors. The plan needs only
shapes and dtypes; writing then streams one tensor at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from huggingface_hub import split_state_dict_into_shards_factory

from ..errors import CogExportError
from ..lazy import LazyTensor

SAFETENSORS_METADATA = {"format": "pt"}


@dataclass
class ShardPlan:
    """Which tensors go in which file, and the index to write when there is more than one file."""

    files: dict[str, list[str]]
    index_name: str
    index: dict | None
    total_bytes: int

    @property
    def is_sharded(self) -> bool:
        return self.index is not None


def parse_size(size: str | int) -> int:
    """'5GB' -> 5_000_000_000 (decimal units, as huggingface_hub reads them); a plain number is bytes."""
    from huggingface_hub.serialization._base import parse_size_to_int

    text = str(size).strip()
    try:
        value = int(text) if text.isdigit() else parse_size_to_int(text)
    except ValueError:
        raise CogExportError(f"--max-shard-size {size!r} is not a size; write it like 5GB, 500MB or 2000000000") from None
    if value <= 0:
        raise CogExportError(f"--max-shard-size {size!r} must be more than 0 bytes")
    return value


def plan_shards(tensors: Mapping[str, LazyTensor], weights_name: str, max_shard_size: str | int,
                variant: str | None = None) -> ShardPlan:
    """Split like ``save_pretrained`` would for ``weights_name`` (e.g. 'model.safetensors') and ``variant``."""
    stem = weights_name[: -len(".safetensors")]
    variant_part = f".{variant}" if variant else ""
    split = split_state_dict_into_shards_factory(
        dict(tensors),
        get_storage_size=lambda tensor: tensor.nbytes,
        filename_pattern=f"{stem}{variant_part}{{suffix}}.safetensors",
        max_shard_size=parse_size(max_shard_size),
    )
    index = None
    if split.is_sharded:
        index = {"metadata": dict(split.metadata), "weight_map": dict(split.tensor_to_filename)}
    # The variant goes into the index name just before '.json': model.safetensors.index.fp16.json
    return ShardPlan(files={name: list(keys) for name, keys in split.filename_to_tensors.items()},
                     index_name=f"{weights_name}.index{variant_part}.json", index=index,
                     total_bytes=split.metadata["total_size"])
