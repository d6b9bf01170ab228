"""Folders holding checkpoints rather than being one: every reader's claims are gathered, a documented rule picks one
(the newest step of a run, of any format; the only checkpoint below) and names it, and anything else is refused with
every candidate named and how to name one. Judged on real DeepSpeed and DCP saves against the weights gathered in
their training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_refused
from dcp_fixtures import dcp_checkpoint
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import load_file, save_file

from cogexport import open_checkpoint
from cogexport.errors import CogExportError

ZERO2 = DeepSpeedVariant(2, "bf16", 2)
ZERO3 = DeepSpeedVariant(3, "bf16", 3)


def deepspeed_save(variant: DeepSpeedVariant, folder: Path) -> Path:
    """A copy of a real DeepSpeed save dir ('latest' and its tag folder) as ``folder``."""
    return Path(shutil.copytree(deepspeed_checkpoint(variant).checkpoint, folder))


def assert_consolidates_to(cli, source: Path, out: Path, truth: dict[str, torch.Tensor], *args) -> str:
    result = cli("consolidate", source, out, *args)
    assert result.exit_code == 0, result.stderr
    written = load_file(out / "model.safetensors")
    assert set(written) == set(truth)
    for name, tensor in truth.items():
        assert torch.equal(written[name], tensor.to(written[name].dtype)), name
    return result.stderr


def zero_truth(variant: DeepSpeedVariant) -> dict[str, torch.Tensor]:
    return deepspeed_checkpoint(variant).expected_state_dict()


def test_the_demo_run_folder_names_both_candidates(tmp_path, cli):
    """demo-output/run: the DeepSpeed checkpoint-2/ and the ground truth's truth.safetensors beside it."""
    run = tmp_path / "run"
    deepspeed_save(ZERO2, run / "checkpoint-2")
    shutil.copy(deepspeed_checkpoint(ZERO2).root / "truth.safetensors", run / "truth.safetensors")
    for args in (["consolidate", run, tmp_path / "out"], ["inspect", run], ["--model-type", "t2v", run,
                                                                           tmp_path / "out"]):
        assert_refused(cli, tmp_path, args, f"{run} holds more than one set of weights",
                       "the DeepSpeed checkpoint checkpoint-2", "safetensors weights truth.safetensors", "point at one")
    assert_consolidates_to(cli, run / "checkpoint-2", tmp_path / "out", zero_truth(ZERO2))


def test_an_openrlhf_ppo_save_holds_two_checkpoints(tmp_path, cli):
    ckpt = tmp_path / "ckpt"
    deepspeed_save(ZERO2, ckpt / "_actor")
    deepspeed_save(ZERO3, ckpt / "_critic")
    for args in (["consolidate", ckpt, tmp_path / "out"], ["inspect", ckpt]):
        assert_refused(cli, tmp_path, args, f"{ckpt} holds 2 checkpoints, _actor and _critic: point at one")
    stderr = assert_consolidates_to(cli, ckpt, tmp_path / "out", zero_truth(ZERO3), "--tag", "_critic")
    assert "read _critic, as --tag _critic asks" in stderr


def test_the_newest_step_whatever_its_format(tmp_path, cli):
    """checkpoint-9 a DeepSpeed save, checkpoint-10 an accelerate FSDP2 (DCP) step: 10 is newer than 9 (natural
    order), read and named; --tag checkpoint-9 reads the other."""
    run = tmp_path / "run"
    deepspeed_save(ZERO2, run / "checkpoint-9")
    dcp = dcp_checkpoint("accelerate-fsdp2", "toy", 2)
    shutil.copytree(dcp.last_step, run / "checkpoint-10")
    stderr = assert_consolidates_to(cli, run, tmp_path / "newest", dcp.weights)
    assert "took the newest step checkpoint-10 of" in stderr and "(steps there: checkpoint-9, checkpoint-10)" in stderr
    stderr = assert_consolidates_to(cli, run, tmp_path / "older", zero_truth(ZERO2), "--tag", "checkpoint-9")
    assert "read checkpoint-9, as --tag checkpoint-9 asks" in stderr
    report = json.loads(cli("inspect", run, "--json", "--quick").stdout)
    assert report["tag"] == "checkpoint-10" and report["picked"].startswith("took the newest step checkpoint-10")
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out", "--tag", "checkpoint-7"],
                   "--tag 'checkpoint-7' is not a step of", "checkpoint-9, checkpoint-10")


def hf_trainer_step(folder: Path, weights: dict[str, torch.Tensor]) -> Path:
    """An HF Trainer checkpoint-N without DeepSpeed: the model and the training state beside it."""
    folder.mkdir(parents=True)
    save_file(weights, folder / "model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin", "scaler.pt"):
        torch.save({"state": torch.zeros(2)}, folder / name)
    (folder / "trainer_state.json").write_text("{}")
    return folder


def test_steps_of_safetensors_weights_and_a_final_export_beside_them(tmp_path, cli):
    run = tmp_path / "run"
    older = {"w": torch.arange(6.0).reshape(2, 3)}
    newer = {"w": torch.arange(6.0).reshape(2, 3) * 2}
    hf_trainer_step(run / "checkpoint-500", older)
    hf_trainer_step(run / "checkpoint-1000", newer)
    stderr = assert_consolidates_to(cli, run, tmp_path / "first", newer)  # the training state is never a candidate
    assert "took the newest step checkpoint-1000" in stderr
    save_file(newer, run / "pytorch_lora_weights.safetensors")
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "refused"], "more than one set of weights",
                   "checkpoint steps checkpoint-500, checkpoint-1000 (pick one with --tag checkpoint-1000)",
                   "safetensors weights pytorch_lora_weights.safetensors")
    assert_consolidates_to(cli, run, tmp_path / "named", newer, "--tag", "pytorch_lora_weights.safetensors")


def test_a_loose_torch_file_beside_a_checkpoint(tmp_path, cli):
    run = tmp_path / "run"
    deepspeed_save(ZERO2, run / "checkpoint-2")
    torch.save(zero_truth(ZERO2), run / "final.pt")
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], "the DeepSpeed checkpoint checkpoint-2",
                   "torch.save weights final.pt")


def test_the_only_checkpoint_below_is_read_and_named(tmp_path, cli):
    outputs = tmp_path / "outputs"
    deepspeed_save(ZERO3, outputs / "ckpt")
    (outputs / "logs").mkdir()
    (outputs / "logs" / "events.txt").write_text("loss 0.1")
    stderr = assert_consolidates_to(cli, outputs, tmp_path / "out", zero_truth(ZERO3))
    assert f"read ckpt, the only checkpoint in {outputs}" in stderr


def test_a_folder_with_nothing_says_what_each_reader_looked_for(tmp_path, cli):
    folder = tmp_path / "notes"
    (folder / "deeper").mkdir(parents=True)
    (folder / "deeper" / "readme.txt").write_text("nothing here")
    line = assert_refused(cli, tmp_path, ["consolidate", folder, tmp_path / "out"],
                          "holds no checkpoint cogexport can read", "up to 3 folders down")
    for looked_for in ("'latest'", ".metadata beside __0_0.distcp", "shard-*-model-*-of-*.safetensors",
                       "*.safetensors", "*.pt"):
        assert looked_for in line


def test_a_model_folder_with_its_older_bin_copy_is_one_model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    weights = {"w": torch.ones(3)}
    save_file(weights, folder / "model.safetensors")
    torch.save(weights, folder / "pytorch_model.bin")
    with open_checkpoint(folder) as checkpoint:
        assert checkpoint.info.format == "safetensors" and torch.equal(checkpoint["w"].load(), weights["w"])


@pytest.mark.parametrize("what", ["safetensors", "folder"])
def test_an_ema_is_never_the_model_of_a_format_without_one(what, tmp_path):
    save_file({"w": torch.ones(3)}, tmp_path / "model.safetensors")
    with pytest.raises(CogExportError, match="holds no 'ema' state dict"):
        open_checkpoint(tmp_path / "model.safetensors" if what == "safetensors" else tmp_path, entry="ema")


def test_tag_on_one_file_is_refused(tmp_path):
    save_file({"w": torch.ones(3)}, tmp_path / "model.safetensors")
    with pytest.raises(CogExportError, match="does not apply to"):
        open_checkpoint(tmp_path / "model.safetensors", tag="checkpoint-2")


def test_a_step_and_its_consolidated_copy_are_one_save(tmp_path, cli):
    """accelerate merge-weights run into the step folder itself (model.safetensors beside pytorch_model_fsdp_0):
    the same tensors, so the original is read and the copy named; a copy of other tensors stays a candidate."""
    import subprocess
    import sys

    dcp = dcp_checkpoint("accelerate-fsdp2", "toy", 2)
    step = Path(shutil.copytree(dcp.last_step, tmp_path / "run" / "checkpoint-2"))
    accelerate = Path(sys.executable).parent / "accelerate"
    subprocess.run([str(accelerate), "merge-weights", str(step / "pytorch_model_fsdp_0"), str(step)], check=True,
                   capture_output=True)
    assert (step / "model.safetensors").is_file()
    stderr = assert_consolidates_to(cli, tmp_path / "run", tmp_path / "read", dcp.weights)
    assert "checkpoint-2/model.safetensors beside it holds the same tensors" in stderr
    with open_checkpoint(step) as checkpoint:
        assert checkpoint.info.format == "dcp"
    save_file({"w": torch.ones(2)}, step / "model.safetensors")
    assert_refused(cli, tmp_path, ["consolidate", step, tmp_path / "refused"], "more than one set of weights",
                   "model.safetensors")
