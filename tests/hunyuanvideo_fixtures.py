"""HunyuanVideo inputs for tests: tiny models of each shape class, release-layout files written with torch.save,
tiny pipeline folders and an original-layout fine-tune trained under real DeepSpeed (cached like the other fixtures),
and Diffusers' own converter as the judge."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from cogvideox_fixtures import config_folder  # noqa: F401
from fixtures import SCRIPTS, DeepSpeedFixture, cached_fixture

sys.path.insert(0, str(SCRIPTS))
from hunyuanvideo_tiny import (MODEL_TYPE, SHAPE_CLASSES, build_tiny_transformer, judge,  # noqa: E402,F401
                               original_shapes, random_original_state_dict, tiny_config)
from make_tiny_hunyuanvideo import TINY_PROMPT_TEMPLATE, build_vae  # noqa: E402,F401

HIDDEN = tiny_config("t2v")["num_attention_heads"] * tiny_config("t2v")["attention_head_dim"]
MODEL_STATES = "mp_rank_00_model_states.pt"


def diffusers_judge(original: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers' single-file conversion of tiny original-layout weights."""
    return judge(original, HIDDEN)


def release_file(folder: Path, module: dict, **entries) -> Path:
    """A release-layout transformers/mp_rank_00_model_states.pt: {"module": ...} plus any other entries (ema);
    ``module=None`` writes the bare state dict FastVideo saves under that name (pass it in ``entries``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_STATES
    torch.save({"module": module, **entries} if module is not None else entries, path)
    return path


def tiny_pipeline(shape_class: str) -> Path:
    """A complete tiny HunyuanVideo pipeline folder of this shape class (seed 0), made once."""
    scripts = ("make_tiny_hunyuanvideo.py", "hunyuanvideo_tiny.py", "tiny_models.py")
    return cached_fixture(f"hunyuanvideo-pipeline-{shape_class}", scripts,
                          [str(SCRIPTS / "make_tiny_hunyuanvideo.py"), "--shape-class", shape_class])


class FinetuneFixture(DeepSpeedFixture):
    """A tiny original-layout HunyuanVideo transformer trained two steps under DeepSpeed, with its EMA."""
    def masters(self) -> dict[str, torch.Tensor]:
        return {name: self.tensors[name] for name in self.truth["trainable"]}

    def ema(self) -> dict[str, torch.Tensor]:
        return {name[len("ema/"):]: t for name, t in self.tensors.items() if name.startswith("ema/")}


def finetune(stage: int = 2, world_size: int = 2, dtype: str = "bf16") -> FinetuneFixture:
    scripts = ("finetune_tiny_hunyuanvideo.py", "hunyuanvideo_tiny.py", "tiny_models.py", "deepspeed_cpu.py",
               "make_deepspeed_checkpoint.py", "tiny_training.py")
    command = [str(SCRIPTS / "finetune_tiny_hunyuanvideo.py"), "--stage", str(stage), "--world-size",
               str(world_size), "--dtype", dtype]
    return FinetuneFixture(cached_fixture(f"hunyuanvideo-finetune-zero{stage}-ws{world_size}-{dtype}", scripts,
                                          command))
