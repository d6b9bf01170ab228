"""Diffusers folders: a model folder exactly as ``save_pretrained`` writes it, and a pipeline folder around it.

A model folder is ``config.json`` (from the Diffusers class itself, built on the meta device) plus
``diffusion_pytorch_model[.variant].safetensors`` or its shards and index, cut as ``save_pretrained`` cuts them.
A pipeline folder adds ``model_index.json``, a scheduler config, and the text encoder and tokenizer taken
from the base pipeline (hard links where the filesystem allows, else copies). Every file is planned here as its
final text or tensors (folder_plan.py) before anything is written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from ..errors import CogExportError
from ..lazy import LazyTensor
from ..models.diffusers_cache import diffusers_version
from ..models.pipeline_facts import PipelineSignature, SchedulerConfig
from .folder_plan import PlannedFile, TextFile, json_text, shard_files
from .shards import ShardPlan, plan_shards

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"


# What save_pretrained(variant=...) can put into a file name; anything else (a path separator...) is refused.
_VARIANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_variant_name(variant: str) -> None:
    if not _VARIANT.fullmatch(variant):
        raise CogExportError(f"--variant {variant!r} cannot be part of a file name; use letters, digits, '.', '_' or "
                             "'-', like fp16 or bf16")


def plan_model_folder(tensors: Mapping[str, LazyTensor], max_shard_size: str | int, variant: str | None) -> ShardPlan:
    if variant is not None:
        check_variant_name(variant)
    return plan_shards(tensors, WEIGHTS_NAME, max_shard_size, variant)


def variant_of(folder: Path) -> str | None:
    """The variant a model folder's weights were saved with (what from_pretrained needs to be told), if any."""
    stem = WEIGHTS_NAME[: -len(".safetensors")]
    for path in folder.glob(f"{stem}.*"):
        found = re.fullmatch(rf"{stem}\.(?:safetensors\.index\.(.+)\.json|(.+?)(?:-\d+-of-\d+)?\.safetensors)",
                             path.name)
        if found and (found.group(1) or found.group(2)):
            return found.group(1) or found.group(2)
    return None


def model_folder_files(folder: str, config_json: str, tensors: Mapping[str, LazyTensor],
                       plan: ShardPlan) -> list[PlannedFile]:
    """config.json and the weights of one model folder; ``config_json``: the Diffusers model's own JSON, as
    save_pretrained writes it (models/target.py)."""
    return [TextFile(f"{folder}/config.json" if folder else "config.json", config_json),
            *shard_files(folder, tensors, plan)]


def write_config_json(path: Path, config: Mapping[str, object]) -> None:
    """A JSON config in Diffusers' own layout (sorted keys, two-space indent, final newline)."""
    path.write_text(json_text(config), encoding="utf-8")


def model_index_file(signature: PipelineSignature, pipeline_class: str, components: Mapping[str, list],
                     config: Mapping[str, object] | None = None) -> TextFile:
    """model_index.json as the pipeline's save_pretrained writes it: every component the class takes (absent ones as
    [null, null]) and its config values (``config``, else the class's defaults)."""
    values = {name: (config or {}).get(name, signature.defaults.get(name)) for name in signature.config_names}
    entries = {name: list(components.get(name, [None, None])) for name in signature.components}
    return TextFile("model_index.json", json_text({"_class_name": pipeline_class,
                                                   "_diffusers_version": diffusers_version(),
                                                   **entries, **values}))


def scheduler_file(folder: str, scheduler: SchedulerConfig) -> TextFile:
    """The scheduler's config as its save_pretrained writes it."""
    return TextFile(f"{folder}/{scheduler.file_name}", scheduler.json)
