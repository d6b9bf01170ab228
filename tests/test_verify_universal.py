"""``cogexport verify`` of ``cogexport universal``'s folder: every master, optimizer state, step, frozen parameter and
buffer against the ZeRO checkpoint; a changed value, a foreign checkpoint and a changed model-states file are caught."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures import DeepSpeedVariant, deepspeed_checkpoint

from cogexport.universal import universal


def universal_of(variant, tmp_path):
    checkpoint = deepspeed_checkpoint(variant).checkpoint
    universal(checkpoint, tmp_path / "uc")
    return checkpoint, tmp_path / "uc"


@pytest.mark.parametrize("variant", [DeepSpeedVariant(2, "bf16", 2), DeepSpeedVariant(3, "bf16", 3)],
                         ids=lambda v: v.id)
def test_a_universal_checkpoint_verifies_against_its_zero_checkpoint(variant, cli, tmp_path):
    checkpoint, folder = universal_of(variant, tmp_path)
    result = cli("verify", folder, "--against", checkpoint, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["reports"]
    truth = deepspeed_checkpoint(variant).truth
    # each trainable parameter's master, two Adam states and step; each frozen parameter and buffer
    others = len(truth["frozen"]) + len(truth["buffers"])
    assert report["kind"] == "universal checkpoint" and report["ok"] and report["mismatches"] == []
    assert report["tensors"] == report["exact"] == 4 * len(truth["trainable"]) + others
    assert "unpickle" in report["judge_note"]
    text = cli("verify", folder, "--against", checkpoint).stdout
    assert text.startswith(f"ok: {folder} (universal checkpoint, DeepSpeed universal checkpoint of ZeRO-"
                           f"{variant.stage}") and "this proves: every parameter's fp32 master" in text


def change_one_value(path, key="param"):
    saved = torch.load(path, weights_only=True)  # our own output, in a test
    saved[key] = saved[key].clone()
    saved[key].view(-1)[0] += 1e-3
    torch.save(saved, path)


def test_a_changed_value_of_a_master_or_state_is_caught(cli, tmp_path):
    variant = DeepSpeedVariant(2, "bf16", 2)
    checkpoint, folder = universal_of(variant, tmp_path)
    name = deepspeed_checkpoint(variant).truth["trainable"][0]
    change_one_value(folder / "zero" / name / "exp_avg_sq.pt")
    result = cli("verify", folder, "--against", checkpoint, "--json")
    assert result.exit_code == 1
    (report,) = json.loads(result.stdout)["reports"]
    assert report["mismatches"] == [f"zero/{name}/exp_avg_sq.pt: param differs from the checkpoint's"]


def test_a_foreign_checkpoint_and_a_changed_model_states_file_are_caught(cli, tmp_path):
    _, folder = universal_of(DeepSpeedVariant(2, "bf16", 2), tmp_path)
    other = deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 3)).checkpoint  # the same model, trained on 3 ranks
    (report,) = json.loads(cli("verify", folder, "--against", other, "--json").stdout)["reports"]
    assert not report["ok"] and any(line.endswith("differs from the checkpoint's") for line in report["mismatches"])
    assert any(line.startswith("mp_rank_00_model_states.pt is not ") for line in report["mismatches"])
