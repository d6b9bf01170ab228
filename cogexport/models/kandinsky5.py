"""The Kandinsky 5 facts that need code: what a Kandinsky5Transformer3DModel's shapes say about it (the release's names
are Diffusers' own), and which published variant a custom config is built like. Everything else about the family is
data in key_maps/kandinsky5/family.toml.

The 5 s and 10 s models, the sft / pretrain / nocfg / distilled ones and T2V and I2V of one size have the same tensors:
their shapes name a size (Lite or Pro); the default is that size's T2V sft 5 s model, and --model-name, --model-type
or --base says which other.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .shape_facts import block_count, require

_NEEDED = ("visual_embeddings.in_layer.weight", "out_layer.out_layer.weight", "time_embeddings.in_layer.weight",
           "text_embeddings.in_layer.weight", "pooled_text_embeddings.in_layer.weight",
           "visual_transformer_blocks.0.self_attention.query_norm.weight")
PATCH_VOLUME = 4  # the (1, 2, 2) patch of every release: the visual embedding takes 4 latent positions per token
PRO_WIDTH = 4096  # the 19B Pro model's width (Lite: 1792)


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a Kandinsky 5 transformer")
    visual_in = shapes["visual_embeddings.in_layer.weight"]  # Linear [model_dim, patch volume x visual channels]
    in_channels = visual_in[1] // PATCH_VOLUME
    out_channels = shapes["out_layer.out_layer.weight"][0] // PATCH_VOLUME
    feed_forward = shapes.get("visual_transformer_blocks.0.feed_forward.in_layer.weight")
    return {
        "model_dim": visual_in[0],
        "time_dim": shapes["time_embeddings.in_layer.weight"][0],
        "ff_dim": feed_forward[0] if feed_forward is not None else None,
        "head_dim": shapes["visual_transformer_blocks.0.self_attention.query_norm.weight"][0],
        "visual_blocks": block_count(shapes, "visual_transformer_blocks."),
        "text_blocks": block_count(shapes, "text_transformer_blocks."),
        "in_channels": in_channels,
        "out_channels": out_channels,
        # the conditioned models take 2 x channels + 1: the noisy latents, the condition's latents and a mask
        "visual_cond": in_channels == 2 * out_channels + 1,
        "text_dim": shapes["text_embeddings.in_layer.weight"][1],
        "pooled_text_dim": shapes["pooled_text_embeddings.in_layer.weight"][1],
    }


def tasks_of(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """T2V and I2V models of one size have the same tensors (both take the condition channels)."""
    return ("t2v", "i2v") if facts["visual_cond"] else ("t2v",)


def task_of(facts: Mapping[str, Any]) -> str:
    return tasks_of(facts)[0]


def describe(facts: Mapping[str, Any]) -> str:
    return (f"Kandinsky 5 transformer, model_dim {facts['model_dim']}, {facts['text_blocks']} text and "
            f"{facts['visual_blocks']} visual blocks, {facts['in_channels']} input channels")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The published variant a custom config is built like: Pro by its width, else Lite; 10 s by sparse (NABLA)
    attention. T2V and I2V configs are alike: --model-type or a --base pipeline's class picks the I2V twin."""
    if config.get("model_dim", 2048) >= PRO_WIDTH:
        return "Kandinsky-5.0-T2V-Pro-sft-5s"
    return "Kandinsky-5.0-T2V-Lite-sft-10s" if config.get("attention_type") == "nabla" else \
        "Kandinsky-5.0-T2V-Lite-sft-5s"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """What the shape plan cannot see: the condition channels only mean a condition when the config says
    visual_cond, and the patch the channel counts were read with."""
    if tuple(config.get("patch_size", (1, 2, 2))) != (1, 2, 2):
        raise CogExportError(f"{where}: the config it would go into has patch_size {list(config['patch_size'])}; "
                             "cogexport reads Kandinsky 5's channels for the released (1, 2, 2) patch only")
    if facts["visual_cond"] != bool(config.get("visual_cond", False)):
        has = "takes" if facts["visual_cond"] else "does not take"
        raise CogExportError(f"{where} {has} condition channels ({facts['in_channels']} input channels), but the "
                             f"config it would go into says visual_cond {config.get('visual_cond', False)}; check "
                             "--base")
