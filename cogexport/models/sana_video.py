"""The SanaVideo facts that need code: what a Diffusers-named SanaVideoTransformer3DModel's shapes say about it (width,
depth, latent channels, patch, the feed-forward's expansion) and what a config must agree with. Everything else is data
in key_maps/sana_video/family.toml.

One transformer serves both tasks (SanaVideoPipeline's text-to-video, SanaImageToVideoPipeline's image-to-video: the
image's latents replace the first frame's), so the shapes cannot tell them apart: family.toml lists the model twice,
once per task, and a --base pipeline's class or --model-type picks the i2v twin (t2v otherwise). The 480p and 720p
releases differ in their VAE's latents (Wan 2.1's 16 channels patched (1, 2, 2), LTX-2's 128 patched (1, 1, 1)),
which the transformer's input projection shows.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .shape_facts import block_count, require

_NEEDED = ("patch_embedding.weight", "proj_out.weight", "caption_projection.linear_1.weight",
           "transformer_blocks.0.ff.conv_point.weight", "transformer_blocks.0.ff.conv_temp.weight")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The published model a custom config is built like (the t2v twin; a pipeline or --model-type picks i2v): the
    720p one, whose latents are LTX-2's VAE's patched (1, 1, 1), when the config patches so; else the 480p one (Wan
    2.1's VAE, patched (1, 2, 2)). It decides the VAE class a pipeline's VAE is read into."""
    return "SANA-Video_2B_720p" if list(config.get("patch_size", (1, 2, 2))) == [1, 1, 1] else "SANA-Video_2B_480p"


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a SanaVideo transformer")
    patch_weight = shapes["patch_embedding.weight"]  # Conv3d [hidden, in_channels, pt, ph, pw]
    hidden, patch = patch_weight[0], list(patch_weight[2:])
    return {
        "hidden": hidden,
        "layers": block_count(shapes, "transformer_blocks."),
        "in_channels": patch_weight[1],
        "out_channels": shapes["proj_out.weight"][0] // math.prod(patch),
        "patch": patch,
        "caption_channels": shapes["caption_projection.linear_1.weight"][1],
        # GLUMBTempConv's point convolution takes int(hidden * mlp_ratio) channels
        "ff_channels": shapes["transformer_blocks.0.ff.conv_point.weight"][1],
    }


def task_of(facts: Mapping[str, Any]) -> str:
    return "t2v"


def tasks_of(facts: Mapping[str, Any]) -> tuple[str, ...]:
    return ("t2v", "i2v")


def describe(facts: Mapping[str, Any]) -> str:
    patch = "x".join(str(size) for size in facts["patch"])
    return (f"SanaVideo transformer, hidden size {facts['hidden']}, {facts['layers']} layers, in_channels "
            f"{facts['in_channels']}, patch {patch}")


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """The patch and the feed-forward's width are read off shapes the config must agree with: a patch of (1, 2, 2)
    and one of (1, 1, 1) over four times the channels give the same projection sizes, and mlp_ratio decides the
    feed-forward's channels (2.5 is the class default, 3.0 the release's)."""
    patch = list(config.get("patch_size", (1, 2, 2)))
    if patch != list(facts["patch"]):
        raise CogExportError(f"{where} patches {tuple(facts['patch'])}, but the config it would go into says "
                             f"patch_size {tuple(patch)}; check --base")
    width = config.get("num_attention_heads", 20) * config.get("attention_head_dim", 112)
    ff_channels = int(width * config.get("mlp_ratio", 2.5))
    if ff_channels != facts["ff_channels"]:
        raise CogExportError(f"{where} has a feed-forward of {facts['ff_channels']} channels, but the config it would "
                             f"go into makes {ff_channels} (mlp_ratio {config.get('mlp_ratio', 2.5)}); check --base")
