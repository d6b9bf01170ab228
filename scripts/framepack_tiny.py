"""Tiny HunyuanVideo FramePack models for tests and fixtures, and the release's names written out independently.

``build_tiny_transformer`` is Diffusers' HunyuanVideoFramepackTransformer3DModel at hunyuanvideo_tiny's sizes with
FramePack's two additions (an image projection from a 12-wide image embedding, the history embedders), seeded noise
in every tensor.

``packed_shapes`` lists the tensor names and shapes of lllyasviel's diffusers_helper
HunyuanVideoTransformer3DModelPacked (FramePack's demo_gradio.py model, the class its release folders' config.json
names) for a config, written from that class's module tree (diffusers_helper/models/hunyuan_video_packed.py: the token
refiner, the double and single blocks, ClipVisionProjection, HunyuanVideoPatchEmbedForCleanLatents) and independent
of cogexport's key maps and of Diffusers' class: the tests check that the two name every tensor alike.
``release_config`` is the config.json the Packed class's save_pretrained writes (its arguments: Diffusers' but
image_condition_type).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hunyuanvideo_tiny import TINY, TIMESTEP_CHANNELS  # noqa: E402
from tiny_models import randomize_  # noqa: E402

TINY_IMAGE_DIM = 12  # the tiny SigLIP's width (the release's: 1152)
TINY_FRAMEPACK = {**TINY, "has_image_proj": True, "image_proj_dim": TINY_IMAGE_DIM, "has_clean_x_embedder": True}
PACKED_CLASS = "HunyuanVideoTransformer3DModelPacked"
HISTORY_KERNELS = {"proj": (1, 2, 2), "proj_2x": (2, 4, 4), "proj_4x": (4, 8, 8)}  # the clean latents' patches


def tiny_config(**overrides) -> dict:
    return {**TINY_FRAMEPACK, **overrides}


def build_tiny_transformer(seed: int = 0, **overrides):
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    return randomize_(HunyuanVideoFramepackTransformer3DModel(**tiny_config(**overrides)), seed, scale=0.2,
                      shift=0.1).eval()


def release_config(config: dict, version: str) -> dict:
    """The Packed class's config.json for a Diffusers config (sorted, as save_pretrained writes it)."""
    kept = {k: v for k, v in config.items() if not k.startswith("_") and k != "image_condition_type"}
    return dict(sorted({"_class_name": PACKED_CLASS, "_diffusers_version": version, **kept}.items()))


def packed_shapes(config: dict) -> dict[str, torch.Size]:
    """The Packed model's state dict names and shapes for a (complete) FramePack config."""
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    head, mlp = config["attention_head_dim"], int(hidden * config["mlp_ratio"])
    patch, patch_t, text = config["patch_size"], config["patch_size_t"], config["text_embed_dim"]
    shapes: dict[str, tuple] = {}

    def linear(name: str, out_features: int, in_features: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out_features, in_features), (out_features,)

    def conv(name: str, kernel: tuple) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (hidden, config["in_channels"], *kernel), (hidden,)

    def embedder(name: str, in_features: int) -> None:  # TimestepEmbedding / PixArtAlphaTextProjection
        linear(f"{name}.linear_1", hidden, in_features)
        linear(f"{name}.linear_2", hidden, hidden)

    conv("x_embedder.proj", (patch_t, patch, patch))
    if config["has_clean_x_embedder"]:
        for name, kernel in HISTORY_KERNELS.items():
            conv(f"clean_x_embedder.{name}", kernel)
    if config["has_image_proj"]:
        linear("image_projection.up", 3 * hidden, config["image_proj_dim"])
        linear("image_projection.down", hidden, 3 * hidden)
    _refiner(shapes, linear, embedder, hidden, text, config["num_refiner_layers"])
    embedder("time_text_embed.timestep_embedder", TIMESTEP_CHANNELS)
    if config["guidance_embeds"]:
        embedder("time_text_embed.guidance_embedder", TIMESTEP_CHANNELS)
    embedder("time_text_embed.text_embedder", config["pooled_projection_dim"])
    for i in range(config["num_layers"]):
        _double_block(shapes, linear, f"transformer_blocks.{i}", hidden, head, mlp)
    for i in range(config["num_single_layers"]):
        block = f"single_transformer_blocks.{i}"
        for projection in ("to_q", "to_k", "to_v"):
            linear(f"{block}.attn.{projection}", hidden, hidden)
        shapes[f"{block}.attn.norm_q.weight"] = shapes[f"{block}.attn.norm_k.weight"] = (head,)
        linear(f"{block}.norm.linear", 3 * hidden, hidden)
        linear(f"{block}.proj_mlp", mlp, hidden)
        linear(f"{block}.proj_out", hidden, hidden + mlp)
    linear("norm_out.linear", 2 * hidden, hidden)
    linear("proj_out", patch_t * patch * patch * config["out_channels"], hidden)
    return {name: torch.Size(shape) for name, shape in shapes.items()}


def _refiner(shapes: dict, linear, embedder, hidden: int, text: int, layers: int) -> None:
    """HunyuanVideoTokenRefiner: its own timestep and pooled-text embedding, proj_in, the refiner blocks."""
    embedder("context_embedder.time_text_embed.timestep_embedder", TIMESTEP_CHANNELS)
    embedder("context_embedder.time_text_embed.text_embedder", text)
    linear("context_embedder.proj_in", hidden, text)
    for i in range(layers):
        block = f"context_embedder.token_refiner.refiner_blocks.{i}"
        for norm in ("norm1", "norm2"):  # affine LayerNorms
            shapes[f"{block}.{norm}.weight"] = shapes[f"{block}.{norm}.bias"] = (hidden,)
        for projection in ("to_q", "to_k", "to_v", "to_out.0"):
            linear(f"{block}.attn.{projection}", hidden, hidden)
        linear(f"{block}.ff.net.0.proj", 4 * hidden, hidden)
        linear(f"{block}.ff.net.2", hidden, 4 * hidden)
        linear(f"{block}.norm_out.linear", 2 * hidden, hidden)


def _double_block(shapes: dict, linear, block: str, hidden: int, head: int, mlp: int) -> None:
    """HunyuanVideoTransformerBlock: two AdaLayerNormZero modulations, joint attention with RMS q/k norms, two MLPs
    (its norm2 / norm2_context LayerNorms have no weights)."""
    linear(f"{block}.norm1.linear", 6 * hidden, hidden)
    linear(f"{block}.norm1_context.linear", 6 * hidden, hidden)
    for projection in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
        linear(f"{block}.attn.{projection}", hidden, hidden)
    for norm in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
        shapes[f"{block}.attn.{norm}.weight"] = (head,)
    for ff in ("ff", "ff_context"):
        linear(f"{block}.{ff}.net.0.proj", mlp, hidden)
        linear(f"{block}.{ff}.net.2", hidden, mlp)
