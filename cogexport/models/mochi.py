"""The Mochi-1 facts that need code: what a Diffusers-named MochiTransformer3DModel's shapes say about it, the model
kwargs genmo's fine-tuner stores in its checkpoint's metadata (a custom size exports without --base), and which
published variant a custom config is built like (there is one). Everything else is data in
key_maps/mochi/family.toml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .shape_facts import block_count, metadata_json, one_task, one_variant, require

_NEEDED = ("patch_embed.proj.weight", "proj_out.weight", "time_embed.caption_proj.weight", "pos_frequencies")
RELEASE = "mochi-1-preview"


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a Mochi transformer")
    patch = shapes["patch_embed.proj.weight"]  # Conv2d [D, C_in, p, p]
    ffn = shapes.get("transformer_blocks.0.ff.net.0.proj.weight")
    return {
        "hidden": patch[0],
        "in_channels": patch[1],
        "patch_size": patch[2],
        "out_channels": shapes["proj_out.weight"][0] // (patch[2] * patch[3]),
        "heads": shapes["pos_frequencies"][1],  # [3 axes, heads, head_dim / 2]
        "layers": block_count(shapes, "transformer_blocks."),
        "pooled": shapes["time_embed.caption_proj.weight"][0],
        "text_dim": shapes["time_embed.caption_proj.weight"][1],
        "ffn": ffn[0] // 2 if ffn is not None else None,  # SwiGLU: value and gate stacked
    }


def release_facts(shapes: Mapping[str, torch.Size], metadata: Mapping[str, str]) -> dict[str, Any]:
    """genmo's fine-tuner saves the model's constructor kwargs as JSON under the metadata key "kwargs"."""
    return metadata_json(metadata, "kwargs", "release_kwargs", "a genmo fine-tuner checkpoint")


task_of = one_task("t2v")


def describe(facts: Mapping[str, Any]) -> str:
    return (f"Mochi transformer, hidden size {facts['hidden']} ({facts['heads']} heads), {facts['layers']} layers, text "
            f"stream {facts['pooled']} wide")


layout_variant = one_variant(RELEASE)


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """What the shape plan would report less clearly: Diffusers sizes the feed-forward as 8/3 of the width, the
    original rounds that up to a multiple of 256; a width where the two differ cannot be held by Diffusers' class."""
    width = config.get("num_attention_heads", 24) * config.get("attention_head_dim", 128)
    if facts.get("ffn") is not None and facts["hidden"] == width and facts["ffn"] != 4 * width * 2 // 3:
        raise CogExportError(f"{where} has a feed-forward {facts['ffn']} wide at hidden size {width}; Diffusers' "
                             f"MochiTransformer3DModel makes it {4 * width * 2 // 3} (it does not round up to a "
                             "multiple of 256 as the original does), so this size has no Diffusers model")


def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config of a genmo fine-tuner checkpoint, from the kwargs in its metadata."""
    kwargs = facts.get("release_kwargs")
    if not kwargs:
        return None
    try:
        heads = int(kwargs["num_heads"])
        config = {
            "num_layers": int(kwargs["depth"]),
            "num_attention_heads": heads,
            "attention_head_dim": int(kwargs["hidden_size_x"]) // heads,
            "pooled_projection_dim": int(kwargs["hidden_size_y"]),
            "patch_size": int(kwargs.get("patch_size", 2)),
            "in_channels": int(kwargs.get("in_channels", 12)),
            "text_embed_dim": int(kwargs.get("t5_feat_dim", 4096)),
            "max_sequence_length": int(kwargs.get("t5_token_length", 256)),
        }
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise CogExportError("the checkpoint's metadata kwargs are not a complete Mochi model config (depth, num_heads, "
                             "hidden_size_x, hidden_size_y)") from None
    return config


def original_config(config: Mapping[str, Any], task: str) -> None:
    """genmo's release keeps no config file beside dit.safetensors."""
    return None
