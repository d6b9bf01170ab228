"""Which expert of a model with several (the family's releases with expert subfolders: a high-noise and a low-noise
transformer) each adapter is for. An adapter's tensors never say; what the trainers record does (its file and folder
names, its metadata: cogexport/lora/experts.py), or the user (--lora-expert). One adapter against a base with several
experts and nothing to tell is refused: fusing it into the wrong expert would make a silently wrong model.
"""

from __future__ import annotations

import re
from typing import Mapping

from ..errors import CogExportError
from ..lora import LoraAdapter
from ..lora.experts import expert_of, expert_tags, trained_on_every_expert
from ..models.base_folder import BaseFolder
from ..models.family import families
from .inputs import ExportInputs
from .options import ExportOptions


def base_experts(base: BaseFolder | None) -> Mapping[str, str]:
    """Pipeline component -> release subfolder, when --base is a pipeline holding several transformers."""
    if base is None or not base.is_pipeline:
        return {}
    transformers = [name for name in base.configs if name == "transformer" or name.startswith("transformer_")]
    return base.family.expert_layout(len(transformers)) if len(transformers) > 1 else {}


def expert_names() -> list[str]:
    """Every expert folder name of every family (for --help)."""
    return list(dict.fromkeys(folder for family in families() for variant in family.variants
                              for folder in variant.experts.values()))


def named_expert(name: str, experts: Mapping[str, str]) -> str:
    """--lora-expert: a pipeline component (transformer_2) or the release's folder name (low_noise_model, low_noise)."""
    plain = re.sub(r"[^a-z0-9]", "", name.lower())  # as expert_tags writes the names: no case, no separators
    for component, tags in expert_tags(experts).items():
        if name == component or plain in tags:
            return component
    choices = " or ".join(experts[component] for component in experts)
    raise CogExportError(f"--lora-expert {name!r} names no expert of this model; give {choices}")


def assign_experts(adapters: dict[str, LoraAdapter], inputs: ExportInputs,
                   options: ExportOptions) -> dict[str, LoraAdapter]:
    """The adapters by the pipeline component each goes into: as read (one per expert folder, or one for an ordinary
    model), or one adapter put into the expert it was trained for when --base has several."""
    experts = base_experts(inputs.base)
    if not experts or inputs.experts:
        if options.lora_expert and not experts:
            raise CogExportError("--lora-expert names the expert of a model with several; --base is a model with one "
                                 "transformer (give the pipeline folder holding every expert)")
        return adapters
    (adapter,) = adapters.values()
    metadata = inputs.source.info.header_metadata
    if options.lora_expert:
        return {named_expert(options.lora_expert, experts): adapter}
    if trained_on_every_expert(metadata, experts):
        return {component: adapter for component in experts}
    component = expert_of(inputs.paths[0], metadata, experts)
    if component is None:
        folders = " or ".join(experts.values())
        raise CogExportError(f"{inputs.where} is one adapter, but --base {inputs.base.path} has {len(experts)} experts "
                             f"({', '.join(f'{folder}/ -> {c}' for c, folder in experts.items())}) and nothing in the "
                             f"file's name, folder or metadata says which it was trained for; pass --lora-expert "
                             f"{folders}")
    return {component: adapter}
