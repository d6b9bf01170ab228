"""Diffusers configs for tiny Wan 2.1 / 2.2 models, one per shape class, plus the tiny VAEs.

Each tiny transformer keeps its class's structure (2.1 I2V's CLIP image branch and added k/v projections, FLF2V's
image position table, TI2V-5B's 48 latent channels, the A14B experts) while shrinking every width, so a model
builds and runs on CPU in milliseconds. Widths are pairwise distinct (hidden 32, ffn 48, text 24, frequency 20,
image 28) so that a tensor put in the wrong place is a shape error, not a silent pass; every tensor gets seeded
noise so that two tensors of one shape differ by value.

    python scripts/wan_tiny_configs.py      # builds every tiny model and runs a forward pass
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import TINY_TEXT_LENGTH, randomize_  # noqa: E402

# shape class -> the Diffusers config values that differ from the tiny common ones
SHAPE_CLASSES = ("t2v", "i2v", "flf2v", "ti2v", "a14b", "i2v-a14b")
TINY_TEXT_DIM = 24
TINY_IMAGE_DIM = 28  # CLIP's hidden size in the tiny I2V pipelines (1280 in the releases)
TINY_IMAGE_TOKENS = 5  # a 28x28 image in 14x14 patches plus the class token (257 in the releases)

_COMMON: dict[str, Any] = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": TINY_TEXT_DIM,
    "freq_dim": 20,
    "ffn_dim": 48,
    "num_layers": 2,
    "patch_size": (1, 2, 2),
}
_CLASS: dict[str, dict[str, Any]] = {
    "t2v": {},
    # Wan 2.1 I2V: noisy latents + mask (4) + image latents on the channel axis, CLIP features through k_img/v_img
    "i2v": {"in_channels": 12, "image_dim": TINY_IMAGE_DIM, "added_kv_proj_dim": 32},
    # FLF2V: I2V plus a position table over the first and last frames' CLIP tokens
    "flf2v": {"in_channels": 12, "image_dim": TINY_IMAGE_DIM, "added_kv_proj_dim": 32,
              "pos_embed_seq_len": 2 * TINY_IMAGE_TOKENS},
    # Wan 2.2 TI2V-5B: the 48-channel VAE's latents in and out
    "ti2v": {"in_channels": 48, "out_channels": 48},
    # each Wan 2.2 T2V-A14B expert is a T2V-shaped model
    "a14b": {},
    # Wan 2.2 I2V-A14B experts: the image latents on the channel axis, no CLIP branch
    "i2v-a14b": {"in_channels": 12},
}

# The VAE table is built for the released 4-stage layout with 2 residual blocks per stage (3 in the decoder), which
# Diffusers' converter also hard-codes; only the widths shrink.
TINY_VAE21: dict[str, Any] = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
                              "latents_mean": [0.1, -0.2, 0.3, -0.4], "latents_std": [1.5, 0.5, 2.5, 1.0]}
# Wan 2.2's VAE: residual down/up blocks, 2x2 patchified 12-channel input, a wider decoder, and as in TI2V-5B 48
# latent channels (the TI2V transformer's in and out channels).
TINY_VAE22: dict[str, Any] = {"base_dim": 8, "decoder_base_dim": 12, "z_dim": 48, "dim_mult": [1, 2, 4, 4],
                              "num_res_blocks": 2, "is_residual": True, "in_channels": 12, "out_channels": 12,
                              "patch_size": 2, "scale_factor_spatial": 16,
                              "latents_mean": [round(0.01 * (i - 24), 2) for i in range(48)],
                              "latents_std": [round(0.5 + 0.02 * i, 2) for i in range(48)]}


def tiny_transformer_config(shape_class: str, num_layers: int = 2) -> dict[str, Any]:
    if shape_class not in _CLASS:
        raise ValueError(f"unknown shape class {shape_class!r}; one of {', '.join(SHAPE_CLASSES)}")
    return {**_COMMON, **_CLASS[shape_class], "num_layers": num_layers}


def build_tiny_transformer(shape_class: str, seed: int = 0, num_layers: int = 2):
    """A seeded tiny WanTransformer3DModel in fp32, eval mode."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(**tiny_transformer_config(shape_class, num_layers))
    return randomize_(model, seed).eval()


def build_tiny_vae(version: str = "2.1", seed: int = 0):
    """A seeded tiny AutoencoderKLWan: the 2.1 layout or the 2.2 (TI2V-5B) one."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    return randomize_(AutoencoderKLWan(**(TINY_VAE21 if version == "2.1" else TINY_VAE22)), seed).eval()


def transformer_forward_inputs(config: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Inputs for one forward pass: 2 latent frames of 4x6, 8 text tokens, CLIP tokens for the image classes."""
    generator = torch.Generator().manual_seed(seed)
    inputs: dict[str, Any] = {
        "hidden_states": torch.randn(1, config["in_channels"], 2, 4, 6, generator=generator),
        "encoder_hidden_states": torch.randn(1, TINY_TEXT_LENGTH, config["text_dim"], generator=generator),
        "timestep": torch.tensor([500]),
    }
    if config.get("image_dim"):
        frames = 2 if config.get("pos_embed_seq_len") else 1
        inputs["encoder_hidden_states_image"] = torch.randn(frames, TINY_IMAGE_TOKENS, config["image_dim"],
                                                            generator=generator)
    return inputs


if __name__ == "__main__":
    for name in SHAPE_CLASSES:
        model = build_tiny_transformer(name)
        with torch.no_grad():
            out = model(**transformer_forward_inputs(tiny_transformer_config(name))).sample
        print(f"{name:6s} keys={len(model.state_dict()):4d} out={tuple(out.shape)}")
    for version in ("2.1", "2.2"):
        vae = build_tiny_vae(version)
        channels = 3
        with torch.no_grad():
            decoded = vae.decode(vae.encode(torch.randn(1, channels, 5, 32, 32)).latent_dist.mode()).sample
        print(f"vae {version} keys={len(vae.state_dict()):4d} out={tuple(decoded.shape)}")
