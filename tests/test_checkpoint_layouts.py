"""The folder shapes DeepSpeed users point at: save dir, tag dir, model-states file, HF Trainer and accelerate
checkpoint-N folders, --tag, several tags, and multi-node runs whose ranks sit in different folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import load_file

from cogexport import consolidate, open_checkpoint
from cogexport.errors import CogExportError

ZERO2_WS3 = DeepSpeedVariant(2, "bf16", 3)
ZERO3_WS3 = DeepSpeedVariant(3, "bf16", 3)


def assert_equals_truth(fixture, folder: Path) -> None:
    written = load_file(folder / "model.safetensors")
    expected = fixture.expected_state_dict()
    assert set(written) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(written[name], tensor.to(written[name].dtype)), name


def tag_dir(variant: DeepSpeedVariant) -> Path:
    return deepspeed_checkpoint(variant).checkpoint / "global_step2"


@pytest.mark.parametrize("pointer", ["save dir", "tag dir", "model-states file"])
def test_points_of_entry(pointer, tmp_path):
    fixture = deepspeed_checkpoint(ZERO2_WS3)
    source = {"save dir": fixture.checkpoint, "tag dir": tag_dir(ZERO2_WS3),
              "model-states file": tag_dir(ZERO2_WS3) / "mp_rank_00_model_states.pt"}[pointer]
    consolidate(source, tmp_path / "out")
    assert_equals_truth(fixture, tmp_path / "out")


def test_hf_trainer_checkpoint_folder(tmp_path):
    fixture = deepspeed_checkpoint(ZERO2_WS3)
    checkpoint = tmp_path / "output" / "checkpoint-2"
    shutil.copytree(fixture.checkpoint, checkpoint)
    (checkpoint / "trainer_state.json").write_text("{}")
    consolidate(checkpoint, tmp_path / "out")
    assert_equals_truth(fixture, tmp_path / "out")


def test_accelerate_checkpoint_folder(tmp_path):
    fixture = deepspeed_checkpoint(ZERO3_WS3)
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    shutil.copytree(tag_dir(ZERO3_WS3), checkpoint / "pytorch_model")
    (checkpoint / "latest").write_text("pytorch_model")
    (checkpoint / "random_states_0.pkl").write_bytes(b"not ours to read")
    with open_checkpoint(checkpoint) as opened:
        assert opened.info.tag == "pytorch_model"
    consolidate(checkpoint, tmp_path / "out")
    assert_equals_truth(fixture, tmp_path / "out")


def _two_tags(tmp_path: Path) -> Path:
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    shutil.copytree(tag_dir(ZERO2_WS3), save_dir / "global_step2")
    shutil.copytree(tag_dir(ZERO3_WS3), save_dir / "global_step10")
    return save_dir


def test_several_tags_without_latest_asks_for_tag_and_tag_chooses(tmp_path, cli):
    save_dir = _two_tags(tmp_path)
    result = cli("consolidate", save_dir, tmp_path / "out")
    assert result.exit_code == 2 and "pass --tag (one of global_step2, global_step10)" in result.stderr
    consolidate(save_dir, tmp_path / "out", tag="global_step10")
    assert_equals_truth(deepspeed_checkpoint(ZERO3_WS3), tmp_path / "out")
    report = json.loads(cli("inspect", save_dir, "--tag", "global_step2", "--json").stdout)
    assert report["tags"] == ["global_step2", "global_step10"] and report["stage"] == 2


def test_latest_wins_and_tag_overrides_it(tmp_path):
    save_dir = _two_tags(tmp_path)
    (save_dir / "latest").write_text("global_step10")
    with open_checkpoint(save_dir) as opened:
        assert opened.info.facts.stage == 3
    with open_checkpoint(save_dir, tag="global_step2") as opened:
        assert opened.info.facts.stage == 2
    with pytest.raises(CogExportError, match="names tag 'global_step9'"):
        open_checkpoint(save_dir, tag="global_step9")


@pytest.mark.parametrize("variant", [ZERO2_WS3, ZERO3_WS3], ids=lambda v: v.id)
def test_multi_node_run_with_ranks_in_separate_folders(variant, tmp_path):
    """Each node kept its own ranks' files; only node 0 has 'latest' (and, for ZeRO-1/2, the model states)."""
    fixture = deepspeed_checkpoint(variant)
    nodes = [tmp_path / f"node{rank}" for rank in range(3)]
    for rank, node in enumerate(nodes):
        (node / "global_step2").mkdir(parents=True)
        for path in tag_dir(variant).iterdir():
            if f"_rank_{rank}_" in path.name or (rank == 0 and path.name == "mp_rank_00_model_states.pt"):
                shutil.copy(path, node / "global_step2" / path.name)
    (nodes[0] / "latest").write_text("global_step2")
    consolidate(list(reversed(nodes)), tmp_path / "out")
    assert_equals_truth(fixture, tmp_path / "out")


def test_inspect_reports_the_checkpoint(cli):
    fixture = deepspeed_checkpoint(DeepSpeedVariant(3, "fp16", 3))
    report = json.loads(cli("inspect", fixture.checkpoint, "--json", "--verbose").stdout)
    assert (report["format"], report["stage"], report["training_dtype"], report["world_size"]) == ("deepspeed", 3, "fp16", 3)
    assert report["step"] == 2 and report["tag"] == "global_step2" and report["ds_version"] == "0.19.8"
    assert report["frozen"] == fixture.truth["frozen"] and report["tied"] == fixture.truth["tied"]
    assert report["buffers"] == fixture.truth["buffers"]
    assert report["client_state"] == {"epoch": "3", "run_note": "'cogexport test'"}
    assert [t["name"] for t in report["tensors"]] == fixture.truth["order"]
    params = [n for n in fixture.truth["order"] if n not in fixture.truth["buffers"] and n not in fixture.truth["tied"]]
    assert report["parameter_count"] == sum(fixture.tensors[n].numel() for n in params)
    assert report["problems"] == []
    text = cli("inspect", fixture.checkpoint).stdout
    assert "ZeRO-3, fp16 training, world size 3" in text and "head.weight -> embed.weight" in text


def test_inspect_lists_problems_instead_of_failing(cli, tmp_path):
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(deepspeed_checkpoint(ZERO2_WS3).checkpoint, checkpoint)
    (checkpoint / "global_step2" / "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt").unlink()
    result = cli("inspect", checkpoint, "--json")
    assert result.exit_code == 1  # listed, and the exit code says the checkpoint is not usable
    assert json.loads(result.stdout)["problems"] == [
        f"rank 2 of 3 missing: expected bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt in {checkpoint / 'global_step2'} "
        "(on a multi-node run, give every node's folder)"]
