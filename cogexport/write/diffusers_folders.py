"""Diffusers folders: a model folder exactly as ``save_pretrained`` writes it, and a pipeline folder around it.

A model folder is ``config.json`` (from the Diffusers class itself, built on the meta device) plus
``diffusion_pytorch_model[.variant].safetensors`` or its shards and index, cut as ``save_pretrained`` cuts them.
A pipeline folder adds ``model_index.json``, a scheduler config, and the text encoder and tokenizer taken
from the base pipeline (hard links where the filesystem allows, else copies).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Mapping

import torch

from ..errors import CogExportError
from ..lazy import LazyTensor
from .shards import ShardPlan, plan_shards, write_shards

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"


# What save_pretrained(variant=...) can put into a file name; anything else (a path separator...) is refused.
_VARIANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def plan_model_folder(tensors: Mapping[str, LazyTensor], max_shard_size: str | int, variant: str | None) -> ShardPlan:
    if variant is not None and not _VARIANT.fullmatch(variant):
        raise CogExportError(f"--variant {variant!r} cannot be part of a file name; use letters, digits, '.', '_' or "
                             "'-', like fp16 or bf16")
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


def write_model_folder(folder: Path, model: torch.nn.Module, tensors: Mapping[str, LazyTensor], plan: ShardPlan,
                       on_tensor: Callable[[str, int], None] | None = None) -> list[str]:
    """config.json and the weights; ``model`` is the meta-device Diffusers model whose config is written."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_config(folder)
    return ["config.json", *write_shards(folder, tensors, plan, on_tensor)]


def write_config_json(path: Path, config: Mapping[str, object]) -> None:
    """A JSON config in Diffusers' own layout (sorted keys, two-space indent, final newline)."""
    path.write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_model_index(folder: Path, pipeline_class: str, components: Mapping[str, list],
                      config: Mapping[str, object] | None = None) -> None:
    """model_index.json as the pipeline's save_pretrained writes it: every component the class takes (absent ones as
    [null, null]) and its config values (``config``, else the class's defaults)."""
    import inspect

    import diffusers

    pipeline = getattr(diffusers, pipeline_class)
    expected, optional = pipeline._get_signature_keys(pipeline)
    defaults = {name: p.default for name, p in inspect.signature(pipeline.__init__).parameters.items()}
    values = {name: (config or {}).get(name, defaults.get(name)) for name in optional}
    entries = {name: list(components.get(name, [None, None])) for name in expected}
    write_config_json(folder / "model_index.json", {"_class_name": pipeline_class,
                                                    "_diffusers_version": diffusers.__version__, **entries, **values})


def write_scheduler(folder: Path, class_name: str, config: Mapping[str, object]) -> None:
    import diffusers

    getattr(diffusers, class_name)(**config).save_pretrained(folder)


def link_or_copy_tree(source: Path, destination: Path) -> str:
    """Mirror ``source`` into ``destination`` with hard links, falling back to copies; says which it used."""
    how = "linked"
    for path in sorted(source.rglob("*")):
        target = destination / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
            how = "copied"
    return how
