"""The README.md model cards of exported folders, as text made before anything is written: a pipeline or model
folders (a fine-tune, or a conversion when the source records no training), a LoRA adapter (whose usage lines its
format knows), a quantized file (whose usage its format gives). Each snippet loads what the folder holds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..checkpoint import LazyCheckpoint
from ..checkpoint.readers import phrase_of
from ..lora import LoraAdapter
from ..lora.formats import LoraFormat
from ..models.family import ModelFamily, Task, Variant
from ..write.model_card import (ADAPTER, CONVERSION, FINETUNE, QUANTIZED_CONVERSION, QUANTIZED_FINETUNE, CardFacts,
                                 model_card)
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


def records_training(source: LazyCheckpoint) -> bool:
    """Whether the source says it comes from training (a step or a training save's tag): only then is the output
    carded as a fine-tune. Plain weights (a release, a model folder) are carded as what they are, a conversion."""
    return source.info.step is not None or source.info.tag is not None


def _card(title: str, family: ModelFamily, task: Task | None, options: ExportOptions, source: LazyCheckpoint,
          **facts) -> str:
    """A card of the family's model for ``task``: how the command made it from ``source``, and ``facts``."""
    return model_card(CardFacts(title=title, pipeline_tag=task.pipeline_tag if task else None,
                                command=_command(options), source=source_line(source),
                                tags=(*family.tags, *facts.pop("tags", ())), **facts))


# the torch dtype a snippet loads in, for each --dtype
_TORCH_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


def _load_arguments(options: ExportOptions) -> str:
    """The keyword arguments a snippet passes from_pretrained: the variant written, and the dtype (``dtype=``, which
    Diffusers takes in place of the deprecated ``torch_dtype=``)."""
    variant = f"variant=\"{options.variant}\", " if options.variant else ""
    return f"{variant}dtype={_TORCH_DTYPES.get(options.dtype or 'bf16', 'torch.bfloat16')}"


def _pipeline_usage(task: Task, options: ExportOptions) -> str:
    return (f"import torch\nfrom diffusers import {task.pipeline}\n\n"
            f"pipe = {task.pipeline}.from_pretrained(\"{options.push_to_hub or 'path/to/this/folder'}\", "
            f"{_load_arguments(options)})")


def _models_usage(parts: list[ModelExport], options: ExportOptions) -> str:
    """Each model folder loaded by its class: the folder itself, or its subfolder when there are several."""
    where = options.push_to_hub or "path/to/this/folder"
    classes = sorted({part.target.class_name for part in parts})
    lines = ["import torch", f"from diffusers import {', '.join(classes)}", ""]
    for part in parts:
        subfolder = f"subfolder=\"{part.component}\", " if len(parts) > 1 else ""
        lines.append(f"{part.component} = {part.target.class_name}.from_pretrained(\"{where}\", {subfolder}"
                     f"{_load_arguments(options)})")
    return "\n".join(lines)


def model_folder_card(parts: list[ModelExport], variant: Variant | None, options: ExportOptions,
                      source: LazyCheckpoint, adapter: LoraAdapter | None, pipeline: bool = True) -> str:
    """The card of a pipeline folder or of model folders (a transformer, each expert's, a VAE): how it was made and
    how to load it. A fine-tune when the source records training or a LoRA was fused in, else a conversion."""
    transformer = next((part for part in parts if part.component.startswith("transformer")), parts[0])
    family = transformer.family
    task = family.task(variant.task) if variant is not None else None
    details = [f"Key map: {part.table.name} ({part.table.description})" for part in parts]
    if adapter is not None:
        details.append(f"LoRA fused into the weights: {adapter.describe()}")
    made = FINETUNE if adapter is not None or records_training(source) else CONVERSION
    published = variant is not None and transformer.published and transformer.component.startswith("transformer")
    what = "" if pipeline or parts[0].component == "vae" else f" {', '.join(part.component for part in parts)}"
    return _card(
        f"{transformer.label}{what}{' fine-tune' if made == FINETUNE else ''}", family, task, options, source,
        base_model=options.base_model or (variant.hub_id if published else None),
        made=made,
        precision="; ".join(f"{part.component}: {part.policy.describe()}" for part in parts),
        details=details,
        usage=_pipeline_usage(task, options) if pipeline else _models_usage(parts, options),
    )


@dataclass
class AdapterCardFacts:
    family: ModelFamily  # of the model it goes on (a variant's, for a Wan LoRA on a Wan VACE --base)
    label: str  # the model the adapter is for, as the user should read it
    variant: Variant | None  # its published variant, when known
    base_model: str | None
    adapters: Mapping[str, LoraAdapter]  # expert subfolder ("" for one model) -> its adapter
    files: Mapping[str, str]  # pipeline component -> the written file, relative to the folder


def adapter_card(facts: AdapterCardFacts, lora_format: LoraFormat, options: ExportOptions,
                 source: LazyCheckpoint, precision: str) -> str:
    """The card of an adapter folder; ``precision``: the dtypes its files were written in."""
    family, first = facts.family, next(iter(facts.adapters.values()))
    task = family.task(facts.variant.task if facts.variant else next(iter(family.tasks)))
    folder = options.push_to_hub or "path/to/this/folder"
    usage = lora_format.usage_lines(task.pipeline, facts.base_model,
                                    {component: f"{folder}/{path}" for component, path in facts.files.items()})
    return _card(
        f"{facts.label} LoRA", family, task, options, source,
        base_model=facts.base_model,
        made=ADAPTER,
        precision=precision,
        details=[*(f"Adapter{' (' + sub + ')' if sub else ''}: {each.describe()}"
                   for sub, each in facts.adapters.items()),
                 f"Layout: {lora_format.title}; {lora_format.strength_where}, so its loader applies the trained "
                 "strength with no scale passed by hand",
                 f"Read with: {first.table.name} ({first.table.description})"],
        usage="\n".join(usage),
        layout=lora_format.title,
    )


@dataclass(frozen=True)
class QuantizedCard:
    """What a quantized format says on its card: its layout's name, its tag, the precision written, what was kept
    in higher precision, and how its loaders load it (each format knows its own)."""

    layout: str
    tag: str
    precision: str
    notes: list[str]
    usage: str


def quantized_card(parts, card: QuantizedCard, options: ExportOptions, source: LazyCheckpoint,
                   trained: bool = False) -> str:
    """The card of a quantized file of a transformer (GGUF, ComfyUI's): what it holds, how it was made, how to load
    it. ``trained``: a LoRA run was fused in (else the source says whether it was trained)."""
    part = parts[0]
    task = part.family.task(part.variant.task if part.variant else next(iter(part.family.tasks)))
    return _card(
        f"{part.label} ({card.layout})", part.family, task, options, source,
        base_model=options.base_model or (part.variant.hub_id if part.published else None),
        made=QUANTIZED_FINETUNE if trained or records_training(source) else QUANTIZED_CONVERSION,
        tags=(card.tag,),
        precision=card.precision,
        details=[f"Kept in higher precision: {note}" for note in card.notes[:20]],
        usage=card.usage,
        layout=card.layout,
    )


def original_card(parts, files: list[str], precision: str, options: ExportOptions, source: LazyCheckpoint) -> str:
    """The card of a model written in its family's original layout: the release's own file names, which its own
    repository and ComfyUI load (no Diffusers class reads them as they are), so the snippet reads the files' tensors
    and says where they go."""
    part = parts[0]
    task = part.family.task(part.variant.task if part.variant else next(iter(part.family.tasks)))
    return _card(
        f"{part.label} ({part.family.name} original layout)", part.family, task, options, source,
        base_model=options.base_model or (part.variant.hub_id if part.published else None),
        made=FINETUNE if any(p.fused for p in parts) or records_training(source) else CONVERSION,
        precision=precision, usage=_original_usage(part.family, files, options),
        layout=f"{part.family.name}'s original", library=None,
    )


def _original_usage(family: ModelFamily, files: list[str], options: ExportOptions) -> str:
    """Reading the weight files written (a few of them, for a sharded release): tensors in the family's original
    names, for its own model classes or ComfyUI's loaders, which take the release's files as they are; a release of
    several models in folders of their own (the experts of a pair) read model by model."""
    weights = [name for name in files if name.endswith((".safetensors", ".pt", ".pth"))]
    models = list(dict.fromkeys(str(Path(name).parent) for name in weights))
    safetensors = any(name.endswith(".safetensors") for name in weights)
    lines = ["# tensors in the original release's names: for the family's own model classes, or ComfyUI's loaders",
             *(["from huggingface_hub import hf_hub_download"] if options.push_to_hub else []),
             *(["from safetensors.torch import load_file"] if safetensors else []),
             *(["import torch"] if not all(name.endswith(".safetensors") for name in weights) else []),
             "tensors = {}" if models == ["."] else f"tensors = {{model: {{}} for model in {models}}}"]
    for name in weights[:4]:
        path = f'hf_hub_download("{options.push_to_hub}", "{name}")' if options.push_to_hub \
            else f'"path/to/this/folder/{name}"'
        read = f"load_file({path})" if name.endswith(".safetensors") else f"torch.load({path}, weights_only=True)"
        into = "tensors" if models == ["."] else f'tensors["{Path(name).parent}"]'
        lines.append(f"{into}.update({read})")
    if len(weights) > 4:
        lines.append(f"# ... and the {len(weights) - 4} other files of the release the same way")
    return "\n".join(lines)
