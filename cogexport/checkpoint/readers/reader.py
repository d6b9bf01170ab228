"""What a reader declares: one input format's claims on a folder, how it opens a file or several paths, how it names
what it opened, and the facts it reports. The registry (``readers/__init__.py``) lists the readers; the dispatcher
asks them in this order: claims (from names alone) -> the choice of one claim (dispatch.py) -> open -> facts.
See docs/adding-a-reader.md."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..base import LazyCheckpoint, ReaderFacts


@dataclass(frozen=True)
class OpenOptions:
    tag: str | None = None
    strict: bool = True
    entry: str | None = None


@dataclass(frozen=True, eq=False)  # each reader is itself
class Reader:
    """One input format, declared once. Only the first six fields are required; the rest say what the reader does
    beyond claiming folders (docs/adding-a-reader.md has the table, checked against this class)."""

    name: str  # how messages name the reader: "DeepSpeed", "safetensors"
    format: str  # ``info.format`` of what it opens, the "format" of ``inspect --json``: "deepspeed"
    what: str  # what it opened, in a phrase for messages, origins and model cards: "the DeepSpeed checkpoint"
    looks_for: str  # what it claims, for the line saying a folder holds nothing cogexport reads
    claims: Callable[[FolderScan], list[Claim]]  # its claims on one folder, from names alone (never tensor data)
    describe: Callable[[Any], str]  # inspect's "format" row, from its facts
    facts: type[ReaderFacts] = ReaderFacts  # its own facts (a dataclass), flattened into inspect's report
    whole_folders: bool = False  # claims folders whole: asked before the readers of loose files, which skip its covers
    supersedes: tuple[str, ...] = ()  # readers giving way to it on a folder both claim whole, a file both name
    not_weights: tuple[re.Pattern[str], ...] = ()  # files its saves keep that are never weights on their own
    reads_file: Callable[[Path], bool] | None = None  # whether a file given alone is its (by name or first bytes)
    open_file: Callable[[Path, OpenOptions], LazyCheckpoint] | None = None  # opens a file given alone
    any_file: bool = False  # reads a file given alone that no reader names (torch.save files bear any name)
    stands_for_folder: frozenset[str] = frozenset()  # file names that stand for their folder (DCP's .metadata)
    open_several: Callable[[list[Path], OpenOptions], LazyCheckpoint] | None = None  # several paths as one checkpoint
    spans_folders: bool = False  # several paths not all one reader's files are its (a save in a folder per node)
    own_tags: bool = False  # its checkpoints hold several tags: --tag is its to resolve, and it lists the tags
    takes_entry: bool = False  # its files may keep other state dicts beside the model's (an EMA): --ema applies
    may_be_a_copy: bool = False  # its loose weights inside a checkpoint's folder may be that checkpoint's copy
    # what reading every byte checks, and what it cannot see, for inspect's "data" row: "every record's CRC-32"
    data_check: str = "what the reader checks as it reads (it does not say)"


@dataclass(eq=False)  # each claim is itself (hashed by identity)
class Claim:
    """One reader's claim: ``path`` (a folder or a file) holds one checkpoint it can open."""

    reader: Reader
    path: Path
    opener: Callable[[OpenOptions], LazyCheckpoint]
    what: str = ""  # how a listing names it, when not as its reader does: "the consolidated ... save"
    whole_folder: bool = False  # the folder is this checkpoint: nothing below it is another candidate
    covers: set[Path] = field(default_factory=set)  # the folder's entries that belong to it
    companion: bool = False  # read only through its owner (DeepSpeed's adapter copy), never a candidate itself
    detail: str = ""  # what a listing adds in brackets
    notes: list[str] = field(default_factory=list)  # what the dispatcher found out about it, for info.notes
    also_named: tuple[str, ...] = ()  # its own tags, which --tag may name it by from a folder above (global_stepN)

    def __post_init__(self) -> None:
        self.what = self.what or self.reader.what

    def open(self, options: OpenOptions) -> LazyCheckpoint:
        return self.opener(options)

    def main_file(self) -> Path:
        """The file that stands for the claim: an index, else its weights file, else the claimed path itself."""
        files = sorted(self.covers, key=lambda p: (p.suffix != ".json", p.name))
        return next((p for p in files if p.suffix in (".json", ".safetensors")), self.path)

    def label(self, root: Path) -> str:
        """The claim's path as the user would type it from ``root`` (the file when it is root's own weights)."""
        path = self.main_file() if self.path == root else self.path
        return str(path.relative_to(root)) if path != root and path.is_relative_to(root) else str(path.name)


@dataclass
class FolderScan:
    """One folder as the readers claim it: its entries (listed once), the claims made on it by the readers asked
    before (whole-folder readers first, then the readers of loose files, each in registry order), and whether a file
    name is training state or a piece of a save by any reader's word (``Reader.not_weights``)."""

    folder: Path
    entries: list[Path]
    earlier: list[Claim]
    not_weights: tuple[re.Pattern[str], ...]  # every reader's

    def is_not_weights(self, name: str) -> bool:
        return any(pattern.match(name) for pattern in self.not_weights)

    def covered(self) -> set[Path]:
        return {path for claim in self.earlier for path in claim.covers}

    def files(self, *suffixes: str) -> list[Path]:
        """The folder's files with one of ``suffixes``, in name order."""
        return [path for path in self.entries if path.suffix in suffixes and path.is_file()]
