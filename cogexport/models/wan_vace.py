"""The Wan VACE facts that need code (Wan2.1-VACE 1.3B / 14B, the Wan2.2-VACE-Fun A14B experts): a Wan transformer
(cogexport.models.wan reads its facts) plus a VACE branch, whose block count and input channels the shapes show;
which main blocks the VACE blocks hint (vace_layers) is config, not weights. Everything else is data in
key_maps/wan_vace/family.toml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from . import wan
from .original_config import original_config_beside
from .shape_facts import block_count, one_task

ORIGINAL_CLASS = "VaceWanModel"
_VACE_EMBEDDING = "vace_patch_embedding.weight"


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    if _VACE_EMBEDDING not in shapes:
        raise CogExportError(f"the checkpoint has no {_VACE_EMBEDDING}: it is not a Wan VACE transformer")
    facts = wan.read_facts(shapes)
    facts.update(vace_blocks=block_count(shapes, "vace_blocks."), vace_in_channels=shapes[_VACE_EMBEDDING][1])
    return facts


task_of = one_task("vace")


def describe(facts: Mapping[str, Any]) -> str:
    return (f"Wan VACE transformer, hidden size {facts['hidden']}, {facts['layers']} layers, "
            f"{facts['vace_blocks']} VACE blocks")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    if experts or (pipeline or {}).get("boundary_ratio") is not None:
        return "Wan2.2-VACE-Fun-A14B"
    width = config.get("num_attention_heads", 40) * config.get("attention_head_dim", 128)
    return "Wan2.1-VACE-14B" if width >= 5120 else "Wan2.1-VACE-1.3B"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    wan.check_target(facts, config, where)
    hinted = len(config.get("vace_layers") or ())
    if hinted != facts["vace_blocks"]:
        raise CogExportError(f"{where} has {facts['vace_blocks']} VACE blocks, but the config it would go into hints "
                             f"{hinted} layers (vace_layers); check --base")


# -- the original layout's config.json ---------------------------------------------------------------------------
def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config from the VaceWanModel config.json beside the weights; what the releases leave out
    (text_dim, patch_size) from the shapes, and vace_layers as VaceWanModel defaults it (every second layer)."""
    found = original_config_beside(folders, (ORIGINAL_CLASS,))
    if found is None:
        return None
    original, path = found
    config = wan.config_from_release(original, facts, path)
    layers = original.get("vace_layers")
    config["vace_layers"] = list(range(0, config["num_layers"], 2)) if layers is None else [int(i) for i in layers]
    config["vace_in_channels"] = int(original.get("vace_in_dim") or config["in_channels"])
    return config


def original_config(config: Mapping[str, Any], task: str) -> dict:
    """The VaceWanModel config.json the Wan repo writes beside a VACE model's weights."""
    original = wan.original_config(config, "vace")
    original.update(_class_name=ORIGINAL_CLASS, vace_layers=list(config["vace_layers"]),
                    vace_in_dim=config["vace_in_channels"])
    return dict(sorted(original.items()))
