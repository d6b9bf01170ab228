"""The NVIDIA Cosmos Predict 2 / 2.5 and Transfer 2.5 facts that need code: what a Diffusers-named
CosmosTransformer3DModel's shapes say about it (width, depth, channels, whether it projects a Qwen2.5-VL text encoder's
states as 2.5 does, whether it attends to a reference image as Transfer 2.5's base does), its task, and which
published variant a custom config is built like. Everything else is data in key_maps/cosmos/family.toml.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .shape_facts import block_count, require

_NEEDED = ("patch_embed.proj.weight", "proj_out.weight", "time_embed.norm.weight",
           "transformer_blocks.0.attn1.norm_q.weight", "transformer_blocks.0.attn2.to_k.weight")
# Every published model patches (1, 2, 2): the patch embedding's input is (channels + padding mask) x 4, and the
# shapes alone cannot tell the patch from the channels.
_PATCH_ELEMENTS = 4
_TEXT_PROJECTION = "crossattn_proj.0.weight"
_IMAGE_CONTEXT = "img_context_proj.0.weight"  # Transfer 2.5's base: the reference image's projection


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a Cosmos transformer")
    patch = shapes["patch_embed.proj.weight"]  # Linear [hidden, (in_channels + 1) * pt * ph * pw]
    head_dim = shapes["transformer_blocks.0.attn1.norm_q.weight"][0]
    return {
        "hidden": patch[0],
        "heads": patch[0] // head_dim,
        "layers": block_count(shapes, "transformer_blocks."),
        # the padding mask is concatenated to the latents (concat_padding_mask, true in every release)
        "in_channels": patch[1] // _PATCH_ELEMENTS - 1,
        "out_channels": shapes["proj_out.weight"][0] // _PATCH_ELEMENTS,
        "text_dim": shapes["transformer_blocks.0.attn2.to_k.weight"][1],
        "text_projection": _TEXT_PROJECTION in shapes,
        "image_context": _IMAGE_CONTEXT in shapes,
        "learnable_positions": "learnable_pos_embed.pos_emb_t" in shapes,
    }


def task_of(facts: Mapping[str, Any]) -> str:
    if facts["image_context"]:
        return "transfer"  # Transfer 2.5's base, which its control branch steers
    if facts["text_projection"]:
        return "world"  # Predict 2.5: text, image and video to world in one model
    # Predict 2 Video2World: the conditioning frames' mask is one more input channel
    return "v2w" if facts["in_channels"] > facts["out_channels"] else "t2i"


def describe(facts: Mapping[str, Any]) -> str:
    version = "Transfer 2.5" if facts["image_context"] else "Predict 2.5" if facts["text_projection"] else "Predict 2"
    return (f"Cosmos {version} transformer, hidden size {facts['hidden']} ({facts['heads']} heads), "
            f"{facts['layers']} layers, in_channels {facts['in_channels']}")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The published variant a custom config is built like: the 14B models are 5120 wide, the 2B ones 2048."""
    size = "14B" if config.get("num_attention_heads", 32) * config.get("attention_head_dim", 128) >= 5120 else "2B"
    if config.get("img_context_dim_in"):
        return "Cosmos-Transfer2.5-2B"  # the one Transfer size published
    if config.get("use_crossattn_projection"):
        return f"Cosmos-Predict2.5-{size}"
    if config.get("in_channels", 16) > config.get("out_channels", 16):
        return f"Cosmos-Predict2-{size}-Video2World"
    return f"Cosmos-Predict2-{size}-Text2Image"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """The text projection decides the pipeline (T5 or Qwen2.5-VL text states): a config that disagrees with the
    weights would export a model its pipeline feeds the wrong text to."""
    if facts["text_projection"] != bool(config.get("use_crossattn_projection")):
        held = "has" if facts["text_projection"] else "has no"
        raise CogExportError(f"{where} {held} a text projection (crossattn_proj, Predict 2.5's), but the config "
                             f"says use_crossattn_projection={bool(config.get('use_crossattn_projection'))}; pass "
                             "--base with the matching Cosmos model")


def original_buffers(config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """MiniTrainDIT's RoPE tables (VideoRopePosition3DEmb's buffers), which the config decides: positions up to the
    longest patched axis, and the frequency exponents of a head's height/width share and of its time share."""
    head = config.get("attention_head_dim", 128)
    spatial = head // 6 * 2
    temporal = head - 2 * spatial
    sizes = zip(config.get("max_size", (128, 240, 240)), config.get("patch_size", (1, 2, 2)))
    return {
        "pos_embedder.seq": torch.arange(max(size // patch for size, patch in sizes), dtype=torch.float32),
        "pos_embedder.dim_spatial_range": torch.arange(0, spatial, 2)[: spatial // 2].float() / spatial,
        "pos_embedder.dim_temporal_range": torch.arange(0, temporal, 2)[: temporal // 2].float() / temporal,
    }
