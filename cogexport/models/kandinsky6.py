"""The Kandinsky 6 facts that need code: what a Kandinsky6Transformer3DModel's shapes say about it (its video and
audio streams' widths, its depth, whether its heads are a distilled model's), and which published variant a custom
config is built like. Everything else about the family is data in key_maps/kandinsky6/family.toml.

The sft and pretrain models of one size have the same tensors: their shapes name a size (Lite or Pro) and whether
the model is distilled; --model-name says which other.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .shape_facts import block_count, one_task, require

_FIRST = "visual_transformer_blocks.0."
_NEEDED = ("visual_embeddings.in_layer.weight", "out_layer.out_layer.weight", "audio_embeddings.in_layer.weight",
           "audio_out_layer.out_layer.weight", "video_time_embeddings.timestep_embedder.linear_1.weight",
           "audio_time_embeddings.timestep_embedder.linear_1.weight", "video_text_embeddings.in_layer.weight",
           "video_pooled_text_embeddings.in_layer.weight", _FIRST + "video_dec_block.self_attention.query_norm.weight",
           _FIRST + "audio_dec_block.self_attention.query_norm.weight", _FIRST + "va_modulation.out_layer.weight")
PATCH_VOLUME = 4  # the (1, 2, 2) patch of every release: the visual embedding takes 4 latent positions per token
PRO_WIDTH = 4096  # the 29B Pro model's video width (Lite: 1792)


def _stream_widths(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    """The two streams' widths; a feed-forward's width is absent from a checkpoint that only names the adapters'
    modules (the shapes of every tensor are there in a full one)."""
    video_ff = shapes.get(_FIRST + "video_dec_block.feed_forward.net.0.proj.weight")
    audio_ff = shapes.get(_FIRST + "audio_dec_block.feed_forward.net.0.proj.weight")
    return {
        "model_dim": shapes["visual_embeddings.in_layer.weight"][0],
        "model_dim_a": shapes["audio_embeddings.in_layer.weight"][0],
        "time_dim": shapes["video_time_embeddings.timestep_embedder.linear_1.weight"][0],
        "time_dim_a": shapes["audio_time_embeddings.timestep_embedder.linear_1.weight"][0],
        "ff_dim": video_ff[0] if video_ff is not None else None,
        "ff_dim_a": audio_ff[0] if audio_ff is not None else None,
        "head_dim": shapes[_FIRST + "video_dec_block.self_attention.query_norm.weight"][0],
        "head_dim_a": shapes[_FIRST + "audio_dec_block.self_attention.query_norm.weight"][0],
    }


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a Kandinsky 6 transformer")
    facts = _stream_widths(shapes)
    in_channels = shapes["visual_embeddings.in_layer.weight"][1] // PATCH_VOLUME
    # the conditioned models take 2 x channels + 1 (the noisy latents, the condition's latents and a mask): an odd count
    visual_cond = in_channels % 2 == 1
    in_visual = (in_channels - 1) // 2 if visual_cond else in_channels
    out_visual = shapes["out_layer.out_layer.weight"][0] // PATCH_VOLUME
    in_audio = shapes["audio_embeddings.in_layer.weight"][1]
    token_types = shapes.get("visual_token_type_embeddings.weight")
    va_modulation = shapes[_FIRST + "va_modulation.out_layer.weight"][0]
    return {
        **facts,
        "visual_blocks": block_count(shapes, "visual_transformer_blocks."),
        "text_blocks": block_count(shapes, "video_text_transformer_blocks."),
        "in_channels": in_channels,
        "visual_cond": visual_cond,
        "in_visual_dim": in_visual,
        "out_visual_dim": out_visual,
        "in_audio_dim": in_audio,
        "out_audio_dim": shapes["audio_out_layer.out_layer.weight"][0],
        # a distilled (pi-Flow) model predicts n_grid velocity grids per token: its video head is n_grid times wide
        "n_grid": out_visual // in_visual if in_visual and out_visual % in_visual == 0 else 0,
        # cross-modal gates: one projection of shift, scale (own width) and gate (the other stream's width)
        "cross_gates": va_modulation == 2 * facts["model_dim"] + facts["model_dim_a"],
        "visual_token_types": token_types[0] if token_types is not None else 0,
        "text_dim": shapes["video_text_embeddings.in_layer.weight"][1],
        "pooled_text_dim": shapes["video_pooled_text_embeddings.in_layer.weight"][1],
    }


task_of = one_task("ti2va")


def describe(facts: Mapping[str, Any]) -> str:
    distilled = f", distilled ({facts['n_grid']} velocity grids)" if facts["n_grid"] > 1 else ""
    return (f"Kandinsky 6 transformer, model_dim {facts['model_dim']} (audio {facts['model_dim_a']}), "
            f"{facts['text_blocks']} text and {facts['visual_blocks']} fused blocks, {facts['in_channels']} video "
            f"input channels{distilled}")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The published variant a custom config is built like: Pro by its width, else Lite; distilled when its video
    head is wider than its input."""
    size = "Pro" if config.get("model_dim", PRO_WIDTH) >= PRO_WIDTH else "Lite"
    distilled = config.get("out_visual_dim", 16) > config.get("in_visual_dim", 16)
    return f"Kandinsky-6.0-{size}-distill-5s" if distilled else f"Kandinsky-6.0-{size}-5s"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """What the shape plan cannot see: the patch the channel counts were read with, and the condition channels,
    which only mean a condition when the config says visual_cond."""
    if tuple(config.get("patch_size", (1, 2, 2))) != (1, 2, 2):
        raise CogExportError(f"{where}: the config it would go into has patch_size {list(config['patch_size'])}; "
                             "cogexport reads Kandinsky 6's channels for the released (1, 2, 2) patch only")
    if facts["visual_cond"] != bool(config.get("visual_cond", True)):
        has = "takes" if facts["visual_cond"] else "does not take"
        raise CogExportError(f"{where} {has} condition channels ({facts['in_channels']} video input channels), but "
                             f"the config it would go into says visual_cond {config.get('visual_cond', True)}; "
                             "check --base")
