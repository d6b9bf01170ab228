"""Bad DCP input gets one line, exit 2, nothing written and the input untouched; nothing pickled in a DCP save runs."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
from conftest import snapshot
from dcp_fixtures import dcp_checkpoint
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import save_file
from test_bad_input import assert_refused


def copy_save(tmp_path: Path, writer: str = "plain", world_size: int = 3) -> Path:
    return Path(shutil.copytree(dcp_checkpoint(writer, "toy", world_size).run, tmp_path / "run"))


def rewrite_metadata(folder: Path, change) -> None:
    """Change the save's metadata with torch's own classes (the test trusts torch; cogexport must not)."""
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    change(metadata)
    with open(folder / ".metadata", "wb") as handle:
        pickle.dump(metadata, handle)


class RunsCode:
    """Unpickling this runs a shell command: what a hostile checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_metadata_that_would_run_code_is_refused_and_never_runs(cli, tmp_path):
    run = copy_save(tmp_path)
    marker = tmp_path / "payload-ran"
    (run / "checkpoint" / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    line = assert_refused(cli, run, tmp_path, ".metadata", "posix.system", "would run code")
    assert not marker.exists()

    # hidden deep inside otherwise valid metadata
    shutil.rmtree(run)
    run = copy_save(tmp_path)
    rewrite_metadata(run / "checkpoint", lambda metadata: setattr(metadata.storage_meta, "modules", [RunsCode(marker)]))
    assert_refused(cli, run, tmp_path, ".metadata", "posix.system")
    assert not marker.exists() and line


def test_pickled_train_state_is_never_loaded(cli, tmp_path):
    """torchtitan's BytesIO loss history is a pickle inside a .distcp; replaced by one that runs code, cogexport
    still reads the weights (it never loads such entries), while torch's own dcp_to_torch would run it."""
    run = copy_save(tmp_path, "torchtitan")
    step = run / "checkpoint" / "step-2"
    marker = tmp_path / "payload-ran"
    metadata = dcp.FileSystemReader(str(step)).read_metadata()
    where = next(info for index, info in metadata.storage_data.items() if index.fqn == "train_state.global_avg_losses")
    payload = pickle.dumps(RunsCode(marker), protocol=2)
    assert len(payload) <= where.length
    with open(step / where.relative_path, "r+b") as handle:
        handle.seek(where.offset)
        handle.write(payload + b"\0" * (where.length - len(payload)))
    assert cli("consolidate", run, tmp_path / "out").exit_code == 0
    assert cli("inspect", run).exit_code == 0 and not marker.exists()
    subprocess.run([sys.executable, "-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch", str(step),
                    str(tmp_path / "torch.pt")], capture_output=True)
    assert marker.exists(), "the payload is real: torch's own converter runs it"


def test_truncated_rank_file(cli, tmp_path):
    run = copy_save(tmp_path)
    victim = run / "checkpoint" / "__1_0.distcp"
    os.truncate(victim, victim.stat().st_size - 100)
    assert_refused(cli, run, tmp_path, "__1_0.distcp", "truncated")


def test_missing_rank_file(cli, tmp_path):
    run = copy_save(tmp_path)
    (run / "checkpoint" / "__2_0.distcp").unlink()
    assert_refused(cli, run, tmp_path, "rank 2's file __2_0.distcp is missing")


def test_metadata_naming_a_file_that_is_not_there(cli, tmp_path):
    run = copy_save(tmp_path)

    def elsewhere(metadata):
        index = next(i for i in metadata.storage_data if i.fqn == "model.block.0.weight")
        metadata.storage_data[index].relative_path = "shard_moved.distcp"

    rewrite_metadata(run / "checkpoint", elsewhere)
    assert_refused(cli, run, tmp_path, "file shard_moved.distcp is missing", "model.block.0.weight")


@pytest.mark.parametrize("damage, phrases", [
    ("overlap", ("model.block.0.weight", "chunks at [0, 0] and [5, 0] overlap")),
    ("missing chunk", ("model.block.0.weight", "247 of its 377 elements")),
    ("outside", ("model.norm.bias", "outside the tensor's shape")),
])
def test_chunk_boxes_that_do_not_tile_the_tensor(damage, phrases, cli, tmp_path):
    run = copy_save(tmp_path)

    def change(metadata):
        entries = metadata.state_dict_metadata
        if damage == "overlap":  # rows 0-9, 10-19, 20-28 on 3 ranks: move the second piece to start at row 5
            moved = type(entries["model.block.0.weight"].size)([5, 0])
            entries["model.block.0.weight"].chunks[1].offsets = moved
            index = next(i for i in metadata.storage_data if i.fqn == "model.block.0.weight" and i.offset[0] == 10)
            metadata.storage_data[type(index)(index.fqn, moved)] = metadata.storage_data.pop(index)
        elif damage == "missing chunk":
            del entries["model.block.0.weight"].chunks[0]
        else:
            entries["model.norm.bias"].size = type(entries["model.norm.bias"].size)([12])

    rewrite_metadata(run / "checkpoint", change)
    assert_refused(cli, run, tmp_path, *phrases)


def test_chunk_that_holds_another_shape(cli, tmp_path):
    run = copy_save(tmp_path)

    def change(metadata):  # say rank 0's piece of block.0.weight is its first 10 columns instead of 10 rows
        entry = metadata.state_dict_metadata["model.block.0.weight"]
        entry.chunks[0].sizes = type(entry.size)([29, 13])
        entry.chunks[1:] = []
        entry.chunks[0].offsets = type(entry.size)([0, 0])

    rewrite_metadata(run / "checkpoint", change)
    assert_refused(cli, run, tmp_path, "__0_0.distcp", "model.block.0.weight", "holds (10, 13)")


def test_a_dcp_step_beside_a_stray_safetensors(cli, tmp_path):
    run = copy_save(tmp_path, "accelerate-fsdp2", 2)
    save_file({"w": dcp_checkpoint("accelerate-fsdp2", "toy", 2).weights["norm.weight"]},
              run / "checkpoint-2" / "model.safetensors")
    assert_refused(cli, run / "checkpoint-2", tmp_path, "more than one set of weights", "the DCP checkpoint",
                   "model.safetensors", "not its copy")


def test_a_deepspeed_tag_beside_an_exported_model_safetensors(cli, tmp_path):
    checkpoint = Path(shutil.copytree(deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2)).checkpoint,
                                      tmp_path / "checkpoint-2"))
    save_file({"w": deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2)).tensors["norm.weight"]},
              checkpoint / "model.safetensors")
    assert_refused(cli, checkpoint, tmp_path, "more than one set of weights", "DeepSpeed checkpoint",
                   "model.safetensors")
    assert cli("consolidate", checkpoint, tmp_path / "out", "--tag", "global_step2").exit_code == 0


def test_finetrainers_steps_beside_their_exports(cli, tmp_path):
    run = Path(shutil.copytree(dcp_checkpoint("finetrainers", "cogvideox-2b", 2).run, tmp_path / "run"))
    assert_refused(cli, run, tmp_path, "more than one set of weights", "--tag finetrainers_step_2",
                   "model_weights/000002/transformer")


def test_checkpoints_of_two_runs(cli, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(dcp_checkpoint("torchtitan", "toy", 3).run, runs / "first")
    shutil.copytree(dcp_checkpoint("accelerate-fsdp1", "toy", 3).run, runs / "second")
    before = snapshot(runs)
    assert_refused(cli, runs, tmp_path, "several runs", "first/checkpoint", "second")
    assert snapshot(runs) == before


def test_universal_is_for_deepspeed(cli, tmp_path):
    run = dcp_checkpoint("torchtitan", "toy", 3).run
    result = cli("universal", run, tmp_path / "universal")
    assert result.exit_code == 2 and len(result.error_lines) == 1, result.stderr
    assert "is a PyTorch distributed checkpoint (DCP)" in result.stderr and not (tmp_path / "universal").exists()
