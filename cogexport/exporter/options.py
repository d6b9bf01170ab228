"""What the user asked for (``ExportOptions``), and its one check (``check_options``) before any file is opened.

The choices (--component, --lora-format, --to, --quant, tasks) are made from the families and the output and LoRA
formats cogexport has (exporter/output_formats.py), so a new family or format appears here, and in --help, without a
line of code changed; so are the checks of the options only some formats take.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import CogExportError
from ..lora.formats import writable_format, writable_formats
from ..models.base_folder import MODULAR_INDEX
from ..models.family import families
from ..write.diffusers_folders import check_variant_name
from ..write.shards import parse_size
from .output_formats import FORMAT_OPTIONS, OutputFormat, chosen_format, output_format, output_formats, written_within

MODEL_DTYPE = "bf16"  # what a model's floating tensors are written in unless --dtype says
DTYPES = ("bf16", "fp16", "fp32")  # --dtype of floating tensors (a format may take another spelling: fp8)
LORA_MODES = ("adapter", "fuse")
PIPELINE = "pipeline"
# pipeline components that are the transformer's own (a second expert), never asked for by name
_EXPERT_COMPONENTS = ("transformer_2",)


def component_choices() -> tuple[str, ...]:
    """What --component takes: every model component some family exports, and the whole pipeline."""
    names = dict.fromkeys(name for family in families() for name in family.components)
    return (*names, PIPELINE)


def task_help() -> str:
    """Every family's tasks, for --help (``Wan t2v|i2v|...; ...``)."""
    return "; ".join(f"{family.name} {'|'.join(family.tasks)}" for family in families())


def lora_format_help() -> str:
    """Every writable LoRA format and what it writes, for --help."""
    return ", ".join(f"{name} ({writable_format(name).title})" for name in writable_formats())


def quant_help() -> str:
    """Every quantizing format's --quant choices, for --help."""
    return "; ".join(f"--to {fmt.name}: {', '.join(fmt.quantizations)}" for fmt in output_formats() if fmt.quantizations)


def to_help() -> str:
    """What each --to value writes, for --help."""
    return "; ".join(f"{fmt.name}: {fmt.title}" for fmt in output_formats() if fmt.selectable)


def family_names() -> str:
    return ", ".join(family.name for family in families())


@dataclass
class ExportOptions:
    model_type: str | None = None  # the family's task (t2v, i2v, ...); checked against the checkpoint when given
    component: str | None = None  # default: pipeline when --base is a pipeline folder (not for --lora fuse)
    base: Path | None = None
    # checkpoints of the pipeline's other models (default: the base's): a VAE, or a release's file of several (LTX-2.5's
    # audio VAE file holds the audio VAE and the vocoder); one path or several
    vae: tuple[Path, ...] = ()
    dtype: str | None = None  # None: a model's default (MODEL_DTYPE), an adapter's dtype as trained
    keep_fp32: tuple[str, ...] = ()
    max_shard_size: str | int = "5GB"
    variant: str | None = None  # file-name variant, as save_pretrained(variant=...)
    tag: str | None = None
    ema: bool = False
    role: str | None = None  # the set of weights of a checkpoint keeping several (a FastVideo role, an entry)
    lora: str | None = None  # adapter or fuse; a LoRA run defaults to adapter
    lora_alpha: float | None = None
    lora_format: str | None = None  # the adapter file's layout (see lora/formats.py); default diffusers
    lora_expert: str | None = None  # which expert of a base with several one adapter was trained for
    model_name: str | None = None  # a published variant name, for VAE-only exports or to check detection
    base_model: str | None = None  # the Hub id the model card names as base model
    overwrite: bool = False
    push_to_hub: str | None = None
    private: bool = False
    progress: bool | None = None
    command: str = ""
    quant: str | None = None  # a quantized format's quantization (--to gguf: Q4_K_M, ...; --to comfyui: fp8, ...)
    fp8_layout: str | None = None  # --to comfyui: how the scales are marked (default comfy_quant: ComfyUI's current)
    workers: int | None = None  # threads loading tensors ahead of the writer (None: from the cores; 1: none)
    allow_nonfinite: bool = False  # write tensors holding NaN or infinite values (named in a note) rather than refuse

    def __post_init__(self) -> None:
        # one path as the Python API's callers give it (vae=path), or none, is the tuple the CLI's repeated --vae makes
        if self.vae is None or isinstance(self.vae, (str, Path)):
            self.vae = () if self.vae is None else (Path(self.vae),)
        self.vae = tuple(Path(path) for path in self.vae)


def command_line() -> str:
    """The command as the user typed it, for the model card."""
    return "cogexport " + shlex.join(sys.argv[1:])


def check_options(options: ExportOptions, direction: str) -> None:
    """Every check the options alone allow, for an export to ``direction`` (a --to value): one line each, before any
    file is opened."""
    checked_format(options, direction)


def checked_format(options: ExportOptions, to: str) -> tuple[OutputFormat, ExportOptions]:
    """The format ``to`` names (or that the options spell with it), and the options as it reads them, checked: the
    checks every export shares, then what the format's declaration says it takes, then its own."""
    fmt, options = chosen_format(to, options)
    if options.dtype is not None and options.dtype not in DTYPES:
        raise CogExportError(f"--dtype {options.dtype!r} is not one of {', '.join(DTYPES)}")
    parse_size(options.max_shard_size)
    if options.workers is not None and options.workers < 1:
        raise CogExportError(f"--workers {options.workers} must be at least 1")
    if options.variant is not None:
        check_variant_name(options.variant)
    if options.component is not None and options.component not in component_choices():
        raise CogExportError(f"--component {options.component!r} is not one of {', '.join(component_choices())}")
    if options.model_name and options.base is not None:
        raise CogExportError("--model-name and --base both say which model this is; give one of them")
    _check_taken(options, fmt)
    _check_lora_options(options, fmt)
    _check_component(options, fmt)
    _check_quantization(options, fmt)
    if fmt.check is not None:
        fmt.check(options)
    return fmt, options


def is_pipeline_folder(path: Path | None) -> bool:
    """A pipeline folder: a classic pipeline's model_index.json, or a modular pipeline's modular_model_index.json."""
    return path is not None and any((Path(path) / index).is_file() for index in ("model_index.json", MODULAR_INDEX))


def default_component(options: ExportOptions, direction: str = "diffusers") -> str:
    """--component, else (for a format that writes pipelines) the whole pipeline when --base is a pipeline folder (the
    rest of it comes from there), else the transformer. --lora fuse uses --base for the base weights: it writes the
    transformer unless told; so do the formats that write one model."""
    if options.component:
        return options.component
    pipeline = output_format(direction).writes == PIPELINE and is_pipeline_folder(options.base) \
        and options.lora != "fuse"
    return PIPELINE if pipeline else "transformer"


def _check_taken(options: ExportOptions, fmt: OutputFormat) -> None:
    """An option only some formats take is refused by the others, naming those that take it."""
    taken = set().union(*(each.takes for each in written_within(fmt.name)))
    for key, option in FORMAT_OPTIONS.items():
        if getattr(options, key) in (None, False, ()) or key in taken:
            continue
        owners = dict.fromkeys(each.within or each.name for each in output_formats() if key in each.takes)
        give = " or ".join(f"--to {name}" for name in owners)
        raise CogExportError(f"{option.flag} is {option.what}; --to {fmt.name} writes {fmt.title}"
                             + (f": give {give}" if give else ""))


def _check_lora_options(options: ExportOptions, fmt: OutputFormat) -> None:
    if options.lora_format is not None:
        writable_format(options.lora_format)
    if options.lora is None:
        return
    if options.lora not in LORA_MODES:
        raise CogExportError(f"--lora {options.lora!r} is not one of {', '.join(LORA_MODES)}")
    if options.lora == "adapter" and not any(each.writes == "adapter" for each in written_within(fmt.name)):
        raise CogExportError(f"--to {fmt.name} writes a full model (a LoRA run is fused into it); it takes no --lora "
                             "adapter")
    if options.lora == "adapter" and options.component is not None:
        raise CogExportError(f"--lora adapter writes an adapter file, not a {options.component}; use --lora fuse "
                             f"--component {options.component} to merge the adapter into one")
    if options.lora == "fuse" and options.lora_format is not None:
        raise CogExportError("--lora-format names the layout of an adapter file; --lora fuse writes a full model")


def _check_component(options: ExportOptions, fmt: OutputFormat) -> None:
    """What --component may ask of a format: a pipeline only of one that writes pipelines, and only the transformer
    of one that writes the transformer."""
    component = default_component(options, fmt.name)
    if fmt.writes in ("pipeline", "adapter"):
        return
    if component == PIPELINE:
        models = "|".join(component_choices()[:-1])
        raise CogExportError(f"--to {fmt.name} writes a transformer or a VAE (one model: --component {models}); a "
                             f"pipeline is not written as {fmt.title}")
    if fmt.writes == "transformer" and component != "transformer":
        raise CogExportError(f"--to {fmt.name} writes the transformer ({fmt.title}); --component {component} is "
                             "not written in it")


def _check_quantization(options: ExportOptions, fmt: OutputFormat) -> None:
    """--quant is refused by formats that take none (_check_taken), needed by those that do, and one of theirs."""
    if not fmt.quantizations:
        return
    if options.quant is None:
        raise CogExportError(f"--to {fmt.name} needs --quant (one of {', '.join(fmt.quantizations)})")
    if options.quant.upper() not in {name.upper() for name in fmt.quantizations}:
        raise CogExportError(f"--quant {options.quant!r} is not one of {', '.join(fmt.quantizations)}")


def lora_mode(options: ExportOptions, marker: str | None, where: str) -> str | None:
    """What to do with the input: "adapter" or "fuse" for a LoRA run (``marker``: a key that shows it is one), None
    for full weights. The checks that need to know what the input is."""
    if options.lora is not None and marker is None:
        raise CogExportError(f"{where} holds no LoRA adapter (no lora_A, lora_down or matrix_A weights); export it "
                             "without --lora")
    if marker is None and (options.lora_format is not None or options.lora_expert is not None):
        given = "--lora-format" if options.lora_format is not None else "--lora-expert"
        raise CogExportError(f"{where} holds no LoRA adapter (no lora_A, lora_down or matrix_A weights); "
                             f"{given} is for LoRA checkpoints")
    if marker is not None and options.lora is None and options.component is not None:
        raise CogExportError(f"{where} is a LoRA checkpoint ({marker}); export the adapter with --lora adapter, or "
                             "merge it into a full model with --lora fuse (giving --base when the checkpoint does not "
                             "hold the base weights)")
    if marker is None:
        return None
    return options.lora or "adapter"
