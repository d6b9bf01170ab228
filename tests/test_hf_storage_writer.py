"""Saves of PyTorch's Hugging Face storage writer (torch.distributed.checkpoint.HuggingFaceStorageWriter), made by
real FSDP2 training on 2 and 3 gloo ranks (uneven and empty pieces) in each layout it writes: per rank, per rank with
an fqn_to_index_mapping, consolidated (sharded/ beside the whole files), and torchtitan's run folder (step-1 a plain
DCP save, step-2 the consolidated Hugging Face save). Every tensor read, consolidated or exported is torch.equal to
the weights gathered inside training; damage to the pieces is one line; one rank's file is never read as a model."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, snapshot
from dcp_fixtures import hf_storage_checkpoint
from safetensors.torch import load_file, save_file

from cogexport import open_checkpoint
from cogexport.errors import CogExportError
from cogexport.write import byte_copy

RUNS = [("wan-t2v", 2), ("wan-t2v", 3), ("toy", 3)]  # the toy: a dim-1 shard, replicated buffers, an int64 one
PER_RANK = ("distributed", "mapping")


def layouts(model: str) -> tuple[str, ...]:
    return PER_RANK if model == "toy" else (*PER_RANK, "lone", "consolidated", "consolidated/sharded")


def written(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def assert_exact(tensors: dict[str, torch.Tensor], truth: dict[str, torch.Tensor]) -> None:
    assert set(tensors) == set(truth)
    for name, tensor in truth.items():
        assert tensors[name].dtype == tensor.dtype and torch.equal(tensors[name], tensor), name


@pytest.mark.parametrize("model, world_size", RUNS, ids=[f"{m}-ws{w}" for m, w in RUNS])
def test_every_layout_reads_the_weights_gathered_in_training(model, world_size):
    run = hf_storage_checkpoint(model, world_size)
    for layout in layouts(model):
        with open_checkpoint(run.layout(layout)) as checkpoint:
            assert_exact({name: checkpoint[name].load() for name in checkpoint}, run.weights)
            # exactly the pieces' bytes (the consolidated files: each whole tensor once), never the sharded/ copy
            assert sum(checkpoint.bytes_read().values()) == sum(t.nbytes for t in run.weights.values()), layout
            assert not any("sharded" in path for path in checkpoint.bytes_read()) or layout.endswith("sharded")
            assert checkpoint.info.format == "hf-storage"
            if layout in (*PER_RANK, "lone"):
                assert checkpoint.info.facts.world_size == world_size
                assert f"ranks 1-{world_size}" in " ".join(checkpoint.info.notes)


@pytest.mark.parametrize("model, world_size", RUNS[:2], ids=["ws2", "ws3"])
def test_consolidate_and_export_each_layout_exactly(model, world_size, tmp_path, cli):
    run = hf_storage_checkpoint(model, world_size)
    base = run.base(tmp_path / "base")
    for layout in layouts(model):
        out = tmp_path / layout.replace("/", "-")
        byte_copy.COUNTS.reset()
        result = cli("consolidate", run.layout(layout), out / "consolidated")
        assert result.exit_code == 0, result.stderr
        assert_exact(written(out / "consolidated"), run.weights)
        # every piece is a block of whole rows: the bytes are copied file to file, none loaded
        assert sum(byte_copy.COUNTS.bytes.values()) == sum(t.nbytes for t in run.weights.values()), layout
        result = cli(run.layout(layout), out / "exported", "--base", base, "--dtype", "fp32")
        assert result.exit_code == 0, result.stderr
        assert_exact(written(out / "exported"), run.weights)


def test_a_rank_with_nothing_to_write_writes_no_file():
    """The one-row table alone in file 2, at 3 ranks: ranks 2 and 3 hold the same empty piece, the writer keeps one,
    and the other rank writes no file 2. That is a whole save (the files of ranks with data are all there)."""
    run = hf_storage_checkpoint("wan-t2v", 3)
    names = [p.name for p in run.layout("lone").iterdir()]
    assert sum("model-00001-of-00002" in n for n in names) == 3 and sum("model-00002-of-00002" in n for n in names) == 2
    with open_checkpoint(run.layout("lone")) as checkpoint:
        assert_exact({name: checkpoint[name].load() for name in checkpoint}, run.weights)


def test_torchtitan_run_folder_reads_the_newest_step_whatever_its_format(tmp_path, cli):
    """step-1 a plain DCP save, step-2 the last-step Hugging Face save: step-2 is read and named; --tag step-1 reads
    the older save, equal to what torch's own dcp_to_torch_save makes of it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = hf_storage_checkpoint("wan-t2v", 2)
    folder = run.layout("torchtitan")
    result = cli("consolidate", folder, tmp_path / "newest")
    assert result.exit_code == 0, result.stderr
    assert "took the newest step step-2" in result.stderr and "sharded/ are the same save" in result.stderr
    assert_exact(written(tmp_path / "newest"), run.weights)
    with open_checkpoint(folder) as checkpoint:
        assert (checkpoint.info.tag, checkpoint.info.step, checkpoint.info.tags) == ("step-2", 2, ["step-1", "step-2"])
        assert "step-2" in checkpoint.info.origin and "None" not in checkpoint.info.origin
        assert checkpoint.info.picked.startswith("took the newest step step-2")

    result = cli("consolidate", folder, tmp_path / "older", "--tag", "step-1")
    assert result.exit_code == 0, result.stderr
    dcp_to_torch_save(str(folder / "checkpoint" / "step-1"), str(tmp_path / "torch.pt"))
    theirs = {k: v for k, v in torch.load(tmp_path / "torch.pt", weights_only=False).items() if k in run.weights}
    assert_exact(written(tmp_path / "older"), theirs)
    assert not all(torch.equal(theirs[name], run.weights[name]) for name in theirs)  # an older step indeed


def test_a_folder_holding_only_the_hugging_face_step(tmp_path, cli):
    folder = Path(shutil.copytree(hf_storage_checkpoint("wan-t2v", 2).layout("torchtitan"), tmp_path / "outputs"))
    shutil.rmtree(folder / "checkpoint" / "step-1")
    result = cli("consolidate", folder, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "read checkpoint/step-2, the only checkpoint" in result.stderr
    assert_exact(written(tmp_path / "out"), hf_storage_checkpoint("wan-t2v", 2).weights)


def test_inspect_says_what_the_save_is(cli):
    run = hf_storage_checkpoint("wan-t2v", 3)
    report = json.loads(cli("inspect", run.layout("mapping"), "--json").stdout)
    assert (report["format"], report["world_size"], report["usable"]) == ("hf-storage", 3, True)
    assert report["files"]["count"] == 9 and report["models"]["transformer"]["family"] == "Wan"
    text = cli("inspect", run.layout("consolidated")).stdout
    assert "HuggingFaceStorageWriter (consolidated)" in text and "sharded/ are the same save" in text


# -- one rank's file ---------------------------------------------------------------------------------------------
def test_one_rank_file_is_never_a_model(tmp_path, cli):
    """Pointing at a rank file (or giving two) is refused with one line naming the folder to point at; a rank's
    file renamed is still known by its pieces' offsets."""
    folder = Path(shutil.copytree(hf_storage_checkpoint("wan-t2v", 2).layout("distributed"), tmp_path / "save"))
    files = sorted(folder.iterdir())
    for command in ("consolidate", "inspect"):
        args = [command, files[0]] + ([tmp_path / "out"] if command == "consolidate" else [])
        assert_refused(cli, tmp_path, args, "rank 1's file of a distributed save", f"point at its folder {folder}")
    assert_refused(cli, tmp_path, ["consolidate", *files, tmp_path / "out"], "rank 1's file", "point at its folder")
    renamed = tmp_path / "model.safetensors"
    shutil.copy(files[1], renamed)
    assert_refused(cli, tmp_path, ["consolidate", renamed, tmp_path / "out"], "holds pieces of tensors saved by "
                   "several ranks", inputs=[renamed])


# -- damage ------------------------------------------------------------------------------------------------------
def header(file: Path) -> dict:
    data = file.read_bytes()
    return json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])


def rewrite_sharding_info(file: Path, change) -> None:
    """Rewrite a rank file's DCP_SHARDING_INFO (the tensors' bytes stay where they are, after the new header)."""
    data = file.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    info = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
    change(info)
    header["__metadata__"]["DCP_SHARDING_INFO"] = json.dumps(info)
    encoded = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + size:])


@pytest.fixture
def per_rank_copy(tmp_path) -> Path:
    return Path(shutil.copytree(hf_storage_checkpoint("wan-t2v", 3).layout("mapping"), tmp_path / "save"))


def rank_file(folder: Path, rank: int, index: int = 1) -> Path:
    return folder / f"shard-{rank:05d}-model-{index:05d}-of-00003.safetensors"


@pytest.mark.parametrize("rank, shift, phrase", [(3, +1, "hold 32 of the 33 elements"), (2, -1, "overlap"),
                                                  (2, +1, "overlap")])
def test_a_piece_moved(rank, shift, phrase, per_rank_copy, tmp_path, cli):
    """A norm weight of 32 rows in pieces of 11, 11 and 10: rank 3's placed one row later (a gap before it, and the
    tensor seemingly one row longer), rank 2's one row earlier or later (over rank 1's or rank 3's rows)."""
    name = "blocks.0.attn1.norm_q.weight"

    def move(info):
        info[name]["saved_offsets"][0] += shift

    rewrite_sharding_info(rank_file(per_rank_copy, rank), move)
    assert_refused(cli, tmp_path, ["consolidate", per_rank_copy, tmp_path / "out"], name, phrase)


def test_a_missing_rank_is_named(per_rank_copy, tmp_path, cli):
    for index in (1, 2, 3):
        rank_file(per_rank_copy, 2, index).unlink()
    assert_refused(cli, tmp_path, ["consolidate", per_rank_copy, tmp_path / "out"], "rank 2 of 3's file",
                   "shard-00002-model-00001-of-00003.safetensors is missing")


@pytest.mark.parametrize("world_size, rank", [(3, 2), (3, 3), (2, 2)])
def test_one_missing_file_of_a_mapped_save_is_named(world_size, rank, tmp_path, cli):
    """The last rank's file too: its pieces end the tensors, so without it they would tile shorter tensors (at 2
    ranks, each left in one piece, as if saved whole)."""
    folder = Path(shutil.copytree(hf_storage_checkpoint("wan-t2v", world_size).layout("mapping"), tmp_path / "save"))
    rank_file(folder, rank, 2).unlink()
    assert_refused(cli, tmp_path, ["consolidate", folder, tmp_path / "out"],
                   f"shard-{rank:05d}-model-00002-of-00003.safetensors is missing", "are not in the others")


def test_a_rank_file_copied_over_another(per_rank_copy, tmp_path, cli):
    shutil.copyfile(rank_file(per_rank_copy, 1), rank_file(per_rank_copy, 2))
    assert_refused(cli, tmp_path, ["consolidate", per_rank_copy, tmp_path / "out"], "overlap",
                   "shard-00001-model-00001-of-00003.safetensors", "shard-00002-model-00001-of-00003.safetensors")


def test_two_rank_files_swapped_are_still_the_same_save(per_rank_copy, tmp_path, cli):
    """Each piece's place is written in its own header: rank 1's and rank 3's files swapped (pieces of 11 and 10 rows)
    still make exactly the saved tensors. Nothing but the name says whose a file is, and the name places nothing."""
    first, third = rank_file(per_rank_copy, 1), rank_file(per_rank_copy, 3)
    first.rename(tmp_path / "swap")
    third.rename(first)
    (tmp_path / "swap").rename(third)
    result = cli("consolidate", per_rank_copy, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert_exact(written(tmp_path / "out"), hf_storage_checkpoint("wan-t2v", 3).weights)


def test_pieces_of_two_dtypes(per_rank_copy, tmp_path, cli):
    """A rank file of another save (the same names and places, another dtype) among the others."""
    victim = rank_file(per_rank_copy, 3)
    metadata = header(victim)["__metadata__"]
    save_file({name: tensor.to(torch.bfloat16) for name, tensor in load_file(victim).items()}, victim,
              metadata=metadata)
    assert_refused(cli, tmp_path, ["consolidate", per_rank_copy, tmp_path / "out"], "torch.bfloat16",
                   "not of one save")


def test_a_consolidated_save_whose_pieces_are_another_save(tmp_path, cli):
    folder = Path(shutil.copytree(hf_storage_checkpoint("wan-t2v", 2).layout("consolidated"), tmp_path / "save"))
    shutil.rmtree(folder / "sharded")
    shutil.copytree(hf_storage_checkpoint("toy", 3).layout("distributed"), folder / "sharded")
    before = snapshot(folder)
    assert_refused(cli, tmp_path, ["consolidate", folder, tmp_path / "out"], "not the same save",
                   "model.safetensors.index.json")
    assert snapshot(folder) == before
    with pytest.raises(CogExportError, match="not the same save"):
        open_checkpoint(folder)


def test_the_checkpoint_read_is_named_in_one_phrase():
    """info.origin, for lines such as consolidate's "from ...": never "tag None (step None)" for a save without tags."""
    run = hf_storage_checkpoint("wan-t2v", 2)
    expected = {"consolidated": "the consolidated Hugging Face writer save", "mapping": "the per-rank Hugging Face "
                "writer save"}
    for layout, what in expected.items():
        with open_checkpoint(run.layout(layout)) as checkpoint:
            assert checkpoint.info.origin == f"{what} {run.layout(layout)}"
            assert (checkpoint.info.tag, checkpoint.info.step, checkpoint.info.picked) == (None, None, "")
