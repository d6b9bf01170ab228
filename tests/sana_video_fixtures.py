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
