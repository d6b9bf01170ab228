"""The README.md model cards of exported folders, as text made before anything is written: a fine-tuned model or
pipeline, and a LoRA adapter (whose usage lines its format knows)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..checkpoint import LazyCheckpoint
from ..checkpoint.readers import phrase_of
from ..lora import LoraAdapter
from ..lora.formats import LoraFormat
from ..models.family import ModelFamily, Variant
from ..write.model_card import CardFacts, model_card
from .options import ExportOptions
from .parts import ModelExport


def source_line(source: LazyCheckpoint) -> str:
    """What was read, for the card: the checkpoint in one phrase (its kind, path, tag and step), where the weights
    came from."""
    info = source.info
    if info.origin:
        return f"{info.origin} ({info.weights_source})"
    where = f"{phrase_of(info.format)} {', '.join(Path(p).name for p in info.paths)}"
    if info.tag:
        where += f", tag {info.tag}"
    if info.step is not None:
        where += f", step {info.step}"
    return f"{where} ({info.weights_source})"


def _command(options: ExportOptions) -> str:
    return options.command or "cogexport (Python API)"


def model_folder_card(parts: list[ModelExport], variant: Variant, options: ExportOptions, source: LazyCheckpoint,
                      adapter: LoraAdapter | None) -> str:
    """The card of a fine-tuned pipeline (or model) folder: how it was made and how to load it."""
    transformer = next((part for part in parts if part.component == "transformer"), parts[0])
    family = transformer.family
    task = family.task(variant.task)
    details = [f"Key map: {part.table.name} ({part.table.description})" for part in parts]
    if adapter is not None:
        details.append(f"LoRA fused into the weights: {adapter.describe()}")
    variant_argument = f"variant=\"{options.variant}\", " if options.variant else ""
    return model_card(CardFacts(
        title=f"{transformer.label} fine-tune",
        base_model=options.base_model or (variant.hub_id if transformer.published else None),
        relation="finetune",
        pipeline_tag=task.pipeline_tag,
        pipeline_class=task.pipeline,
        tags=family.tags,
        command=_command(options),
        source=source_line(source),
        precision="; ".join(f"{part.component}: {part.policy.describe()}" for part in parts),
        details=details,
        usage=(f"import torch\nfrom diffusers import {task.pipeline}\n\n"
               f"pipe = {task.pipeline}.from_pretrained(\"{options.push_to_hub or 'path/to/this/folder'}\", "
               f"{variant_argument}torch_dtype=torch.bfloat16)"),
    ))


@dataclass
class AdapterCardFacts:
    family: ModelFamily  # of the model it goes on (a variant's, for a Wan LoRA on a Wan VACE --base)
    label: str  # the model the adapter is for, as the user should read it
    variant: Variant | None  # its published variant, when known
    base_model: str | None
    adapters: Mapping[str, LoraAdapter]  # expert subfolder ("" for one model) -> its adapter
    files: Mapping[str, str]  # pipeline component -> the written file, relative to the folder


def adapter_card(facts: AdapterCardFacts, lora_format: LoraFormat, options: ExportOptions,
                 source: LazyCheckpoint) -> str:
    family, first = facts.family, next(iter(facts.adapters.values()))
    task = family.task(facts.variant.task if facts.variant else next(iter(family.tasks)))
    folder = options.push_to_hub or "path/to/this/folder"
    usage = lora_format.usage_lines(task.pipeline, facts.base_model,
                                    {component: f"{folder}/{path}" for component, path in facts.files.items()})
    return model_card(CardFacts(
        title=f"{facts.label} LoRA",
        base_model=facts.base_model,
        relation="adapter",
        pipeline_tag=task.pipeline_tag,
        pipeline_class=task.pipeline,
        tags=family.tags,
        command=_command(options),
        source=source_line(source),
        precision=f"{options.dtype} ({', '.join(first.family.lora_keep_fp32)} kept in fp32)",
        details=[*(f"Adapter{' (' + sub + ')' if sub else ''}: {each.describe()}" for sub, each in facts.adapters.items()),
                 f"Layout: {lora_format.title}; {lora_format.strength_where}, so its loader applies the trained "
                 "strength with no scale passed by hand",
                 f"Read with: {first.table.name} ({first.table.description})"],
        usage="\n".join(usage),
        layout=lora_format.title,
    ))


def _quantized_usage(parts, folder, layout: str, options: ExportOptions) -> str:
    """How ComfyUI and Diffusers load the file(s)."""
    files = [planned.path for planned in folder.files if not planned.path.endswith(".md")]
    part = parts[0]
    where = options.push_to_hub or "path/to/this/folder"
    if layout == "GGUF":
        config = part.variant.hub_id if part.variant else "path/to/a/Diffusers/model/folder"
        return (f"import torch\nfrom diffusers import GGUFQuantizationConfig, {part.family.transformer.class_name}\n\n"
                f"transformer = {part.family.transformer.class_name}.from_single_file(\n"
                f"    \"{where}/{files[0]}\", config=\"{config}\", subfolder=\"transformer\",\n"
                "    quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16))\n"
                "# or in ComfyUI: put the file in models/unet and load it with ComfyUI-GGUF's Unet Loader (GGUF)")
    return f"# ComfyUI: put {', '.join(files)} in models/diffusion_models and load it with Load Diffusion Model"


def quantized_card(parts, folder, layout: str, precision: str, notes: list[str], options: ExportOptions,
                   source: LazyCheckpoint) -> str:
    """The card of a GGUF or scaled-fp8 file of a transformer: what it holds, how it was made, how to load it."""
    part = parts[0]
    task = part.family.task(part.variant.task if part.variant else next(iter(part.family.tasks)))
    published = part.variant is not None and part.label == part.variant.name
    return model_card(CardFacts(
        title=f"{part.label} ({layout})",
        base_model=options.base_model or (part.variant.hub_id if published else None),
        relation="finetune",
        pipeline_tag=task.pipeline_tag,
        pipeline_class=task.pipeline,
        tags=(*part.family.tags, "gguf" if layout == "GGUF" else "fp8"),
        command=_command(options),
        source=source_line(source),
        precision=precision,
        details=[f"Kept in higher precision: {note}" for note in notes[:20]],
        usage=_quantized_usage(parts, folder, layout, options),
        layout=layout,
    ))
