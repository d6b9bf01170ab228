"""LTX-Video inputs for tests: tiny pipeline folders of each shape class and VAE version (made once, cached), and
Diffusers' own single-file converters as the judges, with the one constant that does not hold at tiny sizes told."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from fixtures import SCRIPTS, DeepSpeedFixture, cached_fixture

sys.path.insert(0, str(SCRIPTS))
from make_tiny_ltx_video import TINY_095_ENCODER_WIDTH  # noqa: E402

PIPELINE_SCRIPTS = ("make_tiny_ltx_video.py", "cogvideox_tiny_configs.py", "tiny_models.py")
# (layout, VAE version): every shape class and VAE layout the releases have
SHAPE_CLASSES = [("2b", "0.9.0"), ("2b", "0.9.1"), ("2b", "0.9.5"), ("13b", "0.9.5")]


def tiny_pipeline(layout: str = "2b", version: str = "0.9.5") -> Path:
    """A tiny LTX-Video pipeline folder (seed 0), made once."""
    return cached_fixture(f"tiny-ltx-{layout}-{version}", PIPELINE_SCRIPTS,
                          [str(SCRIPTS / "make_tiny_ltx_video.py"), "--layout", layout, "--vae", version])


def judge_transformer(checkpoint: dict) -> dict:
    """Diffusers' single-file conversion of an LTX-Video transformer, as from_single_file runs it."""
    from diffusers.loaders.single_file_utils import convert_ltx_transformer_checkpoint_to_diffusers

    return convert_ltx_transformer_checkpoint_to_diffusers(dict(checkpoint))


def judge_vae(checkpoint: dict) -> dict:
    """Diffusers' single-file conversion of an LTX-Video VAE, run from its own source with one constant changed: it
    tells the 0.9.5-and-later VAE by its encoder's last width, 2048, which the tiny VAE has as
    TINY_095_ENCODER_WIDTH. Everything else is the judge's own code."""
    import diffusers.loaders.single_file_utils as single_file_utils

    source = inspect.getsource(single_file_utils.convert_ltx_vae_checkpoint_to_diffusers)
    assert source.count("== 2048") == 1, "Diffusers' LTX VAE converter changed; revisit the judge"
    namespace: dict = {}
    exec(source.replace("== 2048", f"== {TINY_095_ENCODER_WIDTH}"), vars(single_file_utils), namespace)
    return namespace["convert_ltx_vae_checkpoint_to_diffusers"](dict(checkpoint))


def finetune(stage: int = 2, world_size: int = 2, dtype: str = "bf16") -> DeepSpeedFixture:
    """A tiny LTX-Video transformer fine-tuned under real DeepSpeed (Diffusers names), with its base pipeline."""
    base = tiny_pipeline("2b", "0.9.5")
    scripts = ("finetune_tiny_ltx_video.py", *PIPELINE_SCRIPTS, "deepspeed_cpu.py", "make_deepspeed_checkpoint.py",
               "tiny_training.py")
    command = [str(SCRIPTS / "finetune_tiny_ltx_video.py"), str(base), "--stage", str(stage), "--world-size",
               str(world_size), "--dtype", dtype]
    return DeepSpeedFixture(cached_fixture(f"finetune-ltx-zero{stage}-ws{world_size}-{dtype}", scripts, command), base)
