"""LTX-2 full fine-tunes of the transformer, as Diffusers-based trainers save them: real DeepSpeed ZeRO (stages 2 and
3, the fp32 masters of a bf16 run) and FSDP2 runs saved with torch.distributed.checkpoint (a plain dcp.save and
torchtitan's layout), each exported exactly: every tensor equals the ground truth taken inside the training process,
into a Diffusers transformer, a pipeline that loads, and the release single file."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import component_weights
from ltx2_fixtures import finetune
from safetensors.torch import load_file

WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_finetune_exports_the_fp32_masters(stage, tmp_path, cli):
    run = finetune("deepspeed", stage)
    result = cli(run.checkpoint, tmp_path / "out", "--base", run.base, "--component", "transformer", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / WEIGHTS)
    assert set(written) == set(run.truth["order"]) and run.truth["trainable"] and not run.truth["frozen"]
    for name in run.truth["trainable"]:
        assert torch.equal(written[name], run.tensors[name]), name
    base = component_weights(run.base, "transformer")
    assert any(not torch.equal(written[name], base[name]) for name in base), "training changed the weights"


@pytest.mark.parametrize("writer, checkpoint", [("plain", "run/checkpoint"), ("torchtitan", "run/checkpoint/step-2")])
def test_dcp_finetune_exports_exactly(writer, checkpoint, tmp_path, cli):
    run = finetune(writer)
    assert run.truth["checkpoint"] == checkpoint
    result = cli(run.root / checkpoint, tmp_path / "out", "--base", run.base, "--component", "transformer",
                 "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / WEIGHTS)
    assert set(written) == set(run.truth["order"])
    for name in run.truth["order"]:
        assert torch.equal(written[name], run.tensors[name]), name
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_layers"] == run.truth["config"]["num_layers"]


def test_a_finetune_becomes_a_release_file_with_every_model(tmp_path, cli):
    """The fine-tune into a whole pipeline (the other models from --base), then into the release's single file:
    the transformer is the run's bf16 cast (norm_q / norm_k kept fp32), every other model the base's."""
    run = finetune("deepspeed", 3)
    assert cli(run.checkpoint, tmp_path / "pipeline", "--base", run.base).exit_code == 0
    result = cli(tmp_path / "pipeline", tmp_path / "release", "--to", "original")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "release" / "ltx-2.safetensors")
    assert {name.split(".")[0] for name in written} == {"model", "text_embedding_projection", "vae", "audio_vae",
                                                        "vocoder"}
    q_norm = "model.diffusion_model.transformer_blocks.0.attn1.q_norm.weight"
    assert written[q_norm].dtype == torch.float32 and \
        torch.equal(written[q_norm], run.tensors["transformer_blocks.0.attn1.norm_q.weight"])
    proj = "model.diffusion_model.patchify_proj.weight"
    assert torch.equal(written[proj], run.tensors["proj_in.weight"].to(torch.bfloat16))
