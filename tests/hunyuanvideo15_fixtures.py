"""HunyuanVideo 1.5 inputs for tests: the original-code fixture (../shared/fixtures/hunyuanvideo15: Tencent's own model
class at a tiny size, and what Diffusers' conversion script makes of it), tiny models of each shape class, release-
layout folders, tiny pipeline folders and fine-tunes trained under real DeepSpeed and FSDP2 (cached like the other
fixtures), and the conversion script's facts (hunyuanvideo15_tiny) as the judge of the sizes the fixture lacks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from cogvideox_fixtures import config_folder  # noqa: F401
from fixtures import ROOT, SCRIPTS, DeepSpeedFixture, GroundTruth, cached_fixture
from safetensors.torch import save_file

sys.path.insert(0, str(SCRIPTS))
from hunyuanvideo15_tiny import (MODEL_TYPE, SHAPE_CLASSES, build_tiny_transformer,  # noqa: E402,F401
                                 original_shapes, original_vae_state_dict, random_original_state_dict,
                                 reference_to_diffusers, reference_vae_to_diffusers, tiny_config)
from make_tiny_hunyuanvideo15 import build_vae, tiny_text_settings  # noqa: E402,F401

# COGEXPORT_SHARED, else ../shared beside the main checkout (a worktree, wt/<name>, is one level deeper)
SHARED = Path(os.environ.get("COGEXPORT_SHARED") or next(
    (root / "shared" for root in (ROOT.parent, ROOT.parent.parent) if (root / "shared" / "fixtures").is_dir()),
    ROOT.parent / "shared"))
ORIGINAL_CODE = SHARED / "fixtures" / "hunyuanvideo15"
FIXTURE_RELEASE = ORIGINAL_CODE / "original" / "transformer" / "480p_t2v"
FIXTURE_TRUTH = ORIGINAL_CODE / "base" / "transformer"
WEIGHTS = "diffusion_pytorch_model.safetensors"
SCRIPTS_USED = ("make_tiny_hunyuanvideo15.py", "hunyuanvideo15_tiny.py", "tiny_models.py")


def original_code() -> Path:
    """The original-code fixture's folder (skips the test when the shared fixtures are not there)."""
    if not (ORIGINAL_CODE / "original").is_dir():
        import pytest

        pytest.skip(f"the HunyuanVideo 1.5 original-code fixture is not at {ORIGINAL_CODE} (set COGEXPORT_SHARED)")
    return ORIGINAL_CODE


def release_folder(folder: Path, weights: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    """A release-layout transformer/<variant>/ folder: the original weights, and with ``config`` (a Diffusers config)
    the original config.json the release keeps beside them."""
    from cogexport.models.hunyuanvideo15 import original_config

    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, folder / WEIGHTS, metadata={"format": "pt"})
    if config is not None:
        (folder / "config.json").write_text(json.dumps(original_config(config, config.get("task_type"))))
    return folder


def tiny_pipeline(shape_class: str) -> Path:
    """A complete tiny HunyuanVideo 1.5 pipeline folder of this shape class (seed 0), made once."""
    return cached_fixture(f"hunyuanvideo15-pipeline-{shape_class}", SCRIPTS_USED,
                          [str(SCRIPTS / "make_tiny_hunyuanvideo15.py"), "--shape-class", shape_class])


_FINETUNE_SCRIPTS = ("finetune_tiny_hunyuanvideo15.py", "hunyuanvideo15_tiny.py", "tiny_models.py",
                     "deepspeed_cpu.py", "make_deepspeed_checkpoint.py", "tiny_training.py")


class FinetuneFixture(DeepSpeedFixture):
    """A tiny original-layout HunyuanVideo 1.5 transformer trained two steps under DeepSpeed."""

    def masters(self) -> dict[str, torch.Tensor]:
        return {name: self.tensors[name] for name in self.truth["trainable"]}


def deepspeed_finetune(stage: int = 2, world_size: int = 2, dtype: str = "bf16") -> FinetuneFixture:
    command = [str(SCRIPTS / "finetune_tiny_hunyuanvideo15.py"), "--writer", "deepspeed", "--stage", str(stage),
               "--world-size", str(world_size), "--dtype", dtype]
    return FinetuneFixture(cached_fixture(f"hunyuanvideo15-finetune-zero{stage}-ws{world_size}-{dtype}",
                                          _FINETUNE_SCRIPTS, command))


def dcp_finetune(world_size: int = 2) -> GroundTruth:
    """A tiny Diffusers-named HunyuanVideo 1.5 transformer trained two steps under FSDP2, saved with dcp.save
    (root/run/checkpoint), with its full state dict as the ground truth."""
    command = [str(SCRIPTS / "finetune_tiny_hunyuanvideo15.py"), "--writer", "dcp", "--world-size", str(world_size)]
    return GroundTruth(cached_fixture(f"hunyuanvideo15-dcp-ws{world_size}", _FINETUNE_SCRIPTS, command))
