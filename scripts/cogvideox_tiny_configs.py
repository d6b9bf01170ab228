"""Diffusers configs for the five CogVideoX variants, at real size and at a tiny test size.

The tiny transformer configs keep each variant's structure (RoPE, learned positions, 1.5's temporal patching and
patch_bias=False, the 1.5 I2V ofs embedding, I2V's doubled in_channels) while shrinking every width, so a model
builds and runs a forward pass on CPU in milliseconds. Widths are chosen pairwise distinct (D, time embed,
text embed, channels) so that a transposed or mis-assigned tensor shows up as a shape error, not a silent pass.

The full-size configs are the published Diffusers config values (facts page, section 4); build them on the meta
device only.

    python scripts/cogvideox_tiny_configs.py      # builds every tiny config and runs a forward pass
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import TINY_TEXT_LENGTH, randomize_  # noqa: E402

VARIANTS = ("2b", "5b", "5b-i2v", "1.5-5b", "1.5-5b-i2v")

_FULL_COMMON: dict[str, Any] = {
    "attention_head_dim": 64,
    "out_channels": 16,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "time_embed_dim": 512,
    "text_embed_dim": 4096,
    "dropout": 0.0,
    "attention_bias": True,
    "patch_size": 2,
    "temporal_compression_ratio": 4,
    "max_text_seq_length": 226,
    "activation_fn": "gelu-approximate",
    "timestep_activation_fn": "silu",
    "norm_elementwise_affine": True,
    "norm_eps": 1e-5,
    "spatial_interpolation_scale": 1.875,
    "temporal_interpolation_scale": 1.0,
}

_FULL_VARIANT: dict[str, dict[str, Any]] = {
    "2b": {
        "num_layers": 30, "num_attention_heads": 30, "in_channels": 16,
        "use_rotary_positional_embeddings": False, "use_learned_positional_embeddings": False,
        "patch_size_t": None, "ofs_embed_dim": None, "patch_bias": True,
        "sample_height": 60, "sample_width": 90, "sample_frames": 49,
    },
    "5b": {
        "num_layers": 42, "num_attention_heads": 48, "in_channels": 16,
        "use_rotary_positional_embeddings": True, "use_learned_positional_embeddings": False,
        "patch_size_t": None, "ofs_embed_dim": None, "patch_bias": True,
        "sample_height": 60, "sample_width": 90, "sample_frames": 49,
    },
    "5b-i2v": {
        "num_layers": 42, "num_attention_heads": 48, "in_channels": 32,
        "use_rotary_positional_embeddings": True, "use_learned_positional_embeddings": True,
        "patch_size_t": None, "ofs_embed_dim": None, "patch_bias": True,
        "sample_height": 60, "sample_width": 90, "sample_frames": 49,
    },
    "1.5-5b": {
        "num_layers": 42, "num_attention_heads": 48, "in_channels": 16,
        "use_rotary_positional_embeddings": True, "use_learned_positional_embeddings": False,
        "patch_size_t": 2, "ofs_embed_dim": None, "patch_bias": False,
        "sample_height": 300, "sample_width": 300, "sample_frames": 81,
    },
    "1.5-5b-i2v": {
        "num_layers": 42, "num_attention_heads": 48, "in_channels": 32,
        "use_rotary_positional_embeddings": True, "use_learned_positional_embeddings": False,
        "patch_size_t": 2, "ofs_embed_dim": 512, "patch_bias": False,
        "sample_height": 300, "sample_width": 300, "sample_frames": 81,
    },
}

# RoPE and learned positions need a head dim that is a multiple of 16; 2B's sin-cos table is fine with 8.
_TINY_VARIANT: dict[str, dict[str, Any]] = {
    "2b": {"num_attention_heads": 2, "attention_head_dim": 8, "in_channels": 4},
    "5b": {"num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4},
    "5b-i2v": {"num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 8},
    "1.5-5b": {"num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4},
    "1.5-5b-i2v": {"num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 8},
}
TINY_TIME_EMBED_DIM = 12  # 1.5 I2V adds the ofs embedding to the time embedding, so both widths must match
TINY_TEXT_EMBED_DIM = 20


def full_transformer_config(variant: str, num_layers: int | None = None) -> dict[str, Any]:
    """The published Diffusers config of a variant, optionally with fewer layers."""
    config = {**_FULL_COMMON, **_FULL_VARIANT[_check(variant)]}
    if num_layers is not None:
        config["num_layers"] = num_layers
    return config


def tiny_transformer_config(variant: str, num_layers: int = 2) -> dict[str, Any]:
    """A tiny config with the variant's feature flags; non-square sample so height/width mix-ups show."""
    if num_layers < 1:
        raise ValueError("num_layers must be at least 1")
    config = full_transformer_config(variant, num_layers)
    config.update(_TINY_VARIANT[variant])
    config.update(
        out_channels=4,
        time_embed_dim=TINY_TIME_EMBED_DIM,
        text_embed_dim=TINY_TEXT_EMBED_DIM,
        max_text_seq_length=TINY_TEXT_LENGTH,
        sample_height=8,
        sample_width=12,
        sample_frames=9,
    )
    if config["ofs_embed_dim"] is not None:
        config["ofs_embed_dim"] = TINY_TIME_EMBED_DIM
    return config


def full_vae_config(variant: str) -> dict[str, Any]:
    """The published VAE config: the class defaults plus the per-variant latent scaling."""
    is_1_0_2b = _check(variant) == "2b"
    return {
        "scaling_factor": 1.15258426 if is_1_0_2b else 0.7,
        "invert_scale_latents": variant.startswith("1.5"),
    }


def tiny_vae_config() -> dict[str, Any]:
    """Three levels with distinct widths: up block j and SAT's up.{L-1-j} differ in shape unless j is the middle."""
    return {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ("CogVideoXDownBlock3D",) * 3,
        "up_block_types": ("CogVideoXUpBlock3D",) * 3,
        "block_out_channels": (8, 16, 24),
        "latent_channels": 4,
        "layers_per_block": 1,
        "norm_num_groups": 4,
        "temporal_compression_ratio": 4,
        "sample_height": 16,
        "sample_width": 16,
    }


def build_tiny_transformer(variant: str, num_layers: int = 2, seed: int = 0):
    """A seeded, randomized tiny CogVideoXTransformer3DModel in fp32, eval mode."""
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(seed)
    model = CogVideoXTransformer3DModel(**tiny_transformer_config(variant, num_layers))
    return randomize_(model, seed).eval()


def build_tiny_vae(seed: int = 0):
    from diffusers import AutoencoderKLCogVideoX

    torch.manual_seed(seed)
    return randomize_(AutoencoderKLCogVideoX(**tiny_vae_config()), seed).eval()


def transformer_forward_inputs(config: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Inputs for one forward pass at the config's sample size, with RoPE tables built the way the pipelines do."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    generator = torch.Generator().manual_seed(seed)
    height, width = config["sample_height"], config["sample_width"]
    patch, patch_t = config["patch_size"], config["patch_size_t"]
    # 1.5 needs a latent frame count divisible by patch_size_t; 1.0 learned positions need the configured count.
    frames = 4 if patch_t else (config["sample_frames"] - 1) // config["temporal_compression_ratio"] + 1
    inputs: dict[str, Any] = {
        "hidden_states": torch.randn(1, frames, config["in_channels"], height, width, generator=generator),
        "encoder_hidden_states": torch.randn(
            1, config["max_text_seq_length"], config["text_embed_dim"], generator=generator
        ),
        "timestep": torch.tensor([500]),
    }
    if config["ofs_embed_dim"]:
        inputs["ofs"] = torch.tensor([2.0])
    if config["use_rotary_positional_embeddings"]:
        grid = (height // patch, width // patch)
        if patch_t is None:
            rope = get_3d_rotary_pos_embed(
                config["attention_head_dim"], ((0, 0), grid), grid, frames
            )
        else:
            rope = get_3d_rotary_pos_embed(
                config["attention_head_dim"], None, grid, frames // patch_t, grid_type="slice", max_size=grid
            )
        inputs["image_rotary_emb"] = rope
    return inputs


def _check(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    return variant


if __name__ == "__main__":
    import time

    for name in VARIANTS:
        start = time.perf_counter()
        model = build_tiny_transformer(name)
        cfg = tiny_transformer_config(name)
        with torch.no_grad():
            out = model(**transformer_forward_inputs(cfg)).sample
        print(f"{name:12s} keys={len(model.state_dict()):4d} out={tuple(out.shape)} {time.perf_counter() - start:.3f}s")
    vae = build_tiny_vae()
    with torch.no_grad():
        decoded = vae.decode(vae.encode(torch.randn(1, 3, 5, 16, 16)).latent_dist.mode()).sample
    print(f"vae          keys={len(vae.state_dict()):4d} out={tuple(decoded.shape)}")
