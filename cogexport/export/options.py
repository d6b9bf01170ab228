"""What the user asked for (``ExportOptions``), and its one check (``check_options``) before any file is opened.

The choices (--component, --lora-format, --to, tasks) are made from the families and formats cogexport has, so a
new family or writable LoRA format appears here, and in --help, without a line of code changed.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import CogExportError
from ..lora.formats import writable_format, writable_formats
from ..models.family import families
from ..write.diffusers_folders import check_variant_name
from ..write.shards import parse_size

DIRECTIONS = ("diffusers", "original")
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


def family_names() -> str:
    return ", ".join(family.name for family in families())


@dataclass
class ExportOptions:
    model_type: str | None = None  # the family's task (t2v, i2v, ...); checked against the checkpoint when given
    component: str | None = None  # default: pipeline when --base is a pipeline folder (not for --lora fuse)
    base: Path | None = None
    vae: Path | None = None  # a VAE checkpoint for the pipeline (default: the base's VAE)
    dtype: str = "bf16"
    keep_fp32: tuple[str, ...] = ()
    max_shard_size: str | int = "5GB"
    variant: str | None = None  # file-name variant, as save_pretrained(variant=...)
    tag: str | None = None
    ema: bool = False
    lora: str | None = None  # adapter or fuse; a LoRA run defaults to adapter
    lora_alpha: float | None = None
    lora_format: str | None = None  # the adapter file's layout (see lora/formats.py); default diffusers
    model_name: str | None = None  # a published variant name, for VAE-only exports or to check detection
    base_model: str | None = None  # the Hub id the model card names as base model
    overwrite: bool = False
    push_to_hub: str | None = None
    private: bool = False
    progress: bool | None = None
    command: str = ""
    workers: int | None = None  # threads loading tensors ahead of the writer (None: from the cores; 1: none)


def command_line() -> str:
    """The command as the user typed it, for the model card."""
    return "cogexport " + shlex.join(sys.argv[1:])


def check_options(options: ExportOptions, direction: str) -> None:
    """Every check the options alone allow, for an export to ``direction`` (diffusers or original): one line each,
    before any file is opened."""
    if direction not in DIRECTIONS:
        raise CogExportError(f"--to {direction!r} is not one of {', '.join(DIRECTIONS)}")
    parse_size(options.max_shard_size)
    if options.workers is not None and options.workers < 1:
        raise CogExportError(f"--workers {options.workers} must be at least 1")
    if options.variant is not None:
        check_variant_name(options.variant)
    if options.component is not None and options.component not in component_choices():
        raise CogExportError(f"--component {options.component!r} is not one of {', '.join(component_choices())}")
    if options.model_name and options.base is not None:
        raise CogExportError("--model-name and --base both say which model this is; give one of them")
    _check_lora_options(options)
    if direction == "original":
        _check_original(options)
    elif options.vae is not None and default_component(options) != PIPELINE:
        raise CogExportError("--vae goes into a pipeline (--component pipeline); to export a VAE alone, give it "
                             "as CHECKPOINT with --component vae")
    if default_component(options) == PIPELINE and direction == "diffusers" and not _is_pipeline_folder(options.base):
        raise CogExportError("--component pipeline needs --base DIR: a local Diffusers pipeline folder of the base "
                             "model, for the text encoder and tokenizer (nothing is downloaded)")


def _is_pipeline_folder(path: Path | None) -> bool:
    return path is not None and (Path(path) / "model_index.json").is_file()


def default_component(options: ExportOptions) -> str:
    """--component, else the whole pipeline when --base is a pipeline folder (the rest of it comes from there),
    else the transformer. --lora fuse uses --base for the base weights: it writes the transformer unless told."""
    if options.component:
        return options.component
    return PIPELINE if _is_pipeline_folder(options.base) and options.lora != "fuse" else "transformer"


def _check_lora_options(options: ExportOptions) -> None:
    if options.lora_format is not None:
        writable_format(options.lora_format)
    if options.lora is None:
        return
    if options.lora not in LORA_MODES:
        raise CogExportError(f"--lora {options.lora!r} is not one of {', '.join(LORA_MODES)}")
    if options.lora == "adapter" and options.component is not None:
        raise CogExportError(f"--lora adapter writes an adapter file, not a {options.component}; use --lora fuse "
                             f"--component {options.component} to merge the adapter into one")
    if options.lora == "fuse" and options.lora_format is not None:
        raise CogExportError("--lora-format names the layout of an adapter file; --lora fuse writes a full model")


def _check_original(options: ExportOptions) -> None:
    if options.lora_format:
        raise CogExportError("--lora-format names an adapter file's layout; --to original writes a full transformer")
    if options.lora or options.vae or options.push_to_hub:
        raise CogExportError("--to original writes a full model; it takes no --lora, --vae or --push-to-hub")
    if default_component(options) == PIPELINE:
        models = "|".join(component_choices()[:-1])
        raise CogExportError(f"--to original writes a transformer or a VAE (one model: --component {models}); "
                             f"--component {PIPELINE} has no original layout")


def lora_mode(options: ExportOptions, marker: str | None, where: str) -> str | None:
    """What to do with the input: "adapter" or "fuse" for a LoRA run (``marker``: a key that shows it is one), None
    for full weights. The checks that need to know what the input is."""
    if options.lora is not None and marker is None:
        raise CogExportError(f"{where} holds no LoRA adapter (no lora_A, lora_down or matrix_A weights); export it "
                             "without --lora")
    if marker is None and options.lora_format is not None:
        raise CogExportError(f"{where} holds no LoRA adapter (no lora_A, lora_down or matrix_A weights); "
                             "--lora-format is for LoRA checkpoints")
    if marker is not None and options.lora is None and options.component is not None:
        raise CogExportError(f"{where} is a LoRA checkpoint ({marker}); export the adapter with --lora adapter, or "
                             "merge it into a full model with --lora fuse (giving --base when the checkpoint does not "
                             "hold the base weights)")
    if marker is None:
        return None
    return options.lora or "adapter"
