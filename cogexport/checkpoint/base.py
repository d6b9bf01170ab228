"""What every checkpoint reader hands out: a lazy mapping of names to tensors, plus a description of the source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Iterator, TypeVar

from ..lazy import LazyTensor


@dataclass
class ReaderFacts:
    """What one reader knows of a checkpoint beyond the facts every reader has: a reader's own facts subclass this as
    a dataclass (DeepSpeed's ZeRO stage, DCP's writer, a safetensors header). Its fields are flattened into
    ``inspect``'s report, so each field's name is a key of ``inspect --json``. This class itself is the facts of a
    reader that has none of its own."""

    def header_metadata(self) -> dict[str, str]:
        """The key-value header the format stores beside the tensors (safetensors' ``__metadata__``, a GGUF file's
        fields), which family and LoRA recognition read; empty for a format that stores none."""
        return {}


@dataclass
class HeaderFacts(ReaderFacts):
    """The facts of a file format whose header holds key-value metadata beside the tensors."""

    metadata: dict[str, str] = field(default_factory=dict)

    def header_metadata(self) -> dict[str, str]:
        return self.metadata


Facts = TypeVar("Facts", bound=ReaderFacts)


@dataclass
class CheckpointInfo(Generic[Facts]):
    """What a checkpoint is, for ``inspect`` and for the decisions of later stages: the facts every reader has, and
    the reader's own in ``facts``."""

    format: str
    paths: list[str]
    facts: Facts = field(default_factory=ReaderFacts)  # the reader's own facts (ReaderFacts itself: none)
    tag: str | None = None
    tags: list[str] = field(default_factory=list)
    step: int | None = None
    weights_source: str = ""
    trainable: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)
    tied: dict[str, str] = field(default_factory=dict)
    buffers: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The checkpoint in one phrase, for lines such as "wrote OUT from <origin>": the reader's kind, the path, tag, step.
    origin: str = ""
    # Why this checkpoint was read when the path given held it among others or below it ("took the newest step
    # step-2 of run/checkpoint ..."); empty when the path was the checkpoint itself.
    picked: str = ""

    @property
    def header_metadata(self) -> dict[str, str]:
        """The format's key-value header, whichever reader read it (see ``ReaderFacts.header_metadata``)."""
        return self.facts.header_metadata()


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
