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
