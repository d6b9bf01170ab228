"""Diffusers configs for tiny models of Wan's variants (Wan VACE, Wan Animate, SkyReels-V2), one per shape class.

Each keeps its class's structure (VACE's hinted blocks and control embedding, Animate's pose embedding, motion
encoder, face encoder and face adapters, SkyReels-V2's fps embedding and CLIP branch) on Wan's tiny widths
(wan_tiny_configs.py: hidden 32, ffn 48, text 24, frequency 20, image 28), with the variants' own sizes distinct from
those and from each other (VACE control channels 72, motion style 8, motion directions 6, motion features 10, face
hidden 12), so a tensor put in the wrong place is a shape error. Animate's motion encoder keeps the release's 512-pixel
structure (seven residual blocks: the size its original code and Diffusers' converter assume) at 4 channels.

    python scripts/wan_variants_tiny.py      # builds every tiny model and runs a forward pass
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import TINY_TEXT_LENGTH, randomize_  # noqa: E402
from wan_tiny_configs import TINY_IMAGE_DIM, TINY_IMAGE_TOKENS, TINY_TEXT_DIM  # noqa: E402

_COMMON: dict[str, Any] = {"num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4, "out_channels": 4,
                           "text_dim": TINY_TEXT_DIM, "freq_dim": 20, "ffn_dim": 48, "num_layers": 4,
                           "patch_size": (1, 2, 2)}
# The control latents WanVACEPipeline builds: the video's inactive and reactive parts (2 x 4 latent channels of the
# tiny VAE) and the mask folded into 8 x 8 = 64 channels (the VAE's spatial factor squared). 96 in the releases.
TINY_VACE_IN = 72


def _motion_channels() -> dict[str, int]:
    """Animate's motion encoder channels: 4 at every size the 512-pixel encoder uses, the class's default above."""
    from diffusers.models.transformers.transformer_wan_animate import WAN_ANIMATE_MOTION_ENCODER_CHANNEL_SIZES

    return {**WAN_ANIMATE_MOTION_ENCODER_CHANNEL_SIZES, **{str(2 ** k): 4 for k in range(2, 10)}}


# shape class -> (Diffusers class, config values off the tiny common ones)
SHAPE_CLASSES: dict[str, tuple[str, dict[str, Any]]] = {
    # Wan2.1-VACE: every second block hinted (as VaceWanModel defaults)
    "vace": ("WanVACETransformer3DModel", {"vace_layers": [0, 2], "vace_in_channels": TINY_VACE_IN}),
    # Wan2.2-Animate: 2 x 4 latents + 4 mask channels in, the pose latents, CLIP tokens through k_img / v_img
    "animate": ("WanAnimateTransformer3DModel", {
        "in_channels": 12, "latent_channels": 4, "image_dim": TINY_IMAGE_DIM, "added_kv_proj_dim": 32,
        "motion_encoder_size": 512, "motion_style_dim": 8, "motion_dim": 6, "motion_encoder_dim": 10,
        "face_encoder_hidden_dim": 12, "face_encoder_num_heads": 2, "inject_face_latents_blocks": 2}),
    # SkyReels-V2's diffusion-forcing 1.3B model: the fps embedding
    "skyreels-df": ("SkyReelsV2Transformer3DModel", {"inject_sample_info": True}),
    # SkyReels-V2 T2V (and the diffusion-forcing 14B models): Wan 2.1 T2V's shapes
    "skyreels-t2v": ("SkyReelsV2Transformer3DModel", {}),
    # SkyReels-V2 I2V: Wan 2.1 I2V's shapes
    "skyreels-i2v": ("SkyReelsV2Transformer3DModel", {"in_channels": 12, "image_dim": TINY_IMAGE_DIM,
                                                      "added_kv_proj_dim": 32}),
}


def tiny_config(shape_class: str) -> dict[str, Any]:
    config = {**_COMMON, **SHAPE_CLASSES[shape_class][1]}
    if shape_class == "animate":
        config["motion_encoder_channel_sizes"] = _motion_channels()
    return config


def build_tiny_variant(shape_class: str, seed: int = 0):
    """A seeded tiny transformer of the shape class, fp32, eval mode."""
    import diffusers

    torch.manual_seed(seed)
    model = getattr(diffusers, SHAPE_CLASSES[shape_class][0])(**tiny_config(shape_class))
    return randomize_(model, seed).eval()


def forward_inputs(shape_class: str, seed: int = 0) -> dict[str, Any]:
    """One forward pass's inputs: 2 latent frames of 4x6 (Animate: 2 + its reference frame), 8 text tokens."""
    config = tiny_config(shape_class)
    generator = torch.Generator().manual_seed(seed)
    frames = 3 if shape_class == "animate" else 2
    inputs: dict[str, Any] = {
        "hidden_states": torch.randn(1, config["in_channels"], frames, 4, 6, generator=generator),
        "encoder_hidden_states": torch.randn(1, TINY_TEXT_LENGTH, TINY_TEXT_DIM, generator=generator),
        "timestep": torch.tensor([500]),
    }
    if config.get("image_dim"):
        inputs["encoder_hidden_states_image"] = torch.randn(1, TINY_IMAGE_TOKENS, TINY_IMAGE_DIM, generator=generator)
    if shape_class == "vace":
        inputs["control_hidden_states"] = torch.randn(1, TINY_VACE_IN, 2, 4, 6, generator=generator)
    if shape_class == "animate":
        inputs["pose_hidden_states"] = torch.randn(1, 4, 2, 4, 6, generator=generator)
        inputs["face_pixel_values"] = torch.randn(1, 3, 2, 512, 512, generator=generator)
    if shape_class == "skyreels-df":
        inputs["fps"] = [0]
    return inputs


if __name__ == "__main__":
    for name in SHAPE_CLASSES:
        model = build_tiny_variant(name)
        with torch.no_grad():
            out = model(**forward_inputs(name)).sample
        print(f"{name:13s} keys={len(model.state_dict()):4d} out={tuple(out.shape)}")
