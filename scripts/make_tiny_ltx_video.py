"""Build a tiny but complete LTX-Video pipeline folder, fully offline (tests, README, benchmark set-up).

    python scripts/make_tiny_ltx_video.py OUT --layout 2b --vae 0.9.1 --seed 0
    python scripts/make_tiny_ltx_video.py OUT --layout 13b

OUT is what ``save_pretrained`` of ``LTXPipeline`` (2B layout) or ``LTXConditionPipeline`` (13B layout, as 0.9.7 and
0.9.8 ship) writes: the real Diffusers and transformers classes at toy sizes, every tensor seeded noise (so a swapped
name shows), the T5 encoder and tokenizer of make_tiny_cogvideox.py, and the scheduler settings of the version.

Layouts: ``2b`` is the 2B's shape class (64-wide attention heads, the default), ``13b`` the 13B's (128-wide heads);
both tiny. VAE versions: the three original VAE layouts (``0.9.0``, ``0.9.1``, ``0.9.5`` = 0.9.5 and later), each
with its version's block structure (the block counts the key maps regroup) at toy widths; 13B comes with 0.9.5.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cogvideox_tiny_configs import TINY_TEXT_EMBED_DIM  # noqa: E402
from tiny_models import (TINY_TEXT_LENGTH, build_text_encoder, build_tokenizer, pipeline_command,  # noqa: E402
                         randomize_)

LAYOUTS = ("2b", "13b")
VAE_VERSIONS = ("0.9.0", "0.9.1", "0.9.5")
LATENT_CHANNELS = 8
# The width the 0.9.5-and-later tiny VAE's encoder ends at: Diffusers' single-file converter recognises that VAE by
# its real width (2048), which the tests' judge is told instead (tests/ltx_video_fixtures.py).
TINY_095_ENCODER_WIDTH = 128
DYNAMIC_SHIFT = dict(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024,
                     max_image_seq_len=4096, shift_terminal=0.1)


def tiny_transformer_config(layout: str = "2b", num_layers: int = 2) -> dict[str, Any]:
    heads, head_dim = {"2b": (2, 8), "13b": (1, 128)}[layout]
    return dict(in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, num_attention_heads=heads,
                attention_head_dim=head_dim, cross_attention_dim=heads * head_dim, num_layers=num_layers,
                caption_channels=TINY_TEXT_EMBED_DIM)


def tiny_vae_config(version: str = "0.9.5") -> dict[str, Any]:
    """The version's block structure (as its full config, docs 3.4) with one residual block per stage, toy widths."""
    if version == "0.9.0":
        return dict(block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(8, 16, 32, 32),
                    layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1),
                    latent_channels=LATENT_CHANNELS)
    if version == "0.9.1":
        return dict(block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(16, 32, 64),
                    layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                    decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(True, True, True, False),
                    upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=True,
                    latent_channels=LATENT_CHANNELS)
    if version == "0.9.5":
        return dict(block_out_channels=(8, 16, 32, 64, TINY_095_ENCODER_WIDTH),
                    down_block_types=("LTXVideo095DownBlock3D",) * 4, decoder_block_out_channels=(16, 32, 64),
                    layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
                    spatio_temporal_scaling=(True,) * 4, decoder_spatio_temporal_scaling=(True, True, True),
                    decoder_inject_noise=(False,) * 4,
                    downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                    upsample_residual=(True, True, True), upsample_factor=(2, 2, 2), timestep_conditioning=True,
                    latent_channels=LATENT_CHANNELS, spatial_compression_ratio=32, temporal_compression_ratio=8)
    raise ValueError(f"unknown VAE version {version!r}; one of {', '.join(VAE_VERSIONS)}")


def build_transformer(layout: str = "2b", seed: int = 0, num_layers: int = 2):
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(seed)
    return randomize_(LTXVideoTransformer3DModel(**tiny_transformer_config(layout, num_layers)), seed).eval()


def build_vae(version: str = "0.9.5", seed: int = 0):
    from diffusers import AutoencoderKLLTXVideo

    torch.manual_seed(seed)
    vae = randomize_(AutoencoderKLLTXVideo(**tiny_vae_config(version)), seed + 1)
    with torch.no_grad():  # latent statistics a decoder can divide by, and the real timestep scale
        vae.latents_std.abs_().add_(0.5)
        if getattr(vae.decoder, "timestep_scale_multiplier", None) is not None:
            vae.decoder.timestep_scale_multiplier.fill_(1000.0)
    return vae.eval()


def build_scheduler(version: str):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**(DYNAMIC_SHIFT if version in ("0.9.0", "0.9.1") else
                                              {"use_dynamic_shifting": False}))


def pipeline_class_name(layout: str) -> str:
    return "LTXConditionPipeline" if layout == "13b" else "LTXPipeline"


def build_tiny_pipeline(layout: str = "2b", version: str = "0.9.5", seed: int = 0):
    import diffusers

    if layout == "13b" and version != "0.9.5":
        raise ValueError("the 13B releases (0.9.7, 0.9.8) have the 0.9.5-and-later VAE")
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    return getattr(diffusers, pipeline_class_name(layout))(
        tokenizer=tokenizer, text_encoder=build_text_encoder(len(tokenizer), TINY_TEXT_EMBED_DIM),
        vae=build_vae(version, seed),
        transformer=build_transformer(layout, seed), scheduler=build_scheduler(version))


def render(folder: str | os.PathLike, steps: int = 2, seed: int = 0):
    """Load FOLDER with its own pipeline class and render 9 frames at 64x64: the frames as PIL images."""
    import json

    import diffusers

    name = json.loads((Path(folder) / "model_index.json").read_text())["_class_name"]
    pipeline = getattr(diffusers, name).from_pretrained(str(folder))
    pipeline.set_progress_bar_config(disable=True)
    return pipeline(prompt="a panda playing a guitar", height=64, width=64, num_frames=9, num_inference_steps=steps,
                    max_sequence_length=TINY_TEXT_LENGTH, generator=torch.Generator().manual_seed(seed),
                    output_type="pil").frames[0]


main = pipeline_command(
    build_tiny_pipeline, "LTX-Video",
    click.option("--layout", type=click.Choice(LAYOUTS), default="2b", show_default=True),
    click.option("--vae", "version", type=click.Choice(VAE_VERSIONS), default="0.9.5", show_default=True))


if __name__ == "__main__":
    main()
