"""The readers: every input format cogexport reads, each declared once (``Reader``, reader.py) and listed here. The
claims on a folder, the opening of a file or of several paths, the line saying what a folder lacks, inspect's format
row and the phrase naming a checkpoint all come from this list; shared code asks it, never a format by name.

Readers come from three places, in this order: cogexport's own (``BUILT_IN``), those of installed packages that
declare the entry-point group ``cogexport.readers`` (each entry's value ``module:attribute`` names a ``Reader``; read
when a reader is first asked for, not when cogexport starts), and those added at run time with ``register_reader``.
Each is checked as it joins (registry_checks.py); a malformed one is refused in one line naming it.
See docs/adding-a-reader.md.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from ...errors import ExtensionError
from ..base import CheckpointInfo, HeaderFacts, ReaderFacts
from .dcp import DCP
from .deepspeed import DEEPSPEED, is_deepspeed_folder
from .facts import facts_of_report, flatten
from .fastvideo import FASTVIDEO
from .gguf import GGUF
from .hf_trainer import HF_TRAINER
from .hf_writer import HF_WRITER
from .imaginaire import IMAGINAIRE
from .megatron import MEGATRON
from .reader import Claim, FolderScan, OpenOptions, Reader
from .registry_checks import problem_with
from .safetensors import SAFETENSORS
from .torch_file import TORCH_FILE
from .universal import UNIVERSAL

# cogexport's own, in the order the line saying what a folder lacks lists them.
BUILT_IN: tuple[Reader, ...] = (DEEPSPEED, UNIVERSAL, HF_TRAINER, DCP, FASTVIDEO, MEGATRON, IMAGINAIRE, HF_WRITER,
                              SAFETENSORS, TORCH_FILE, GGUF)
ENTRY_POINT_GROUP = "cogexport.readers"

_added: list[Reader] = []


class ReaderDeclarationError(ExtensionError):
    """A reader's declaration or registration is malformed (a bug in the reader, maybe another package's, found when
    it joins the registry)."""

    kind = "readers"


def readers() -> tuple[Reader, ...]:
    """Every reader: cogexport's own, then installed packages', then those registered at run time."""
    return (*BUILT_IN, *_installed(), *_added)


def register_reader(reader: Reader) -> None:
    """Add ``reader`` (checked first: a malformed one is refused in one line)."""
    problem = problem_with(reader, readers())
    if problem:
        raise ReaderDeclarationError(f"register_reader: {problem}")
    _added.append(reader)


def remove_reader(name: str) -> None:
    """Take back a reader ``register_reader`` added."""
    _added[:] = [reader for reader in _added if reader.name != name]


@cache
def _installed() -> tuple[Reader, ...]:
    found: list[Reader] = []
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        package = getattr(entry, "dist", None)
        where = f"the reader {entry.name} = {entry.value} (entry point group {ENTRY_POINT_GROUP}" + \
            (f" of the package {package.name})" if package else ")")
        try:
            reader = entry.load()
        except Exception as error:  # anything its module raises: it is another package's code
            raise ReaderDeclarationError(f"{where} does not load: {type(error).__name__}: {error}; fix or uninstall the "
                                 "package") from None
        problem = problem_with(reader, (*BUILT_IN, *found))
        if problem:
            raise ReaderDeclarationError(f"{where}: {problem}; fix or uninstall the package")
        found.append(reader)
    return tuple(found)


# -- what shared code asks -----------------------------------------------------------------------------------------
def claiming_order() -> list[Reader]:
    """The readers in the order they claim a folder: whole-folder readers first, then the readers of loose files."""
    return sorted(readers(), key=lambda reader: not reader.whole_folders)  # a stable sort: registry order in each


def reader_of_format(format: str) -> Reader | None:
    return next((reader for reader in readers() if reader.format == format), None)


def phrase_of(format: str) -> str:
    """What a checkpoint of ``format`` is, in a phrase ("the DeepSpeed checkpoint"); the format's name if no reader
    declares it."""
    reader = reader_of_format(format)
    return reader.what if reader else format


def reader_of_file(path: Path) -> Reader | None:
    """The reader of a file given alone: the first that names it (but for one another reader naming it supersedes),
    else the one that reads a file of any name."""
    every = readers()
    naming = [reader for reader in every if reader.reads_file is not None and reader.reads_file(path)]
    superseded = {name for reader in naming for name in reader.supersedes}
    named = next((reader for reader in naming if reader.name not in superseded), None)
    return named or next((reader for reader in every if reader.any_file), None)


def reader_of_several(paths: list[Path]) -> Reader | None:
    """The reader of several paths given together: the reader of every one of them when they are all files one reader
    reads together (one model's parts), else the reader of a checkpoint spread over folders (one per node)."""
    named = [reader_of_file(path) if path.is_file() else None for path in paths]
    if named[0] is not None and named[0].open_several is not None and all(reader is named[0] for reader in named):
        return named[0]
    return next((reader for reader in readers() if reader.spans_folders), None)


def stands_for_folder(path: Path) -> bool:
    return any(path.name in reader.stands_for_folder for reader in readers())


def looks_for() -> str:
    """What every reader looks for, for the line that says a folder holds nothing any of them reads."""
    return "; ".join(reader.looks_for for reader in readers())


def info_dict(info: CheckpointInfo) -> dict[str, Any]:
    """``info`` as one flat dict (``inspect --json``, every result's ``source``): the facts every reader has, then
    every reader's own by name, this checkpoint's values and the other readers' defaults (facts.py)."""
    return flatten(info, readers())


def format_row(report: Mapping[str, Any]) -> str:
    """inspect's "format" row, by the report's reader from the facts the report holds."""
    reader = reader_of_format(report["format"])
    return reader.describe(facts_of_report(reader, report)) if reader else str(report["format"])


__all__ = ["BUILT_IN", "ENTRY_POINT_GROUP", "Claim", "FolderScan", "HeaderFacts", "OpenOptions", "Reader",
           "ReaderDeclarationError",
           "ReaderFacts", "claiming_order", "format_row", "info_dict", "is_deepspeed_folder", "looks_for", "phrase_of",
           "reader_of_file", "reader_of_format", "reader_of_several", "readers", "register_reader", "remove_reader",
           "stands_for_folder"]
