"""DeepSpeed AutoTP (tensor parallelism) + ZeRO checkpoints read as the whole model.

A tiny CogVideoX transformer trained under real DeepSpeed on CPU ranks (scripts/make_autotp_checkpoint.py): AutoTP 2
x data parallel 2 under ZeRO-3 (fp32) and ZeRO-2 (bf16). Ground truth is every parameter's full fp32 master, each TP
rank's share gathered and joined inside training by the kind of layer AutoTP made; DeepSpeed's own ds_to_universal
judges `universal`. A TP 2 run under ZeRO-1 whose per-head norms were left to drift apart is refused; the run's model
states rewritten without the affine map (as only the pattern lists) or with it damaged test the other paths.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from autotp_fixtures import autotp_run
from conftest import assert_refused, assert_same_tensors
from diffusers import CogVideoXTransformer3DModel
from safetensors.torch import load_file
from test_universal import param_value, run_ds_to_universal

from cogexport import consolidate, open_checkpoint
from cogexport.universal import universal

TAG = "global_step2"


@pytest.mark.parametrize("stage, dtype", [(3, "fp32"), (2, "bf16")])
def test_consolidate_equals_the_masters_joined_in_training(stage, dtype, tmp_path, cli):
    run = autotp_run(stage, dtype)
    assert run.truth["drifted"] == [] and run.truth["replicated"]
    consolidate(run.checkpoint, tmp_path / "out", dtype="fp32")
    assert_same_tensors(load_file(tmp_path / "out" / "model.safetensors"), run.tensors)
    facts = json.loads(cli("inspect", "--json", run.checkpoint).stdout)
    assert (facts["tensor_parallel"], facts["world_size"], facts["stage"]) == (2, 2, stage), facts


def test_export_to_diffusers_is_the_trained_model(tmp_path, cli):
    run = autotp_run(3, "fp32")
    result = cli(run.checkpoint, tmp_path / "out", "--base", run.base, "--component", "transformer", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    model = CogVideoXTransformer3DModel.from_pretrained(tmp_path / "out")
    assert_same_tensors(model.state_dict(), run.tensors)


def test_universal_equals_deepspeeds_own_converter(tmp_path, cli):
    run = autotp_run(3, "fp32")
    done = run_ds_to_universal(run.checkpoint / TAG, tmp_path / "theirs", inject=False)
    assert done.returncode == 0, done.stderr[-3000:]
    universal(run.checkpoint, tmp_path / "ours")
    for name in run.truth["trainable"]:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            ours, theirs = (torch.load(tmp_path / side / "zero" / name / f"{state}.pt", weights_only=False)
                            for side in ("ours", "theirs"))
            assert ours.keys() == theirs.keys() == {"param"}, name  # whole tensors, no cat_dim (AutoTP cuts them)
            assert torch.equal(ours["param"], theirs["param"]), f"{name}/{state}"
        assert torch.equal(param_value(tmp_path / "ours" / "zero" / name / "fp32.pt"), run.tensors[name].reshape(-1))
    for tp in (0, 1):  # each model-parallel rank resumes from its own model states
        source = (run.checkpoint / TAG / f"zero_pp_rank_0_mp_rank_{tp:02d}_model_states.pt").read_bytes()
        for name in (f"mp_rank_{tp:02d}_model_states.pt", f"zero_pp_rank_0_mp_rank_{tp:02d}_model_states.pt"):
            assert (tmp_path / "ours" / name).read_bytes() == source, name
    verified = cli("verify", tmp_path / "ours", "--against", run.checkpoint)
    assert verified.exit_code == 0 and "256 exact" in verified.stdout, verified.stdout + verified.stderr
    consolidate(tmp_path / "ours", tmp_path / "back", dtype="fp32")  # and read back as a checkpoint: the whole model
    assert_same_tensors(load_file(tmp_path / "back" / "model.safetensors"), run.tensors)


@pytest.mark.parametrize("removed, named", [
    ("*_mp_rank_01_*", "tensor-parallel rank 1 of 2 missing: expected zero_pp_rank_0_mp_rank_01_model_states.pt"),
    ("zero_pp_rank_1_mp_rank_01_optim_states.pt", "rank 1 of 2 missing: expected zero_pp_rank_1_mp_rank_01_optim"),
    ("zero_pp_rank_0_mp_rank_01_model_states.pt", "expected zero_pp_rank_0_mp_rank_01_model_states.pt"),
])
def test_a_missing_rank_file_is_named(removed, named, tmp_path, cli):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(autotp_run(3, "fp32").checkpoint, checkpoint)
    for path in (checkpoint / TAG).glob(removed):
        path.unlink()
    assert_refused(cli, tmp_path, ["consolidate", checkpoint, tmp_path / "out"], named)


def test_replicated_copies_trained_apart_are_refused(tmp_path, cli):
    # ZeRO-1, TP 2, no data parallelism; the per-head norms' gradients were not summed over the TP group
    run = autotp_run(1, "fp32", world_size=2, norm_allreduce=False)
    assert run.truth["drifted"], "the run must really have trained the copies apart"
    line = assert_refused(cli, tmp_path, ["consolidate", run.checkpoint, tmp_path / "out"],
                          "is held whole by every tensor-parallel rank", "grad_allreduce")
    assert any(name in line for name in run.truth["drifted"]), line
    with open_checkpoint(run.checkpoint) as checkpoint:  # what did not drift reads as the masters (ZeRO-1 + AutoTP)
        assert list(checkpoint) == run.truth["order"]
        assert_same_tensors({name: checkpoint[name].load() for name in run.tensors}, run.tensors)


def test_a_save_without_affine_maps_joins_by_the_pattern_lists(tmp_path):
    # The model states as a DeepSpeed that recorded only the categories saved them: the run's own files, each
    # rewritten under its own name without universal_checkpoint_info's affine_map (its pattern lists kept)
    run = autotp_run(3, "fp32")
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(run.checkpoint, checkpoint)
    for path in (checkpoint / TAG).glob("*_model_states.pt"):
        states = torch.load(path, weights_only=True)
        del states["universal_checkpoint_info"]["affine_map"]
        torch.save(states, path)
    assert run.truth["replicated"] and "affine_map" not in states["universal_checkpoint_info"]
    consolidate(checkpoint, tmp_path / "out", dtype="fp32")
    assert_same_tensors(load_file(tmp_path / "out" / "model.safetensors"), run.tensors)


def _to_q_map(ranks: dict) -> None:
    """Rank 1's share of block 0's to_q written over rank 0's (its source offset 0)."""
    ranks[1]["pieces"][0]["source"][0] = 0


def _to_q_shape(ranks: dict) -> None:
    ranks[1]["shard_shape"] = [16, 8]


@pytest.mark.parametrize("damage, named", [(_to_q_map, "covers 128 elements of 256"),
                                           (_to_q_shape, "gives rank 1 a share of (16, 8)")])
def test_a_damaged_affine_map_is_refused_before_anything_is_read(damage, named, tmp_path, cli):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(autotp_run(3, "fp32").checkpoint, checkpoint)
    path = checkpoint / TAG / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    states = torch.load(path, weights_only=True)
    maps = states["universal_checkpoint_info"]["affine_map"]["params"]
    damage(maps[r"^transformer_blocks\.0\.attn1\.to_q\.weight$"]["ranks"])
    torch.save(states, path)
    assert_refused(cli, tmp_path, ["consolidate", checkpoint, tmp_path / "out"],
                   "transformer_blocks.0.attn1.to_q.weight", named, "cannot join")
