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

DIRECTIONS = ("diffusers", "original", "gguf")
WAY_BACK = ("original", "gguf")  # the directions that write a family's original names
FP8_DTYPES = ("fp8", "fp8_e5m2")  # --dtype of a scaled-fp8 original file (e4m3fn, e5m2)
FP8_LAYOUTS = ("comfy_quant", "metadata", "legacy")
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
    from ..quantize import PRESETS

    return ", ".join(PRESETS)


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
    lora_expert: str | None = None  # which expert of a base with several one adapter was trained for
    model_name: str | None = None  # a published variant name, for VAE-only exports or to check detection
    base_model: str | None = None  # the Hub id the model card names as base model
    overwrite: bool = False
    push_to_hub: str | None = None
    private: bool = False
    progress: bool | None = None
    command: str = ""
    quant: str | None = None  # --to gguf: the quantization (a preset of cogexport/quantize/policy.py)
    fp8_layout: str = "comfy_quant"  # --dtype fp8: how the scales are marked (ComfyUI's current or legacy layout)
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
    _check_quantized(options, direction)
    if direction in WAY_BACK:
        _check_way_back(options, direction)
    elif options.vae is not None and default_component(options) != PIPELINE:
        raise CogExportError("--vae goes into a pipeline (--component pipeline); to export a VAE alone, give it "
                             "as CHECKPOINT with --component vae")
    if default_component(options) == PIPELINE and direction == "diffusers" and not _is_pipeline_folder(options.base):
        raise CogExportError("--component pipeline needs --base DIR: a local Diffusers pipeline folder of the base "
                             "model, for the text encoder and tokenizer (nothing is downloaded)")


def _is_pipeline_folder(path: Path | None) -> bool:
    return path is not None and (Path(path) / "model_index.json").is_file()


def default_component(options: ExportOptions, direction: str = "diffusers") -> str:
    """--component, else (to Diffusers) the whole pipeline when --base is a pipeline folder (the rest of it comes
    from there), else the transformer. --lora fuse uses --base for the base weights: it writes the transformer unless
    told; so does the way back, which writes one model."""
    if options.component:
        return options.component
    pipeline = direction == "diffusers" and _is_pipeline_folder(options.base) and options.lora != "fuse"
    return PIPELINE if pipeline else "transformer"


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


def _check_way_back(options: ExportOptions, direction: str) -> None:
    if options.lora_format:
        raise CogExportError(f"--lora-format names an adapter file's layout; --to {direction} writes a full "
                             "transformer")
    if options.lora == "adapter" or options.vae or options.push_to_hub:
        raise CogExportError(f"--to {direction} writes a full model (a LoRA run is fused into it); it takes no "
                             "--lora adapter, --vae or --push-to-hub")
    if default_component(options, direction) == PIPELINE:
        models = "|".join(component_choices()[:-1])
        raise CogExportError(f"--to {direction} writes a transformer or a VAE (one model: --component {models}); "
                             f"--component {PIPELINE} has no original layout")
    if direction == "gguf" and default_component(options, direction) != "transformer":
        raise CogExportError(f"--to gguf writes the transformer (ComfyUI-GGUF and Diffusers load GGUF transformers); "
                             f"--component {options.component} has no GGUF layout")


def _check_quantized(options: ExportOptions, direction: str) -> None:
    """--quant goes with --to gguf (which needs it), --dtype fp8 with --to original."""
    from ..quantize import PRESETS

    if direction == "gguf" and options.quant is None:
        raise CogExportError(f"--to gguf needs --quant (one of {', '.join(PRESETS)})")
    if options.quant is not None and direction != "gguf":
        raise CogExportError("--quant is the quantization of a GGUF file; give --to gguf")
    if options.quant is not None and options.quant.upper() not in PRESETS:
        raise CogExportError(f"--quant {options.quant!r} is not one of {', '.join(PRESETS)}")
    if options.dtype in FP8_DTYPES and direction != "original":
        raise CogExportError(f"--dtype {options.dtype} writes ComfyUI's scaled-fp8 file of the original layout; give "
                             "--to original")
    if options.fp8_layout not in FP8_LAYOUTS:
        raise CogExportError(f"--fp8-layout {options.fp8_layout!r} is not one of {', '.join(FP8_LAYOUTS)}")


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
