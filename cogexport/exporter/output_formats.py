"""The output formats an export writes, as a registry: one ``OutputFormat`` per format, declared in the module of
the job that writes it (the Diffusers folder, the original layout, GGUF, ComfyUI's quantized safetensors, the LoRA
adapter). Shared code reads the registry and never names a format: ``--to``'s choices and help, which options a
format takes, which job runs, how ``verify`` finds and checks a format's files and how ``inspect`` reads them back.

A format of another package is declared in a module of its own and registered through the entry-point group
``cogexport.output_formats`` (its value names the object, ``mypkg.my_format:FORMAT``) or at run time with
``register_output_format``; it is checked as the built-in ones are (docs/adding-an-output-format.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..errors import CogExportError, ExtensionError

if TYPE_CHECKING:
    from ..checkpoint import LazyCheckpoint
    from ..verify import VerifyReport, VerifyRequest
    from .options import ExportOptions
    from .result import ExportResult

# The modules declaring cogexport's own formats (each a ``FORMAT``), in --help order; the LoRA adapter, which no --to
# names, last: ``verify`` asks the formats in this order, and an adapter folder is any folder of safetensors weights.
BUILT_IN = ("cogexport.exporter.to_diffusers", "cogexport.exporter.to_original", "cogexport.exporter.to_gguf",
            "cogexport.exporter.to_comfyui", "cogexport.exporter.adapters")
ENTRY_POINT_GROUP = "cogexport.output_formats"
# What a format writes: a pipeline folder or any one model, one model of the family, the transformer, an adapter.
WRITES = ("pipeline", "model", "transformer", "adapter")


@dataclass(frozen=True)
class FormatOption:
    """An option only some formats take: its flag and what it is, for the line that refuses it elsewhere."""

    flag: str
    what: str


# The options of ExportOptions only some formats take (every format takes the others); a format's ``takes`` names
# those it takes. Each is set when it differs from its default (None or False).
FORMAT_OPTIONS = {
    "vae": FormatOption("--vae", "the VAE checkpoint of a pipeline folder"),
    "variant": FormatOption("--variant", "the file-name variant of a Diffusers folder's weights"),
    "push_to_hub": FormatOption("--push-to-hub", "the Hub repository a finished folder is uploaded to"),
    "private": FormatOption("--private", "how --push-to-hub creates the repository"),
    "quant": FormatOption("--quant", "the quantization of a quantized file"),
    "fp8_layout": FormatOption("--fp8-layout", "how a ComfyUI quantized file marks its quantized layers"),
    "lora_format": FormatOption("--lora-format", "the layout of a LoRA adapter file"),
}


@dataclass(frozen=True)
class ReadBack:
    """What ``inspect`` says of a file of the format: notes, and the weights it stands for (dequantized), in which
    the model is recognised."""

    notes: list[str]
    weights: Mapping[str, Any]


@dataclass(frozen=True, eq=False)  # one object per format: compared and hashed by identity
class OutputFormat:
    """One output format: what it writes, the options it takes and their checks, its job, and its hooks for
    ``verify`` and ``inspect``. Only ``name``, ``title``, ``writes`` and ``export`` (or ``within``) are needed."""

    name: str  # as --to, messages and reports name it
    title: str  # what it writes, for --help and messages ("GGUF file of the transformer")
    writes: str  # one of WRITES: what --component may ask of it
    # the job: export(checkpoint, output, options) -> ExportResult; None for a format another format's job writes
    export: Callable[[Any, Path, "ExportOptions"], "ExportResult"] | None = None
    within: str = ""  # the --to whose job writes it, for a format no --to names (the adapter, under diffusers)
    takes: frozenset[str] = frozenset()  # the keys of FORMAT_OPTIONS it takes
    quantizations: tuple[str, ...] = ()  # --quant's choices (the format then needs --quant)
    check: Callable[["ExportOptions"], None] | None = None  # its own checks, before any file is opened
    # another spelling of this format: given --to's value and the options, the options meant (None: not this
    # spelling); --to original --dtype fp8 is ComfyUI's scaled fp8. It may refuse a misspelling in one line.
    spelled_as: Callable[[str, "ExportOptions"], "ExportOptions | None"] | None = None
    # verify: the reports of an output folder holding this format's files, or None when it holds none
    verify: Callable[[Path, "VerifyRequest"], "list[VerifyReport] | None"] | None = None
    # inspect: what an opened file of this format stands for, or None when it is not one
    reads_back: Callable[["LazyCheckpoint"], ReadBack | None] | None = None
    # inspect: the report of a folder of this format (None when it is not one), and its text
    inspects_folder: Callable[[Path, bool], dict | None] | None = None
    renders_folder: Callable[[dict], str] | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)  # for the guide: anything a reader should know

    def __post_init__(self) -> None:
        _check_declaration(self)

    @property
    def selectable(self) -> bool:
        """Whether --to names it (a format another format's job writes is reached through that --to)."""
        return self.export is not None


def _check_declaration(fmt: OutputFormat) -> None:
    def need(condition: bool, what: str) -> None:
        if not condition:
            raise FormatDeclarationError(f"output format {fmt.name!r}: {what}")

    need(bool(fmt.name) and fmt.name == fmt.name.strip() and " " not in fmt.name, "needs a name without spaces")
    need(fmt.writes in WRITES, f"writes must be one of {', '.join(WRITES)}")
    need((fmt.export is None) != (not fmt.within), "gives either its job (export) or the --to it is written within")
    unknown = set(fmt.takes) - set(FORMAT_OPTIONS)
    need(not unknown, f"takes unknown option(s) {', '.join(sorted(unknown))} (one of {', '.join(FORMAT_OPTIONS)})")
    need(bool(fmt.quantizations) == ("quant" in fmt.takes), "takes quant exactly when it has quantizations")
    need((fmt.inspects_folder is None) == (fmt.renders_folder is None), "inspects_folder and renders_folder go "
         "together")


class FormatDeclarationError(ExtensionError):
    """An output format's declaration lacks what the registry needs (a bug in the format, found when it loads)."""

    kind = "output formats"


_REGISTERED: list[OutputFormat] = []


def register_output_format(fmt: OutputFormat) -> None:
    """Add a format at run time (checked as the built-in and installed ones are)."""
    if any(known.name == fmt.name for known in output_formats()):
        raise FormatDeclarationError(f"output format {fmt.name!r} exists already")
    _REGISTERED.append(fmt)
    _check_registry(output_formats())


def unregister_output_format(name: str) -> None:
    """Take back a format ``register_output_format`` added."""
    _REGISTERED[:] = [fmt for fmt in _REGISTERED if fmt.name != name]


def output_formats() -> tuple[OutputFormat, ...]:
    """Every format: cogexport's own, then those of installed packages, then those registered at run time."""
    return (*_installed_formats(), *_REGISTERED)


@cache
def _installed_formats() -> tuple[OutputFormat, ...]:
    found = [_format_of(importlib.import_module(module), module) for module in BUILT_IN]
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = entry.load()
        except Exception as error:  # another package's bug: said in one line, as a malformed declaration is
            raise FormatDeclarationError(f"{ENTRY_POINT_GROUP} entry point {entry.name} = {entry.value} cannot be "
                                         f"loaded: {type(error).__name__}: {error}") from None
        found.append(_format_of(value, entry.value))
    _check_registry(found)
    return tuple(found)


def _format_of(value: Any, where: str) -> OutputFormat:
    fmt = getattr(value, "FORMAT", value)  # a module declares its format as FORMAT
    if not isinstance(fmt, OutputFormat):
        raise FormatDeclarationError(f"{where} is no OutputFormat (cogexport.exporter.output_formats)")
    return fmt


def _check_registry(formats) -> None:
    names = [fmt.name for fmt in formats]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise FormatDeclarationError(f"two output formats are named {twice[0]!r}")
    for fmt in formats:
        if fmt.within and fmt.within not in {other.name for other in formats if other.selectable}:
            raise FormatDeclarationError(f"output format {fmt.name!r} is written within --to {fmt.within!r}, "
                                         "which no format is")


def output_format(name: str) -> OutputFormat:
    for fmt in output_formats():
        if fmt.name == name:
            return fmt
    raise CogExportError(f"--to {name!r} is not one of {', '.join(to_choices())}")


def to_choices() -> tuple[str, ...]:
    """What --to takes, in --help order."""
    return tuple(fmt.name for fmt in output_formats() if fmt.selectable)


def written_within(to: str) -> tuple[OutputFormat, ...]:
    """The format --to names and those its job writes too (--to diffusers: a model, or a LoRA run's adapter)."""
    return tuple(fmt for fmt in output_formats() if to in (fmt.name, fmt.within))


def chosen_format(to: str, options: "ExportOptions") -> tuple[OutputFormat, "ExportOptions"]:
    """The format --to names, or the one the options spell with it (``--to original --dtype fp8``), and the options
    as that format reads them."""
    for fmt in output_formats():
        meant = fmt.spelled_as(to, options) if fmt.spelled_as else None
        if meant is not None:
            return fmt, meant
    return output_format(to), options
