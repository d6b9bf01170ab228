"""Tiny Kandinsky 5 transformers for tests, fixtures and the benchmark: the shapes of the released Lite and Pro models
at a few dozen channels, built by Diffusers' Kandinsky5Transformer3DModel (whose tensor names are the release's).

Shape classes (the Diffusers config values of the tiny model):

    t2v       the Lite / Pro layout: 16 latent channels, the visual condition's channels (2 x 16 + 1 in),
              2 text and 2 visual blocks; every T2V and I2V release of one size has these tensors
    i2v       the same tensors (what a Kandinsky5I2VPipeline holds)
    plain     no condition channels (visual_cond false: 16 in), the class's other layout
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import randomize_  # noqa: E402

LATENT = 16  # HunyuanVideo's VAE: 16 latent channels
TINY_TEXT_DIM, TINY_POOLED_DIM = 24, 24  # the tiny Qwen2.5-VL's and CLIP's widths
TINY = {
    "in_visual_dim": LATENT, "out_visual_dim": LATENT, "in_text_dim": TINY_TEXT_DIM, "in_text_dim2": TINY_POOLED_DIM,
    "time_dim": 32, "model_dim": 32, "ff_dim": 64, "num_text_blocks": 2, "num_visual_blocks": 2,
    "axes_dims": (4, 6, 6), "visual_cond": True,
}
SHAPE_CLASSES = {"t2v": {}, "i2v": {}, "plain": {"visual_cond": False}}
MODEL_TYPE = {"t2v": "t2v", "i2v": "i2v", "plain": "t2v"}


def tiny_config(shape_class: str = "t2v", **overrides) -> dict:
    return {**TINY, **SHAPE_CLASSES[shape_class], **overrides}


def build_tiny_transformer(shape_class: str = "t2v", seed: int = 0, **overrides):
    from diffusers import Kandinsky5Transformer3DModel

    return randomize_(Kandinsky5Transformer3DModel(**tiny_config(shape_class, **overrides)), seed, scale=0.2,
                      shift=0.1).eval()


def original_shapes(config: dict) -> dict:
    """The kandinsky-5 repo's DiffusionTransformer3D state dict names and shapes for a Kandinsky5Transformer3DModel
    config, written from that repo's module tree (kandinsky/models/dit.py, nn.py: every RoPE and frequency table is a
    non-persistent buffer), independent of Diffusers' class."""
    import math

    import torch

    c = {**TINY, "patch_size": (1, 2, 2), **config}
    dim, time, ff, head = c["model_dim"], c["time_dim"], c["ff_dim"], sum(c["axes_dims"])
    visual_in = (2 * c["in_visual_dim"] + 1) if c["visual_cond"] else c["in_visual_dim"]
    shapes: dict[str, tuple] = {}

    def linear(name: str, out_features: int, in_features: int, bias: bool = True) -> None:
        shapes[f"{name}.weight"] = (out_features, in_features)
        if bias:
            shapes[f"{name}.bias"] = (out_features,)

    def attention(name: str) -> None:
        for part in ("to_query", "to_key", "to_value", "out_layer"):
            linear(f"{name}.{part}", dim, dim)
        shapes[f"{name}.query_norm.weight"] = shapes[f"{name}.key_norm.weight"] = (head,)

    linear("time_embeddings.in_layer", time, dim)
    linear("time_embeddings.out_layer", time, time)
    for name, width, text in (("text_embeddings", dim, c["in_text_dim"]), ("pooled_text_embeddings", time,
                                                                          c["in_text_dim2"])):
        linear(f"{name}.in_layer", width, text)
        shapes[f"{name}.norm.weight"] = shapes[f"{name}.norm.bias"] = (width,)
    linear("visual_embeddings.in_layer", dim, math.prod(c["patch_size"]) * visual_in)
    for i in range(c["num_text_blocks"]):
        linear(f"text_transformer_blocks.{i}.text_modulation.out_layer", 6 * dim, time)
        attention(f"text_transformer_blocks.{i}.self_attention")
        linear(f"text_transformer_blocks.{i}.feed_forward.in_layer", ff, dim, bias=False)
        linear(f"text_transformer_blocks.{i}.feed_forward.out_layer", dim, ff, bias=False)
    for i in range(c["num_visual_blocks"]):
        linear(f"visual_transformer_blocks.{i}.visual_modulation.out_layer", 9 * dim, time)
        attention(f"visual_transformer_blocks.{i}.self_attention")
        attention(f"visual_transformer_blocks.{i}.cross_attention")
        linear(f"visual_transformer_blocks.{i}.feed_forward.in_layer", ff, dim, bias=False)
        linear(f"visual_transformer_blocks.{i}.feed_forward.out_layer", dim, ff, bias=False)
    linear("out_layer.modulation.out_layer", 2 * dim, time)
    linear("out_layer.out_layer", math.prod(c["patch_size"]) * c["out_visual_dim"], dim)
    return {name: torch.Size(shape) for name, shape in shapes.items()}
