"""The Kandinsky 6 SR facts that need code: what a Kandinsky6SRTransformer3DModel's shapes say about it (its width,
depth, latent channels and whether its head is a distilled model's), and which published variant a custom config is
built like. Everything else about the family is data in key_maps/kandinsky6_sr/family.toml.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .shape_facts import block_count, one_task, require

_NEEDED = ("pooled_bias", "visual_embeddings.in_layer.weight", "out_layer.out_layer.weight",
           "time_embeddings.timestep_embedder.linear_1.weight",
           "visual_transformer_blocks.0.self_attention.query_norm.weight")


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a Kandinsky 6 SR transformer")
    # the (1, 1, 1) patch of the release: the input is the noisy latent, the anchor latent and the anchor mask
    in_channels = shapes["visual_embeddings.in_layer.weight"][1]
    in_visual = (in_channels - 1) // 2
    out_visual = shapes["out_layer.out_layer.weight"][0]
    feed_forward = shapes.get("visual_transformer_blocks.0.feed_forward.net.0.proj.weight")
    return {
        "model_dim": shapes["visual_embeddings.in_layer.weight"][0],
        "time_dim": shapes["time_embeddings.timestep_embedder.linear_1.weight"][0],
        "ff_dim": feed_forward[0] if feed_forward is not None else None,
        "head_dim": shapes["visual_transformer_blocks.0.self_attention.query_norm.weight"][0],
        "visual_blocks": block_count(shapes, "visual_transformer_blocks."),
        "in_channels": in_channels,
        "in_visual_dim": in_visual,
        "out_visual_dim": out_visual,
        # a distilled (pi-Flow) model predicts n_grid velocity grids per token: its head is n_grid times wide
        "n_grid": out_visual // in_visual if in_visual and out_visual % in_visual == 0 else 0,
    }


task_of = one_task("sr")


def describe(facts: Mapping[str, Any]) -> str:
    distilled = f", distilled ({facts['n_grid']} velocity grids)" if facts["n_grid"] > 1 else ""
    return (f"Kandinsky 6 SR transformer, model_dim {facts['model_dim']}, {facts['visual_blocks']} blocks, "
            f"{facts['in_visual_dim']} latent channels{distilled}")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The distilled bundle unless the config's head predicts one velocity (the flow-matching teacher)."""
    if config.get("out_visual_dim", 640) > config.get("in_visual_dim", 64):
        return "Kandinsky-6.0-VSR-distilled2steps-5s"
    return "Kandinsky-6.0-VSR-5s"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """The channel counts were read with the released (1, 1, 1) patch: another patch would misread them."""
    if tuple(config.get("patch_size", (1, 1, 1))) != (1, 1, 1):
        raise CogExportError(f"{where}: the config it would go into has patch_size {list(config['patch_size'])}; "
                             "cogexport reads the Kandinsky 6 SR model's channels for the released (1, 1, 1) patch "
                             "only")
