"""The HunyuanVideo facts that need code: what a Diffusers-named HunyuanVideoTransformer3DModel's shapes say about
it, and which published variant a custom config is built like. Everything else about the family is data in
key_maps/hunyuanvideo/family.toml.

The T2V model and the 16-channel I2V model ("token_replace") have the same tensors: their shapes say "t2v or i2v",
and the user's --model-type (or --base, --model-name) decides.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .shape_facts import block_count, require

_NEEDED = ("x_embedder.proj.weight", "proj_out.weight", "context_embedder.proj_in.weight",
           "time_text_embed.text_embedder.linear_1.weight")
GUIDANCE = "time_text_embed.guidance_embedder.linear_1.weight"
LATENT_CONCAT, TOKEN_REPLACE = "latent_concat", "token_replace"  # the two I2V conditionings (image_condition_type)


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a HunyuanVideo transformer")
    patch = shapes["x_embedder.proj.weight"]  # Conv3d [hidden, C_in, pt, ph, pw]
    return {
        "hidden": patch[0],
        "in_channels": patch[1],
        "out_channels": shapes["proj_out.weight"][0] // patch[2:].numel(),
        "layers": block_count(shapes, "transformer_blocks."),
        "single_layers": block_count(shapes, "single_transformer_blocks."),
        "refiner_layers": block_count(shapes, "context_embedder.token_refiner.refiner_blocks."),
        "guidance": GUIDANCE in shapes,
        "text_embed_dim": shapes["context_embedder.proj_in.weight"][1],
        "pooled_projection_dim": shapes["time_text_embed.text_embedder.linear_1.weight"][1],
    }


def tasks_of(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """Every task these shapes can be, the default first: the 16-channel I2V model is shaped like the T2V one."""
    if facts["in_channels"] > facts["out_channels"]:
        return ("i2v",)  # 33 = 16 noisy + 16 image latents + 1 mask
    return ("t2v", "i2v") if facts["guidance"] else ("t2v",)


def task_of(facts: Mapping[str, Any]) -> str:
    return tasks_of(facts)[0]


def describe(facts: Mapping[str, Any]) -> str:
    return (f"HunyuanVideo transformer, hidden size {facts['hidden']}, {facts['layers']} double and "
            f"{facts['single_layers']} single blocks, in_channels {facts['in_channels']}"
            + ("" if facts["guidance"] else ", no guidance embedder"))


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    condition = config.get("image_condition_type")
    if condition == LATENT_CONCAT or config.get("in_channels", 16) > config.get("out_channels", 16):
        return "HunyuanVideo-I2V-33ch"
    if condition == TOKEN_REPLACE:
        return "HunyuanVideo-I2V"
    return "HunyuanVideo"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """What the shape plan cannot see (the extra input channels only mean an image when the config says so), and the
    two differences between the T2V and 33-channel I2V models said in one line rather than as a list of keys."""
    expected = config.get("in_channels", 16)
    if facts["in_channels"] != expected:
        raise CogExportError(f"{where} is a HunyuanVideo transformer with {facts['in_channels']} input channels, but "
                             f"the config it would go into has {expected}; check --base (or --model-type)")
    if facts["guidance"] != config.get("guidance_embeds", True):
        has = "has" if facts["guidance"] else "has no"
        raise CogExportError(f"{where} {has} a guidance embedder (guidance_in), but the config it would go into says "
                             f"guidance_embeds {config.get('guidance_embeds', True)}; check --base")
    if facts["in_channels"] > facts["out_channels"] and config.get("image_condition_type") != LATENT_CONCAT:
        raise CogExportError(f"{where} is an image-to-video HunyuanVideo transformer with {facts['in_channels']} "
                             "input channels (image latents concatenated), but the config it would go into has "
                             f"image_condition_type {config.get('image_condition_type')!r}, not {LATENT_CONCAT!r}; "
                             "check --base")


def config_beside(folders, facts) -> None:
    """The original releases keep no model config beside the weights (the repo takes its sizes from the command
    line): a custom size needs --base."""
    return None


def original_config(config: Mapping[str, Any], task: str) -> None:
    """The original layout has no config file: the model-states file holds the weights alone."""
    return None
