"""The Wan-Animate-2 facts that need code: what a WanAnimate2Transformer3DModel's shapes say about it. The release and
Diffusers share every module name but the attention projections, so the facts read off Diffusers' names hold for
both. The head count is in no tensor (the q / k norms span the whole width): a custom size takes it from --base's
config. Everything else is data in key_maps/wan_animate2/family.toml.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from ..errors import CogExportError
from .shape_facts import block_count, one_task, one_variant, require

_NEEDED = ("patch_embedding.weight", "text_embedding.0.weight", "time_embedding.0.weight", "head.head.weight",
           "head.modulation", "blocks.0.ffn.0.weight", "blocks.0.modulation", "blocks.0.self_attn.to_q.weight")


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a Wan-Animate-2 transformer")
    patch = shapes["patch_embedding.weight"]  # Conv3d [dim, in_dim, pt, ph, pw]
    patch_size = tuple(patch[2:])
    return {
        "hidden": patch[0],
        "in_channels": patch[1],
        "patch_size": patch_size,
        "out_channels": shapes["head.head.weight"][0] // math.prod(patch_size),
        "layers": block_count(shapes, "blocks."),
        "ffn": shapes["blocks.0.ffn.0.weight"][0],
        "text_dim": shapes["text_embedding.0.weight"][1],
        "freq_dim": shapes["time_embedding.0.weight"][1],
        # the CLIP image branch (use_img_emb): img_emb and each cross-attention's image keys and values
        "image_branch": "img_emb.proj.1.weight" in shapes,
    }


task_of = one_task("animate")


def describe(facts: Mapping[str, Any]) -> str:
    image = "with" if facts["image_branch"] else "without"
    return (f"Wan-Animate-2 transformer, hidden size {facts['hidden']}, {facts['layers']} layers, "
            f"{facts['in_channels']} input channels, {image} the CLIP image branch")


layout_variant = one_variant("Wan2.2-Animate-2-14B")


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """The head count is in no tensor: the config's must split the width into heads of an even size (rotary
    embeddings take pairs), as the class itself insists when it is built."""
    heads = config.get("num_heads", 40)
    if facts["hidden"] % heads or (facts["hidden"] // heads) % 2:
        raise CogExportError(f"{where}: hidden size {facts['hidden']} does not split into {heads} heads of an even "
                             "size (the config's num_heads); give a --base whose config.json has the run's num_heads")
