"""What every checkpoint reader hands out: a lazy mapping of names to tensors, plus a description of the source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..lazy import LazyTensor


@dataclass
class CheckpointInfo:
    """What a checkpoint is, for ``inspect`` and for the decisions of later stages."""

    format: str
    paths: list[str]
    tag: str | None = None
    tags: list[str] = field(default_factory=list)
    step: int | None = None
    stage: int | None = None
    training_dtype: str | None = None
    world_size: int | None = None
    weights_source: str = ""
    ds_version: str | None = None
    trainable: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)
    tied: dict[str, str] = field(default_factory=dict)
    buffers: list[str] = field(default_factory=list)
    client_state: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)  # e.g. a safetensors file's __metadata__
    writer: str | None = None  # the program that saved it, when the format tells (DCP: accelerate, torchtitan, ...)
    contents: list[str] = field(default_factory=list)  # what the save holds beside the model (optimizer, ...)
    # The checkpoint in one phrase, for lines such as "wrote OUT from <origin>": the reader's kind, the path, tag, step.
    origin: str = ""
    # Why this checkpoint was read when the path given held it among others or below it ("took the newest step
    # step-2 of run/checkpoint ..."); empty when the path was the checkpoint itself.
    picked: str = ""


class LazyCheckpoint(Mapping[str, LazyTensor]):
    """Base of the readers: a mapping filled by the subclass, and resources released by ``close``."""

    info: CheckpointInfo

    def __init__(self) -> None:
        self._tensors: dict[str, LazyTensor] = {}

    def __getitem__(self, name: str) -> LazyTensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def bytes_read(self) -> dict[str, int]:
        """Tensor bytes read so far from each file (for checking that only what is needed gets read)."""
        return {}

    def own_folders(self) -> list[Path]:
        """Folders that belong to the checkpoint alone (nothing may be written into them)."""
        return []

    def check_stored_data(self) -> list[str]:
        """Read every byte of the checkpoint's files and check what can be checked (torch.save records against
        their CRC-32s); one message per problem found. For ``inspect``; the readers check what they read anyway."""
        return []

    def close(self) -> None:
        pass

    def __enter__(self) -> "LazyCheckpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
