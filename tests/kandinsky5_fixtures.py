"""Kandinsky 5 inputs for tests: tiny models built by Diffusers' Kandinsky5Transformer3DModel (whose names are the
release's; kandinsky5_tiny.original_shapes writes the kandinsky-5 repo's names out independently), release files (the
state dict in one safetensors file, as kandinskylab ships it), tiny pipeline folders and fine-tunes trained under real
DeepSpeed and FSDP2, cached like the other fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from cogvideox_fixtures import config_folder  # noqa: F401
from fixtures import SCRIPTS, DeepSpeedFixture, GroundTruth, cached_fixture
from safetensors.torch import save_file

sys.path.insert(0, str(SCRIPTS))
from kandinsky5_tiny import (MODEL_TYPE, SHAPE_CLASSES, build_tiny_transformer, original_shapes,  # noqa: E402,F401
                             tiny_config)
from make_tiny_kandinsky5 import tiny_text_settings  # noqa: E402,F401

RELEASE_FILE = "kandinsky5lite_t2v_sft_5s.safetensors"
_PIPELINE_SCRIPTS = ("make_tiny_kandinsky5.py", "kandinsky5_tiny.py", "make_tiny_hunyuanvideo.py",
                     "hunyuanvideo_tiny.py", "make_tiny_hunyuanvideo15.py", "hunyuanvideo15_tiny.py", "tiny_models.py")
_FINETUNE_SCRIPTS = ("finetune_tiny_kandinsky5.py", "kandinsky5_tiny.py", "tiny_models.py", "deepspeed_cpu.py",
                     "make_deepspeed_checkpoint.py", "tiny_training.py")


def release_file(folder: Path, weights: dict[str, torch.Tensor]) -> Path:
    """The release layout: model/<name>.safetensors, the repo's state dict without a config beside it."""
    path = folder / "model" / RELEASE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, path)
    return path


def tiny_pipeline(shape_class: str) -> Path:
    return cached_fixture(f"kandinsky5-pipeline-{shape_class}", _PIPELINE_SCRIPTS,
                          [str(SCRIPTS / "make_tiny_kandinsky5.py"), "--shape-class", shape_class])


class FinetuneFixture(DeepSpeedFixture):
    def masters(self) -> dict[str, torch.Tensor]:
        return {name: self.tensors[name] for name in self.truth["trainable"]}


def deepspeed_finetune(stage: int = 2, world_size: int = 2, dtype: str = "fp32") -> FinetuneFixture:
    command = [str(SCRIPTS / "finetune_tiny_kandinsky5.py"), "--writer", "deepspeed", "--stage", str(stage),
               "--world-size", str(world_size), "--dtype", dtype]
    return FinetuneFixture(cached_fixture(f"kandinsky5-finetune-zero{stage}-ws{world_size}-{dtype}",
                                          _FINETUNE_SCRIPTS, command))


def dcp_finetune(world_size: int = 2) -> GroundTruth:
    command = [str(SCRIPTS / "finetune_tiny_kandinsky5.py"), "--writer", "dcp", "--world-size", str(world_size)]
    return GroundTruth(cached_fixture(f"kandinsky5-dcp-ws{world_size}", _FINETUNE_SCRIPTS, command))
