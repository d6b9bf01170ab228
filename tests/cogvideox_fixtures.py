"""CogVideoX inputs for tests: SAT runs written by the independent Diffusers-to-SAT writer in scripts/, tiny base
folders, and fine-tunes trained under real DeepSpeed (cached like the other DeepSpeed fixtures)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from fixtures import SCRIPTS, DeepSpeedFixture, cached_fixture

sys.path.insert(0, str(SCRIPTS))
from cogvideox_tiny_configs import (VARIANTS, build_tiny_transformer, build_tiny_vae,  # noqa: E402,F401
                                    tiny_transformer_config, transformer_forward_inputs)
from make_sat_checkpoint import (diffusers_to_sat_transformer, diffusers_to_sat_vae,  # noqa: E402,F401
                                 num_vae_up_blocks, write_sat_run, write_sat_vae)

TINY_PIPELINE_VARIANT = {"t2v": "2b", "i2v": "5b-i2v"}  # what make_tiny_cogvideox.py builds for each model type


def config_folder(path: Path, model: torch.nn.Module) -> Path:
    """A --base model folder holding just the config.json of ``model``."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_config(path)
    return path


def tiny_pipeline(model_type: str) -> Path:
    """A complete tiny CogVideoX pipeline folder (seed 0), made once."""
    scripts = ("make_tiny_cogvideox.py", "cogvideox_tiny_configs.py", "tiny_models.py")
    return cached_fixture(f"tiny-pipeline-{model_type}", scripts,
                          [str(SCRIPTS / "make_tiny_cogvideox.py"), "--variant", model_type])


def finetune(model_type: str, stage: int, world_size: int, dtype: str = "bf16", lora_rank: int | None = None,
             steps: int = 2) -> DeepSpeedFixture:
    """A tiny CogVideoX transformer fine-tuned under real DeepSpeed, in CogVideo finetune/'s layout
    (OUT/checkpoint-STEPS), with the base pipeline it started from."""
    base = tiny_pipeline(model_type)
    scripts = ("finetune_tiny_cogvideox.py", "make_tiny_cogvideox.py", "cogvideox_tiny_configs.py", "tiny_models.py",
               "deepspeed_cpu.py", "make_deepspeed_checkpoint.py", "tiny_training.py")
    name = f"finetune-{model_type}-zero{stage}-ws{world_size}-{dtype}" + (f"-lora{lora_rank}" if lora_rank else "")
    command = [str(SCRIPTS / "finetune_tiny_cogvideox.py"), str(base), "--stage", str(stage), "--world-size",
               str(world_size), "--dtype", dtype, "--steps", str(steps)]
    if lora_rank:
        command += ["--lora-rank", str(lora_rank)]
    return DeepSpeedFixture(cached_fixture(name, scripts, command), base, f"checkpoint-{steps}")
