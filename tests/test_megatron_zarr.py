"""Megatron-Core iterations saved with the zarr backend as an input (issue 42, item 1).

The data, tests/data/megatron-zarr-tp2/ (its README says how it was made), is a bf16 run at TP=2 saved by megatron-core
0.15.3's own zarr strategy, which this venv's megatron-core no longer has; the truth was taken inside the ranks before
the save. Consolidate must give each trained parameter's fp32 master, the rest as saved, layer by layer (torch.equal),
never an optimizer state; damaged copies are refused in one line, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from megatron_fixtures import unstacked
from safetensors.torch import load_file

from cogexport import open_checkpoint

DATA = Path(__file__).parent / "data" / "megatron-zarr-tp2"
ITERATION = DATA / "run" / "iter_0000003"
QKV = "decoder.layers.self_attention.linear_qkv.weight"


def truth(prefix: str) -> dict[str, torch.Tensor]:
    tensors = load_file(DATA / "truth.safetensors")
    return unstacked({key[len(prefix):]: t for key, t in tensors.items() if key.startswith(prefix)})


def test_a_zarr_run_consolidates_to_its_fp32_masters_layer_by_layer(cli, tmp_path):
    result = cli("consolidate", DATA / "run", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    masters, saved = truth("master."), truth("model.")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert_same_tensors(written, {name: masters.get(name, tensor.float()) for name, tensor in saved.items()})
    assert "decoder.layers.1.self_attention.linear_qkv.weight" in written  # stacked on the layer axis, unstacked
    assert "read the fp32 masters (optimizer.state.fp32_param.*) of 9 parameters" in result.stderr
    assert "output_layer.weight" in result.stderr  # frozen: no master, read as saved, and said so


def test_inspect_names_the_backend_and_what_each_key_set_is(cli):
    report = json.loads(cli("inspect", ITERATION, "--json").stdout)
    assert report["format"] == "megatron" and report["sharded_backend"] == "zarr v1" and report["step"] == 3
    held = " ".join(report["contents"])
    for phrase in ("optimizer state (never weights)", "RNG states (never weights)", "_extra_state", "common.pt"):
        assert phrase in held, held
    assert report["problems"] == []


def test_one_layer_is_read_from_its_own_chunk_files_alone():
    checkpoint = open_checkpoint(DATA / "run")
    name = "decoder.layers.1.self_attention.linear_qkv.weight"
    tensor = checkpoint[name].load()
    assert torch.equal(tensor, truth("master.")[name])
    read = checkpoint.bytes_read()
    # layer 1's chunk files of its fp32 master (one per TP rank), and nothing else
    assert sorted(Path(path).relative_to(ITERATION).as_posix() for path in read) == [
        f"optimizer.state.fp32_param.{QKV}/1.{rank}.0" for rank in (0, 1)]
    assert sum(read.values()) == tensor.numel() * tensor.element_size()


def _damaged(tmp_path: Path, damage) -> Path:
    run = Path(shutil.copytree(DATA / "run", tmp_path / "run"))
    damage(run / "iter_0000003")
    return run


def _edit_zarray(folder: Path, **changes) -> None:
    path = folder / ".zarray"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _swap(first: Path, second: Path) -> None:
    first.rename(first.with_name("swap"))
    second.rename(first)
    first.with_name("swap").rename(second)


@pytest.mark.parametrize("damage, named", [
    (lambda it: (it / QKV / "1.1.0").unlink(), "the chunk file 1.1.0 is missing"),
    (lambda it: _edit_zarray(it / QKV, shape=[2, 24, 16]), "0.1.0 lies outside the array"),
    (lambda it: _edit_zarray(it / QKV, dtype="<f4"), "has 768 bytes, a chunk of [1, 24, 16]"),
    (lambda it: _edit_zarray(it / QKV, compressor={"id": "blosc"}), "compressor"),
    (lambda it: _edit_zarray(it / "output_layer.weight", shape=[31, 16]), "is not a multiple of its chunks"),
    (lambda it: (it / QKV / ".zarray").unlink(), "neither a zarr array"),
    (lambda it: (it / "output_layer.weight").rename(it / "rng_state" / "output_layer.weight"),
     "holds output_layer.weight"),
    (lambda it: _swap(it / "optimizer.state.fp32_param.decoder.layers.mlp.linear_fc2.bias",
                      it / "optimizer.state.fp32_param.decoder.layers.self_attention.linear_proj.bias"),
     "does not round to the model's saved bf16 copy")],
    ids=["a missing chunk", "a wrong .zarray shape", "a wrong .zarray dtype", "a compressor", "an uneven shape",
         "a lost .zarray", "a weight filed among the RNG states", "two masters swapped"])
def test_damaged_copies_are_refused_in_one_line(damage, named, cli, tmp_path):
    run = _damaged(tmp_path, damage)
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], named, inputs=[run])


def test_fully_reshardable_masters_of_a_zarr_save_are_read_too(cli, tmp_path):
    """The distributed optimizer's fully_reshardable layout (megatron-core 0.14-0.15 could save it with zarr) names
    each master optimizer.state.param.<key>, the fp32 norms' too (their own values): the bf16 parameters' masters
    are read, the norms as saved."""
    def as_fully_reshardable(iteration: Path) -> None:
        for folder in sorted(iteration.glob("optimizer.state.fp32_param.*")):
            folder.rename(iteration / folder.name.replace(".fp32_param.", ".param."))
        for norm in ("decoder.final_layernorm.weight", "decoder.final_layernorm.bias"):
            shutil.copytree(iteration / norm, iteration / f"optimizer.state.param.{norm}")

    run = _damaged(tmp_path, as_fully_reshardable)
    result = cli("consolidate", run, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    masters, saved = truth("master."), truth("model.")
    assert_same_tensors(load_file(tmp_path / "out" / "model.safetensors"),
                        {name: masters.get(name, tensor.float()) for name, tensor in saved.items()})
    assert "read the fp32 masters (optimizer.state.param.*) of 9 parameters" in result.stderr


def test_a_zarray_describing_billions_of_chunks_is_refused_at_once(cli, tmp_path):
    """The grid is never walked further than the chunk files there are."""
    run = _damaged(tmp_path, lambda it: _edit_zarray(it / "output_layer.weight", shape=[2 ** 31, 2 ** 31],
                                                     chunks=[1, 1]))
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], "describes 4611686018427387904 chunks",
                   inputs=[run])
