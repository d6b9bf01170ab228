"""SanaVideo inputs for tests: tiny models built by Diffusers' SanaVideoTransformer3DModel, NVlabs' release layout
written independently of the key maps (scripts/make_tiny_sana_video.py), and fine-tunes trained under FSDP2 with DCP
saves and under DeepSpeed ZeRO (scripts/finetune_tiny_sana_video.py), made once and cached."""

from __future__ import annotations

import sys

import torch
from fixtures import SCRIPTS, DeepSpeedFixture, GroundTruth, cached_fixture

sys.path.insert(0, str(SCRIPTS))
from make_tiny_sana_video import (RELEASE, SAFETENSORS_COPY, build_tiny_pipeline,  # noqa: E402,F401
                                  build_transformer, release_buffers, release_state_dict, tiny_config, write_release)

_FINETUNE_SCRIPTS = ("finetune_tiny_sana_video.py", "make_tiny_sana_video.py", "tiny_models.py", "tiny_training.py",
                     "deepspeed_cpu.py", "make_deepspeed_checkpoint.py")


def dcp_finetune(world_size: int = 2) -> GroundTruth:
    """OUT/run/checkpoint (the last step's DCP save) and the full state dict gathered in training."""
    command = [str(SCRIPTS / "finetune_tiny_sana_video.py"), "--world-size", str(world_size)]
    return GroundTruth(cached_fixture(f"sana-video-dcp-ws{world_size}", _FINETUNE_SCRIPTS, command))


def deepspeed_finetune(stage: int = 2, dtype: str = "bf16", world_size: int = 2) -> DeepSpeedFixture:
    """OUT/checkpoint (DeepSpeed's save dir) and every trainable parameter's fp32 master taken in training."""
    command = [str(SCRIPTS / "finetune_tiny_sana_video.py"), "--writer", "deepspeed", "--stage", str(stage),
               "--dtype", dtype, "--world-size", str(world_size)]
    name = f"sana-video-deepspeed-zero{stage}-{dtype}-ws{world_size}"
    return DeepSpeedFixture(cached_fixture(name, _FINETUNE_SCRIPTS, command))


def forward_inputs(model, seed: int = 0) -> dict:
    """Inputs that reach every module: latents of two frames, a caption with a padded token, a timestep."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    return dict(hidden_states=torch.randn(1, config.in_channels, 2, 4, 4, generator=generator),
                encoder_hidden_states=torch.randn(1, 5, config.caption_channels, generator=generator),
                encoder_attention_mask=torch.tensor([[1, 1, 1, 1, 0]]), timestep=torch.tensor([500.0]))


def build_720p_pipeline(seed: int = 0):
    """A tiny SanaVideoPipeline over LTX-2's video VAE, as the 720p release's pipeline is (Diffusers' conversion
    script's --vae_type ltx2): the transformer patched (1, 1, 1) over the VAE's latent channels, the VAE at the sizes of
    the LTX-2 repository's tiny release (make_tiny_ltx2.py's release layout), every tensor seeded noise."""
    from diffusers import AutoencoderKLLTX2Video, DPMSolverMultistepScheduler, SanaVideoPipeline
    from make_tiny_ltx2 import vae_config
    from make_tiny_sana_video import build_gemma_text_encoder, build_gemma_tokenizer
    from tiny_models import randomize_

    torch.manual_seed(seed)
    vae = randomize_(AutoencoderKLLTX2Video(**vae_config("release")), seed).eval()
    with torch.no_grad():
        vae.latents_std.abs_().add_(0.5)  # a scale, positive
    channels = vae.config.latent_channels
    tokenizer = build_gemma_tokenizer()
    scheduler = DPMSolverMultistepScheduler(flow_shift=8.0, use_flow_sigmas=True, prediction_type="flow_prediction")
    return SanaVideoPipeline(tokenizer=tokenizer, text_encoder=build_gemma_text_encoder(len(tokenizer)), vae=vae,
                             transformer=build_transformer(seed, in_channels=channels, out_channels=channels,
                                                           patch_size=(1, 1, 1), sample_size=22),
                             scheduler=scheduler)
