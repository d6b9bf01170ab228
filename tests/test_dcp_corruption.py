"""Damage to a DCP save that the fuzz (scripts/fuzz_checkpoints.py) turned into silently wrong output or a traceback
before the reader checked for it: a rank file copied over another of the same layout, .metadata whose records share
or leave out bytes, names that disagree with their paths, a file longer than its records; and inspect checking the
chunks consolidate does not need. Each must end in one line, exit 2, nothing written, the input untouched."""

from __future__ import annotations

import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from dcp_fixtures import dcp_checkpoint
from safetensors.torch import load_file
from test_bad_input import assert_refused
from test_dcp_bad_input import copy_save, rewrite_metadata
from torch.distributed.checkpoint import FileSystemReader

from cogexport.checkpoint.torch_archive import TorchArchive
from cogexport.errors import CogExportError


def record(folder: Path, fqn: str, rows: int = 0):
    """The (index, storage info) of the chunk of ``fqn`` whose offset starts at row ``rows``."""
    storage = FileSystemReader(str(folder)).read_metadata().storage_data
    return next((index, info) for index, info in storage.items() if index.fqn == fqn and index.offset[0] == rows)


def test_a_rank_file_copied_over_another_of_the_same_layout(cli, tmp_path):
    """FSDP2 shards evenly here, so both model files have their chunks at the same places: a copy reads well, and
    nothing inside a .distcp says which rank wrote it. The two files' archives (their CRC-32s) give it away."""
    fixture = dcp_checkpoint("accelerate-fsdp2", "cogvideox-2b", 2)
    run = Path(shutil.copytree(fixture.run, tmp_path / "run"))
    model = run / "checkpoint-2" / "pytorch_model_fsdp_0"
    assert (model / "__0_0.distcp").stat().st_size == (model / "__1_0.distcp").stat().st_size
    shutil.copyfile(model / "__1_0.distcp", model / "__0_0.distcp")
    assert_refused(cli, run, tmp_path, "__0_0.distcp and __1_0.distcp hold exactly the same chunks", "copied over")
    inspected = cli("inspect", run, "--json")
    assert inspected.exit_code == 1
    assert any("hold exactly the same chunks" in p for p in json.loads(inspected.stdout)["problems"])


@pytest.mark.parametrize("change, phrases", [
    ("point at another chunk", ("places model.norm.bias and model.norm.weight on the same bytes of __0_0.distcp",)),
    ("reach over the next", ("places model.norm.weight and model.norm.bias on the same bytes of __0_0.distcp",)),
    ("leave one out", ("distcp: bytes", "belong to no entry")),
])
def test_metadata_whose_records_share_or_leave_out_bytes(change, phrases, cli, tmp_path):
    """Each record of a .distcp is its own: norm.weight's and norm.bias's first chunks are archives of one length,
    so a record pointed at the other's bytes reads as a valid chunk (and a record left out, with its entry, drops a
    tensor from the model without a trace) unless the records are checked to fill their files exactly."""
    run = copy_save(tmp_path)
    step = run / "checkpoint"
    weight, bias = record(step, "model.norm.weight"), record(step, "model.norm.bias")
    assert weight[1].length == bias[1].length and weight[1].offset + weight[1].length == bias[1].offset

    def damage(metadata):
        if change == "point at another chunk":
            metadata.storage_data[weight[0]] = metadata.storage_data[bias[0]]
        elif change == "reach over the next":
            metadata.storage_data[weight[0]].length += bias[1].length
        else:
            metadata.state_dict_metadata.pop("model.side.bias")
            metadata.planner_data.pop("model.side.bias")
            metadata.storage_data = {i: r for i, r in metadata.storage_data.items() if i.fqn != "model.side.bias"}

    rewrite_metadata(step, damage)
    assert_refused(cli, run, tmp_path, *phrases)


def test_a_record_boundary_moved_inside_the_file(cli, tmp_path):
    """The records still fill the file, but one ends 8 bytes into the next archive: it is no whole archive."""
    run = copy_save(tmp_path)
    step = run / "checkpoint"
    weight, bias = record(step, "model.norm.weight"), record(step, "model.norm.bias")

    def damage(metadata):
        metadata.storage_data[weight[0]].length += 8
        metadata.storage_data[bias[0]].offset += 8
        metadata.storage_data[bias[0]].length -= 8

    rewrite_metadata(step, damage)
    assert_refused(cli, run, tmp_path, "__0_0.distcp", f"bytes {weight[1].offset}-{bias[1].offset + 8}",
                   "is not a whole torch.save archive")


@pytest.mark.parametrize("damage, phrases", [
    ("rename the path", ("the entry 'model.block.0.weight' is filed under the path 'model.block.0.weigh'",)),
    ("drop the path", ("the entry 'model.block.0.weight' has no path",)),
])
def test_names_that_disagree_with_their_paths(damage, phrases, cli, tmp_path):
    """A flipped byte in a path put block.0.weight under another name (consolidate wrote it so) or outside the model
    (consolidate left it out); DCP's flat names are their paths joined with dots, so the two must agree."""
    run = copy_save(tmp_path)

    def change(metadata):
        if damage == "rename the path":
            metadata.planner_data["model.block.0.weight"] = ("model", "block.0.weigh")
        else:
            del metadata.planner_data["model.block.0.weight"]

    rewrite_metadata(run / "checkpoint", change)
    assert_refused(cli, run, tmp_path, ".metadata is corrupt", *phrases)


def test_a_rank_file_longer_than_its_records(cli, tmp_path):
    run = copy_save(tmp_path)
    victim = run / "checkpoint" / "__1_0.distcp"
    size = victim.stat().st_size
    with open(victim, "ab") as handle:
        handle.write(b"\0" * 100)
    assert_refused(cli, run, tmp_path, f"__1_0.distcp has {size + 100} bytes but its .metadata accounts for {size}")


def test_inspect_checks_the_optimizer_chunks_too(cli, tmp_path):
    """A flipped byte in an Adam moment leaves the weights exact (consolidate reads no optimizer state), but inspect
    reads every chunk and lists it."""
    run = copy_save(tmp_path)
    step = run / "checkpoint"
    _, info = record(step, "optimizer.state.block.0.weight.exp_avg")
    archive = (step / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
    member = zipfile.ZipFile(io.BytesIO(archive)).getinfo("archive/data/0")
    name_length, extra_length = struct.unpack_from("<HH", archive, member.header_offset + 26)
    position = info.offset + member.header_offset + 30 + name_length + extra_length + 7  # in the tensor's bytes
    with open(step / info.relative_path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ 0x10]))
    done = cli("consolidate", run, tmp_path / "out")
    assert done.exit_code == 0, done.stderr
    weights = dcp_checkpoint("plain", "toy", 3).weights
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert written.keys() == weights.keys() and all(torch.equal(written[n], t) for n, t in weights.items())
    inspected = cli("inspect", run, "--json")
    assert inspected.exit_code == 1
    problems = json.loads(inspected.stdout)["problems"]
    assert len(problems) == 1 and "__0_0.distcp" in problems[0] and "CRC-32" in problems[0], problems


def test_a_chunk_window_ending_in_a_false_zip64_record(tmp_path):
    """A window whose last bytes look like a zip64 end locator sent zipfile seeking before the window's start; a
    file answers that with OSError (zipfile then says "not a zip file"), and so must a window: one line, no
    traceback (the fuzz met it with one rank file copied over another of another size)."""
    locator = b"PK\x06\x07" + b"\0" * 16
    end = b"PK\x05\x06" + b"\0" * 18
    path = tmp_path / "__0_0.distcp"
    path.write_bytes(b"x" * 100 + locator + end)
    with pytest.raises(CogExportError, match="__0_0.distcp looks truncated"):
        TorchArchive(path, 100, len(locator) + len(end))
