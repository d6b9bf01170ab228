"""Bad input gets one clear line naming the file, exit code 2, nothing written and the input untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import leftovers, run_cogexport_process, snapshot
from fixtures import DeepSpeedVariant, deepspeed_checkpoint

ZERO2 = DeepSpeedVariant(2, "bf16", 2)
ZERO2_WS3 = DeepSpeedVariant(2, "bf16", 3)
ZERO3 = DeepSpeedVariant(3, "bf16", 2)
ZERO3_WS3 = DeepSpeedVariant(3, "bf16", 3)
ZERO3_LATER = DeepSpeedVariant(3, "bf16", 2, steps=3)


def copy_checkpoint(variant: DeepSpeedVariant, destination: Path) -> Path:
    shutil.copytree(deepspeed_checkpoint(variant).checkpoint, destination)
    return destination


def assert_refused(cli, source: Path | list[Path], tmp_path: Path, *phrases: str, output: Path | None = None):
    """Run consolidate on bad input and check the whole contract of a refusal."""
    sources = source if isinstance(source, list) else [source]
    output = output or tmp_path / "exported"
    watched = {s: snapshot(s if s.is_dir() else s.parent) for s in sources if s.exists()}
    output_before = snapshot(output) if output.exists() else None
    result = cli("consolidate", *sources, output)
    assert result.exit_code == 2, result.stderr
    assert len(result.error_lines) == 1, result.stderr
    line = result.error_lines[0]
    assert line.startswith("cogexport: error: ")
    for phrase in phrases:
        assert phrase in line, line
    assert (snapshot(output) if output.exists() else None) == output_before, "nothing written"
    assert leftovers(output.parent) == []
    for folder, before in watched.items():
        assert snapshot(folder if folder.is_dir() else folder.parent) == before, "input untouched"
    return line


def test_empty_dir(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_refused(cli, tmp_path / "empty", tmp_path, "empty", "empty")


def test_missing_path(cli, tmp_path):
    assert_refused(cli, tmp_path / "nope", tmp_path, "nope", "does not exist")


def test_wrong_dir(cli, tmp_path):
    wrong = tmp_path / "photos"
    wrong.mkdir()
    (wrong / "cat.jpg").write_bytes(b"\xff\xd8 not a checkpoint")
    assert_refused(cli, wrong, tmp_path, "photos", "holds no checkpoint cogexport can read")


def test_truncated_file(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    victim = checkpoint / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    os.truncate(victim, victim.stat().st_size // 2)
    assert_refused(cli, checkpoint, tmp_path, victim.name, "truncated")


def test_missing_rank(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2_WS3, tmp_path / "ckpt")
    (checkpoint / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert_refused(cli, checkpoint, tmp_path, "rank 1 of 3 missing", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")


def test_missing_zero3_model_states_rank(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO3_WS3, tmp_path / "ckpt")
    (checkpoint / "global_step2" / "zero_pp_rank_2_mp_rank_00_model_states.pt").unlink()
    assert_refused(cli, checkpoint, tmp_path, "rank 2 of 3 missing", "zero_pp_rank_2_mp_rank_00_model_states.pt")


def test_stale_extra_rank(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    stale = "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"
    shutil.copy(deepspeed_checkpoint(ZERO2_WS3).checkpoint / "global_step2" / stale, checkpoint / "global_step2")
    assert_refused(cli, checkpoint, tmp_path, "stale rank file", stale, "world size 2")


def zero3_with_rank_1_from(other: DeepSpeedVariant, tmp_path: Path) -> Path:
    """A ZeRO-3 world-size-2 checkpoint whose rank-1 files come from another run."""
    checkpoint = copy_checkpoint(ZERO3, tmp_path / "ckpt")
    source = next(p for p in deepspeed_checkpoint(other).checkpoint.iterdir() if p.is_dir())
    for name in ("zero_pp_rank_1_mp_rank_00_model_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        shutil.copy(source / name, checkpoint / "global_step2" / name)
    return checkpoint


def test_mixed_world_sizes(cli, tmp_path):
    checkpoint = zero3_with_rank_1_from(ZERO3_WS3, tmp_path)
    assert_refused(cli, checkpoint, tmp_path, "mixed world sizes", "zero_pp_rank_1_mp_rank_00_")


def test_mixed_steps_in_one_tag(cli, tmp_path):
    checkpoint = zero3_with_rank_1_from(ZERO3_LATER, tmp_path)
    assert_refused(cli, checkpoint, tmp_path, "mixed tags", "step 3")


def test_mixed_steps_in_a_zero2_tag(cli, tmp_path):
    # accelerate names every checkpoint-N's tag pytorch_model, so only the optimizer step tells two saves apart
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    name = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    later = deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2, steps=3)).checkpoint / "global_step3" / name
    shutil.copy(later, checkpoint / "global_step2" / name)
    assert_refused(cli, checkpoint, tmp_path, "mixed steps", name, "step 3")
    report = cli("inspect", checkpoint)
    assert report.exit_code == 1 and "problem       mixed steps" in report.stdout


def test_optimizer_files_of_another_run(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    fp32_run = deepspeed_checkpoint(DeepSpeedVariant(2, "fp32", 2)).checkpoint / "global_step2"
    for rank in (0, 1):
        (checkpoint / "global_step2" / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").unlink()
        shutil.copy(fp32_run / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", checkpoint / "global_step2")
    assert_refused(cli, checkpoint, tmp_path, "mixed runs", "zero_pp_rank_0_mp_rank_00_optim_states.pt")


def test_optimizer_files_of_another_stage(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    for optimizer_file in (deepspeed_checkpoint(ZERO3).checkpoint / "global_step2").glob("*optim_states.pt"):
        shutil.copy(optimizer_file, checkpoint / "global_step2")
    assert_refused(cli, checkpoint, tmp_path, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                   "not a ZeRO-2 optimizer file")


def test_stage0_masters_that_cannot_be_placed(cli, tmp_path):
    # Stage 0 saves fp32 masters without names; a frozen norm between two trained layers, stored with the same
    # bits as the trained norm, could own either master: refuse rather than guess.
    checkpoint = copy_checkpoint(DeepSpeedVariant(0, "bf16", 1, model="ambiguous-frozen-norm"), tmp_path / "ckpt")
    assert_refused(cli, checkpoint, tmp_path, "cannot tell which parameter", "frozen_norm.weight", "norm.weight")
    report = cli("inspect", checkpoint)
    assert report.exit_code == 1 and "cannot tell which parameter" in report.stdout


# Fields of the first central-directory entry (data.pkl's): zipfile reports each kind of damage differently.
@pytest.mark.parametrize("field_offset", [6, 10, 45, 47], ids=["version", "method", "header-offset", "name"])
def test_damaged_zip_directory(cli, tmp_path, field_offset):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    victim = checkpoint / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(victim.read_bytes())
    data[data.find(b"PK\x01\x02") + field_offset] ^= 0x9A
    victim.write_bytes(bytes(data))
    assert_refused(cli, checkpoint, tmp_path, victim.name)


def test_output_below_a_file(cli, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    result = cli("consolidate", deepspeed_checkpoint(ZERO2).checkpoint, tmp_path / "a-file" / "exported")
    assert result.exit_code == 2 and len(result.error_lines) == 1 and "a-file is a file" in result.stderr
    assert (tmp_path / "a-file").read_text() == "not a folder" and leftovers(tmp_path) == []


def test_mixed_tags_across_node_folders(cli, tmp_path):
    node0 = copy_checkpoint(ZERO2, tmp_path / "node0")
    node1 = tmp_path / "node1" / "global_step7"
    node1.mkdir(parents=True)
    shutil.move(node0 / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", node1)
    assert_refused(cli, [node0, node1.parent], tmp_path, "mixed tags", "global_step2")


def test_legacy_non_zip_file(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    model_states = checkpoint / "global_step2" / "mp_rank_00_model_states.pt"
    states = torch.load(model_states, weights_only=False)  # our own fixture, trusted
    torch.save(states, model_states, _use_new_zipfile_serialization=False)
    assert_refused(cli, checkpoint, tmp_path, model_states.name, "legacy (non-zip) format")


class _RunsShellCommand:
    """Pickles as a call to os.system: what a malicious checkpoint looks like."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("where", ["model states", "optimizer states"])
def test_pickle_that_runs_code_is_refused_and_never_runs(cli, tmp_path, where):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    name = "mp_rank_00_model_states.pt" if where == "model states" else "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"module": {}, "optimizer_state_dict": _RunsShellCommand(f"touch {marker}")}, checkpoint / "global_step2" / name)

    line = assert_refused(cli, checkpoint, tmp_path, name, "'posix.system'", "would run code")
    assert not marker.exists(), "the payload must not have run"
    assert "refused" in line

    # The payload is real: an unsafe loader does run it.
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(checkpoint / 'global_step2' / name)!r}, "
                                          "weights_only=False)"], check=False, capture_output=True)
    assert marker.exists()


def test_payload_refused_in_a_fresh_process_too(tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    torch.save({"module": _RunsShellCommand(f"touch {marker}")}, checkpoint / "global_step2" / "mp_rank_00_model_states.pt")
    done = run_cogexport_process("inspect", checkpoint)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "refused to load" in done.stderr
    assert not marker.exists()


def test_output_exists_and_is_not_empty(cli, tmp_path):
    checkpoint = deepspeed_checkpoint(ZERO2).checkpoint
    output = tmp_path / "exported"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    line = assert_refused(cli, checkpoint, tmp_path, "exists and is not empty", "--overwrite", output=output)
    assert str(output) in line
    assert (output / "keep.txt").read_text() == "mine"


def test_output_inside_a_tag_folder_is_refused(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    output = checkpoint / "global_step2" / "hf"
    assert_refused(cli, checkpoint, tmp_path, "inside the input folder", output=output)
    assert not output.exists()


def test_overwrite_cannot_delete_the_input(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "runs" / "ckpt")
    before = snapshot(checkpoint)
    result = cli("consolidate", checkpoint, tmp_path / "runs", "--overwrite")
    assert result.exit_code == 2 and "contains the input" in result.stderr
    assert snapshot(checkpoint) == before


def test_overwrite_replaces_an_old_export(cli, tmp_path):
    checkpoint = deepspeed_checkpoint(ZERO2).checkpoint
    output = tmp_path / "exported"
    output.mkdir()
    (output / "stale.safetensors").write_bytes(b"old")
    result = cli("consolidate", checkpoint, output, "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in output.iterdir()) == ["model.safetensors"]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("size", ["lots", "0GB", "-5"])
def test_bad_shard_size(cli, tmp_path, size):
    checkpoint = deepspeed_checkpoint(ZERO2).checkpoint
    result = cli("consolidate", checkpoint, tmp_path / "out", "--max-shard-size", size)
    assert result.exit_code == 2 and len(result.error_lines) == 1 and "--max-shard-size" in result.stderr
    assert not (tmp_path / "out").exists()


def test_shard_size_in_plain_bytes(cli, tmp_path):
    checkpoint = deepspeed_checkpoint(ZERO2).checkpoint
    assert cli("consolidate", checkpoint, tmp_path / "bytes", "--max-shard-size", "1000").exit_code == 0
    assert cli("consolidate", checkpoint, tmp_path / "units", "--max-shard-size", "1kB").exit_code == 0
    assert snapshot(tmp_path / "bytes").keys() == snapshot(tmp_path / "units").keys()
    assert len(list((tmp_path / "bytes").glob("model-*-of-*.safetensors"))) > 1


def test_overwrite_through_a_symlink_keeps_the_link(cli, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "old.safetensors").write_bytes(b"old")
    (tmp_path / "link").symlink_to(real)
    result = cli("consolidate", deepspeed_checkpoint(ZERO2).checkpoint, tmp_path / "link", "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "link").is_symlink() and sorted(p.name for p in real.iterdir()) == ["model.safetensors"]
    assert leftovers(tmp_path) == []


def test_output_that_would_not_fit_on_its_disk(cli, tmp_path, monkeypatch):
    """Refused before a byte is written, rather than failing when the disk fills half-way through a long run."""
    from cogexport.write import staging

    monkeypatch.setattr(staging, "free_bytes", lambda path: 100)
    line = assert_refused(cli, deepspeed_checkpoint(ZERO2).checkpoint, tmp_path, "needs", "but its disk has only "
                          "100 B free; free some space or write it to another disk")
    assert str(tmp_path / "exported") in line
