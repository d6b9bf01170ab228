"""Full fine-tunes of Wan's variants, two steps on CPU ranks, exported exactly: the export is the weights taken inside
training (DeepSpeed's fp32 masters, or the FSDP2 model's full state dict), for Wan VACE trained in the original names
as DiffSynth-Studio and musubi-tuner train it (judged by Diffusers' converter reading the masters), for Wan Animate in
Diffusers' names under ZeRO-3, and for SkyReels-V2 and Wan Animate under FSDP2 saved with
torch.distributed.checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from wan_fixtures import weights
from wan_variants_fixtures import judged, variant_finetune

from cogexport.exporter import export_original


def assert_exact(written: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(written) == set(expected)
    for name, tensor in expected.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name


def test_vace_finetune_in_original_names_exports_the_fp32_masters(tmp_path, cli):
    run = variant_finetune("vace", "--trainer", "deepspeed", "--names", "original", "--stage", "2")
    assert run.truth["frozen"] == [] and len(run.truth["trainable"]) == len(run.tensors)
    assert "vace_blocks.0.before_proj.weight" in run.tensors  # VaceWanModel's names
    result = cli(run.checkpoint, tmp_path / "out", "--base", run.base, "--component", "transformer", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = weights(tmp_path / "out")
    assert_exact(written, judged(run.tensors))
    base = weights(run.base / "transformer")
    assert all(not torch.equal(base[name], written[name]) for name in written)  # it did train
    export_original(tmp_path / "out", tmp_path / "original", dtype="fp32")
    assert_exact(weights(tmp_path / "original"), run.tensors)


def test_animate_finetune_under_zero3_exports_the_fp32_masters(tmp_path, cli):
    run = variant_finetune("animate", "--trainer", "deepspeed", "--names", "diffusers", "--stage", "3")
    assert len(run.truth["trainable"]) == len(run.tensors)
    result = cli(run.checkpoint, tmp_path / "out", "--base", run.base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_exact(weights(tmp_path / "out" / "transformer"), run.tensors)
    # the pipeline's other parts come from --base; the transformer is the fine-tune
    assert json.loads((tmp_path / "out" / "model_index.json").read_text())["_class_name"] == "WanAnimatePipeline"


@pytest.mark.parametrize("variant", ["skyreels-df", "animate"])
def test_fsdp2_dcp_finetune_exports_the_trained_weights(variant, tmp_path, cli):
    run = variant_finetune(variant, "--trainer", "dcp")
    result = cli(run.root / "run", tmp_path / "out", "--base", run.base, "--component", "transformer", "--dtype",
                 "fp32")
    assert result.exit_code == 0, result.stderr
    assert_exact(weights(tmp_path / "out"), run.tensors)
    checked = cli("verify", tmp_path / "out", "--against", run.root / "run")
    assert checked.exit_code == 0, checked.stdout + checked.stderr
