"""Universal checkpoints: real DeepSpeed resumes them at another world size with every fp32 master and optimizer
state equal to the original, the same loss, and training that goes on; the output matches DeepSpeed's own
ds_to_universal where that tool works, and works where it does not."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import leftovers, snapshot
from fixtures import SCRIPTS, DeepSpeedVariant, GroundTruth, deepspeed_checkpoint, run_rank_script

from cogexport.checkpoint import open_checkpoint
from cogexport.errors import CogExportError
from cogexport.universal import universal

RESUMES = [
    *(pytest.param(DeepSpeedVariant(stage, dtype, saved), resumed, stage, id=f"zero{stage}-{dtype}-ws{saved}to{resumed}")
      for stage in (1, 2, 3) for dtype in ("bf16", "fp32") for saved, resumed in ((2, 3), (3, 2))),
    pytest.param(DeepSpeedVariant(1, "bf16", 2, bf16_optimizer=True), 3, 1, id="bf16optimizer-ws2to3"),
    pytest.param(DeepSpeedVariant(2, "bf16", 2, optimizer="sgd"), 3, 2, id="zero2-sgd-momentum-ws2to3"),
    # One layout for every stage, so a run can also change stage (fp32: a bf16 forward differs between stages):
    pytest.param(DeepSpeedVariant(2, "fp32", 2), 3, 3, id="zero2-fp32-ws2-to-zero3-ws3"),
    pytest.param(DeepSpeedVariant(3, "fp32", 3), 2, 1, id="zero3-fp32-ws3-to-zero1-ws2"),
    # A sub-group per parameter: side.bias (3 elements) leaves each of 3 ranks a one-element partition.
    pytest.param(DeepSpeedVariant(3, "bf16", 3, sub_group_size=1), 2, 3, id="zero3-one-element-partitions-ws3to2"),
]


def resume(load_dir: Path, variant: DeepSpeedVariant, world_size: int, stage: int, out: Path) -> GroundTruth:
    """Load the universal checkpoint in ``load_dir`` under real DeepSpeed at ``world_size`` ranks and ``stage``."""
    command = [sys.executable, str(SCRIPTS / "resume_universal.py"), str(load_dir), str(out), "--stage",
               str(stage), "--dtype", variant.dtype, "--world-size", str(world_size), "--optimizer",
               variant.optimizer] + (["--bf16-optimizer"] if variant.bf16_optimizer else [])
    done = run_rank_script(command, out, {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-4000:]
    return GroundTruth(out, "resumed")


@pytest.mark.parametrize("variant, resumed_world_size, resumed_stage", RESUMES)
def test_deepspeed_resumes_at_another_world_size(variant, resumed_world_size, resumed_stage, tmp_path):
    original = deepspeed_checkpoint(variant)
    result = universal(original.checkpoint, tmp_path / "resume" / "global_step2_universal")
    assert (tmp_path / "resume" / "latest_universal").read_text() == "global_step2_universal"
    resumed = resume(tmp_path / "resume", variant, resumed_world_size, resumed_stage, tmp_path / "resumed")

    truth = original.truth
    saved_states = [k for k in original.tensors if k.startswith("optimizer/")]
    assert saved_states and len(saved_states) == len(truth["trainable"]) * len(result.optimizer_states)
    for name in truth["trainable"] + saved_states:
        assert torch.equal(resumed.tensors[name], original.tensors[name]), name
    for key in ("global_steps", "optimizer_step", "lr"):
        assert resumed.truth[key] == truth[key], key
    # The weights above are equal to the bit; the loss computed from them may differ in its last bit across world
    # sizes and stages, because on some CPUs the vector kernels round by where ZeRO places the weights in memory.
    assert math.isclose(resumed.truth["eval_loss"], truth["eval_loss"], rel_tol=1e-6, abs_tol=0.0)
    after = resumed.truth
    assert after["global_steps_after"] == truth["global_steps"] + 2
    if truth["optimizer_step"] is not None:
        assert after["optimizer_step_after"] == truth["optimizer_step"] + 2
    assert all(torch.isfinite(torch.tensor(loss)) for loss in after["losses_after"])


def run_ds_to_universal(tag_dir: Path, output: Path, inject: bool) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(tag_dir),
               "--output_folder", str(output), "--num_extract_workers", "1", "--num_merge_workers", "1"]
    return subprocess.run(command + (["--inject_missing_state"] if inject else []), capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"})


def param_value(path: Path) -> torch.Tensor:
    saved = torch.load(path, weights_only=False)  # DeepSpeed's own output, in a test
    tensor = saved["param"] if isinstance(saved, dict) else saved
    return tensor.float().reshape(-1) if tensor.is_floating_point() else tensor.reshape(-1)


@pytest.mark.parametrize("variant", [DeepSpeedVariant(2, "bf16", 3), DeepSpeedVariant(1, "fp32", 2),
                                     DeepSpeedVariant(3, "bf16", 2)], ids=lambda v: v.id)
def test_output_equals_deepspeeds_own_converter(variant, tmp_path):
    tag_dir = deepspeed_checkpoint(variant).checkpoint / "global_step2"
    done = run_ds_to_universal(tag_dir, tmp_path / "theirs", inject=variant.stage < 3)
    assert done.returncode == 0, done.stderr[-3000:]
    universal(tag_dir, tmp_path / "ours")
    trainable = deepspeed_checkpoint(variant).truth["trainable"]
    for name in trainable:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            ours, theirs = (param_value(tmp_path / side / "zero" / name / f"{state}.pt") for side in ("ours", "theirs"))
            assert torch.equal(ours, theirs), f"{name}/{state}"
        if variant.stage < 3:  # DeepSpeed writes step.pt only for stages 1-2 (stage 3 keeps it in optimizer_state.pt)
            assert torch.equal(*(torch.load(tmp_path / side / "zero" / name / "step.pt") for side in ("ours", "theirs")))
    ours = torch.load(tmp_path / "ours" / "zero" / "optimizer_state.pt", weights_only=False)
    theirs = torch.load(tmp_path / "theirs" / "zero" / "optimizer_state.pt", weights_only=False)
    groups = theirs["optimizer_state_dict"]["param_groups"] if variant.stage == 3 else theirs["param_groups"]
    assert ours["param_groups"] == groups
    for model_states in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (tmp_path / "theirs" / model_states).exists():
            assert (tmp_path / "ours" / model_states).read_bytes() == (tmp_path / "theirs" / model_states).read_bytes()


def test_where_deepspeeds_converter_fails(tmp_path):
    # A plain ZeRO-2 checkpoint, as DeepSpeed saves it, without --inject_missing_state:
    plain = deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2)).checkpoint / "global_step2"
    assert "universal_checkpoint_info" in run_ds_to_universal(plain, tmp_path / "ds-plain", inject=False).stderr
    universal(plain, tmp_path / "plain")
    # A client optimizer that is not Adam:
    sgd = deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2, optimizer="sgd"))
    assert "exp_avg" in run_ds_to_universal(sgd.checkpoint / "global_step2", tmp_path / "ds-sgd", inject=True).stderr
    assert universal(sgd.checkpoint, tmp_path / "sgd").optimizer_states == ["momentum_buffer"]
    # ZeRO-3 frozen parameters (DeepSpeed drops them) and buffers (it writes int buffers as float32):
    zero3 = deepspeed_checkpoint(DeepSpeedVariant(3, "bf16", 3))
    universal(zero3.checkpoint, tmp_path / "zero3")
    with open_checkpoint(tmp_path / "zero3") as written:
        assert written.info.frozen == zero3.truth["frozen"] and written.info.buffers == zero3.truth["buffers"]
        for name in zero3.truth["frozen"] + zero3.truth["buffers"]:
            kept = written[name].load()
            assert torch.equal(kept, zero3.tensors[name].to(kept.dtype)) and kept.dtype != torch.bfloat16, name
        assert written["step_count"].dtype == torch.int64


def test_default_location_next_to_the_tag_and_the_input_untouched(tmp_path, cli):
    save_dir = tmp_path / "run"
    shutil.copytree(deepspeed_checkpoint(DeepSpeedVariant(3, "fp32", 2)).checkpoint, save_dir)
    before = snapshot(save_dir)
    result = cli("universal", save_dir, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["output"] == str(save_dir / "global_step2_universal")
    assert (save_dir / "latest_universal").read_text() == "global_step2_universal"
    assert (save_dir / "latest").read_text() == "global_step2"
    after = snapshot(save_dir)
    assert {k: v for k, v in after.items() if k in before} == before, "no input file changed"
    assert sorted({k.split("/")[0] for k in after} - {k.split("/")[0] for k in before}) == [
        "global_step2_universal", "latest_universal"]
    assert leftovers(save_dir) == []
    inspected = cli("inspect", save_dir / "global_step2_universal").stdout
    assert "DeepSpeed universal checkpoint" in inspected and "DeepSpeed does not restore: frozen parameters" in inspected
    # The save dir still reads as the run (the universal folder is not one of its ZeRO tags), and --tag picks it.
    (save_dir / "latest").unlink()
    assert json.loads(cli("inspect", save_dir, "--json").stdout)["tags"] == ["global_step2"]
    picked = cli("inspect", save_dir, "--tag", "global_step2_universal").stdout
    assert "format        DeepSpeed universal checkpoint" in picked


def test_default_location_is_where_the_user_sees_the_tag(tmp_path, cli):
    # A save dir whose tag folder is a link to shared storage: the output goes into the save dir given, not the
    # link's target.
    shared = tmp_path / "shared"
    shutil.copytree(deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2)).checkpoint, shared)
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    (save_dir / "global_step2").symlink_to(shared / "global_step2")
    (save_dir / "latest").write_text("global_step2")
    assert cli("universal", save_dir).exit_code == 0
    assert (save_dir / "global_step2_universal" / "zero").is_dir() and (save_dir / "latest_universal").exists()
    assert not (shared / "global_step2_universal").exists() and not (shared / "latest_universal").exists()


@pytest.mark.parametrize("variant", [DeepSpeedVariant(2, "bf16", 2), DeepSpeedVariant(3, "fp16", 3)], ids=lambda v: v.id)
def test_the_universal_folder_reads_back_as_the_whole_run(variant, tmp_path):
    """Every state_dict name, with the masters, frozen bits, tied aliases and buffers: nothing of the run is lost."""
    fixture = deepspeed_checkpoint(variant)
    truth = fixture.truth
    universal(fixture.checkpoint, tmp_path / "uc")
    with open_checkpoint(tmp_path / "uc") as written:
        assert written.info.format == "deepspeed-universal" and written.info.tied == truth["tied"]
        assert sorted(written) == sorted(truth["order"])
        for name in truth["trainable"] + truth["frozen"] + truth["buffers"]:
            tensor = written[name].load()
            expected = fixture.tensors[name]
            assert torch.equal(tensor, expected.to(tensor.dtype)) and tensor.dtype == (
                torch.float32 if expected.is_floating_point() else expected.dtype), name
        for alias, source in truth["tied"].items():
            assert torch.equal(written[alias].load(), fixture.tensors[source])


def test_memory_is_one_parameter_at_a_time(tmp_path):
    """Every element of the masters and Adam states is read once, and only those (a proxy for peak memory)."""
    variant = DeepSpeedVariant(2, "bf16", 3)
    with open_checkpoint(deepspeed_checkpoint(variant).checkpoint) as source:
        names = source.info.trainable
        read_before = sum(source.bytes_read().values())
        for name in names:
            source[name].load()
            for state in source.optimizer_states(name).values():
                state.load()
        read = sum(source.bytes_read().values()) - read_before
        elements = sum(source[name].numel for name in names)
    assert read == 3 * 4 * elements


def test_a_damaged_optimizer_state_is_refused(tmp_path):
    """A flipped byte in a rank's exp_avg partition fails its record's CRC-32: refused, nothing written."""
    checkpoint = deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 3)).checkpoint
    with open_checkpoint(checkpoint) as source:
        name = source.info.trainable[-1]
        group = next(group for group in source.groups if name in group.layout.slots)
        rank, start, stop = group.layout.partition_pieces(name)[0]
        damaged_range = group.states[rank]["exp_avg"].flat_range(start, stop)
    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoint, damaged)
    target = damaged / Path(damaged_range.path).relative_to(checkpoint)
    data = bytearray(target.read_bytes())
    data[damaged_range.offset + damaged_range.length // 2] ^= 0x10
    target.write_bytes(bytes(data))
    with pytest.raises(CogExportError, match="CRC-32"):
        universal(damaged, tmp_path / "refused")
    assert not (tmp_path / "refused").exists() and leftovers(tmp_path) == []


def test_bad_input(cli, tmp_path):
    stage0 = deepspeed_checkpoint(DeepSpeedVariant(0, "bf16", 2)).checkpoint
    result = cli("universal", stage0, tmp_path / "out")
    assert result.exit_code == 2 and "not a ZeRO-1/2/3 checkpoint" in result.stderr and len(result.error_lines) == 1
    zero2 = deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2)).checkpoint
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    result = cli("universal", zero2, tmp_path / "taken")
    assert result.exit_code == 2 and "--overwrite" in result.stderr
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["mine.txt"]
    missing = tmp_path / "missing"
    shutil.copytree(zero2, missing)
    (missing / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    result = cli("universal", missing, tmp_path / "out2")
    assert result.exit_code == 2 and "rank 1 of 2 missing" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()
    assert not (missing / "latest_universal").exists() and leftovers(tmp_path) == []
