"""The CogVideoX facts that need code: what a Diffusers-named transformer's shapes say about it, and which published
variant a custom config is built like. Everything else about the family is data in key_maps/cogvideox/family.toml.

Every family's shapes module offers the same functions: ``read_facts``, ``task_of``, ``describe``,
``layout_variant``, ``check_target`` and ``config_beside``.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..errors import CogExportError
from .shape_facts import block_count, require

PATCH = 2  # spatial patch size of every published variant
PATCH_T = 2  # 1.5's temporal patch size
_NEEDED = ("patch_embed.proj.weight", "patch_embed.text_proj.weight", "proj_out.weight", "time_embedding.linear_1.weight")


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    """Facts read off a Diffusers-named CogVideoX transformer state dict (names and shapes only)."""
    require(shapes, _NEEDED, "a CogVideoX transformer")
    proj = shapes["patch_embed.proj.weight"]
    version = "1.0" if len(proj) == 4 else "1.5"  # 1.0 patches with a Conv2d, 1.5 with a Linear
    per_patch = PATCH * PATCH * (1 if version == "1.0" else PATCH_T)
    in_channels = proj[1] if version == "1.0" else proj[1] // per_patch
    out_channels = shapes["proj_out.weight"][0] // per_patch
    has_position_table = "patch_embed.pos_embedding" in shapes  # 5b-I2V's learned one, or a 2b file's sin-cos copy
    image_to_video = in_channels == 2 * out_channels
    return {
        "version": version,
        "hidden": shapes["patch_embed.text_proj.weight"][0],
        "text_embed_dim": shapes["patch_embed.text_proj.weight"][1],
        "time_embed_dim": shapes["time_embedding.linear_1.weight"][0],
        "layers": block_count(shapes, "transformer_blocks."),
        "in_channels": in_channels,
        "out_channels": out_channels,
        "image_to_video": image_to_video,
        "has_ofs_embedding": "ofs_embedding.linear_1.weight" in shapes,
        # trained position embeddings that the target model must have (CogVideoX-5b-I2V's)
        "learned_positions": has_position_table and image_to_video and version == "1.0",
    }


def task_of(facts: Mapping[str, Any]) -> str:
    return "i2v" if facts["image_to_video"] else "t2v"


def describe(facts: Mapping[str, Any]) -> str:
    return (f"CogVideoX {facts['version']} transformer, hidden size {facts['hidden']}, {facts['layers']} layers, "
            f"in_channels {facts['in_channels']}")


def layout_variant(config: Mapping[str, Any], experts: tuple[str, ...] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    image_to_video = config.get("in_channels", 16) == 2 * config.get("out_channels", 16)
    if config.get("patch_size_t"):
        return "CogVideoX1.5-5B-I2V" if image_to_video else "CogVideoX1.5-5B"
    if not config.get("use_rotary_positional_embeddings"):
        return "CogVideoX-2b"
    return "CogVideoX-5b-I2V" if image_to_video else "CogVideoX-5b"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """What the shape plan cannot see: a learned position table needs a config that keeps it."""
    if facts["learned_positions"] and not config.get("use_learned_positional_embeddings"):
        raise CogExportError(f"{where} has learned position embeddings (CogVideoX-5b-I2V's pos_embedding), but the "
                             "config it would go into has use_learned_positional_embeddings false; check --base")


def config_beside(folders, facts) -> None:
    """SAT runs keep no Diffusers-usable config beside their weights: a custom size needs --base."""
    return None
