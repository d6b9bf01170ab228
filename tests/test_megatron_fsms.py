"""Megatron-Core's distributed optimizer in its ``fully_sharded_model_space`` layout, saved with torch_dist (issue 42).

The data, tests/data/megatron-fsms-tp2/ (its README says how it was made), is a bf16 run at TP=2 x DP=2 whose
optimizer state was laid out by megatron-core 0.15.3's own ``sharded_param_state_fs_model_space`` over its own
DistributedDataParallel's buffer ranges and saved by its own torch_dist strategy, which stores each flattened tensor
under another shape and records the original in the .metadata (megatron_flattened.py); the truth was taken inside
the ranks before the save. Consolidate must give each trained parameter's fp32 master (its pieces put back from the
data-parallel ranks' flat ranges), the rest as saved, layer by layer (torch.equal), never an optimizer state."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from megatron_fixtures import unstacked
from safetensors.torch import load_file
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan

from cogexport import open_checkpoint

DATA = Path(__file__).parent / "data" / "megatron-fsms-tp2"
ITERATION = DATA / "run" / "iter_0000003"
FC2 = "decoder.layers.mlp.linear_fc2.weight"  # one layer's piece of it is split between the two data-parallel ranks
MCORE = "megatron.core.dist_checkpointing.strategies.torch"


def truth(prefix: str) -> dict[str, torch.Tensor]:
    tensors = load_file(DATA / "truth.safetensors")
    return unstacked({key[len(prefix):]: t for key, t in tensors.items() if key.startswith(prefix)})


def test_the_data_holds_a_piece_split_between_data_parallel_ranks():
    """What the layout is about: a rank's part of a parameter is a flat range of its piece, not the piece."""
    ranges = json.loads((DATA / "truth.json").read_text())["fp32_param_ranges_by_rank"]
    starts = {start for rank in ranges for key, start, _ in rank if key.endswith(FC2)}
    assert starts == {0, 64}, starts


def test_a_fully_sharded_model_space_run_consolidates_to_its_fp32_masters(cli, tmp_path):
    result = cli("consolidate", DATA / "run", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    masters, saved = truth("master."), truth("model.")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert_same_tensors(written, {name: masters.get(name, tensor.float()) for name, tensor in saved.items()})
    assert "read the fp32 masters (optimizer.state.fp32_param.*) of 9 parameters" in result.stderr
    assert not any("exp_avg" in name or "optimizer" in name for name in written)


def test_inspect_says_the_states_were_saved_flattened(cli):
    report = json.loads(cli("inspect", ITERATION, "--json").stdout)
    held = " ".join(report["contents"])
    assert "48 of them saved flattened (the distributed optimizer's fully_sharded_model_space" in held, held
    assert report["problems"] == []


def test_a_split_piece_is_read_from_both_ranks_ranges():
    checkpoint = open_checkpoint(DATA / "run")
    for layer in (0, 1):
        name = FC2.replace("layers.", f"layers.{layer}.")
        assert torch.equal(checkpoint[name].load(), truth("master.")[name]), name


def _copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / "run", tmp_path / "run"))


class _TorchOnly(pickle.Unpickler):
    """Reads megatron-core's .metadata as torch's own classes (its subclasses only add mcore_data)."""

    def find_class(self, module: str, name: str):
        if module == MCORE:
            return {"MCoreMetadata": Metadata, "MCoreSavePlan": SavePlan}[name]
        return super().find_class(module, name)


def _rewrite_metadata(iteration: Path, change) -> None:
    path = iteration / ".metadata"
    metadata = _TorchOnly(path.open("rb")).load()
    change(metadata)
    path.write_bytes(pickle.dumps(metadata))


def _drop_records(metadata) -> None:
    """As a tool re-saving the .metadata with torch's own classes would leave it: no mcore_data anywhere."""
    del metadata.mcore_data
    for plan in metadata.all_local_plans:
        plan.__dict__.pop("mcore_data", None)


def test_without_megatron_cores_record_the_bf16_weights_are_read_and_the_note_says_why(cli, tmp_path):
    run = _copy(tmp_path)
    _rewrite_metadata(run / "iter_0000003", _drop_records)
    result = cli("consolidate", run, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / "model.safetensors"),
                        {name: tensor.float() for name, tensor in truth("model.").items()})
    assert "stored flattened" in result.stderr and "mcore_data" in result.stderr
    assert "exact to the bf16 values" in result.stderr


def _record(key: str, shape) -> callable:
    def change(metadata) -> None:
        metadata.mcore_data[key] = {"nd_reformulated_orig_global_shape": tuple(shape)}
    return change


@pytest.mark.parametrize("change, named", [
    (_record(f"optimizer.state.fp32_param.{FC2}", (2, 16, 33)), "not megatron-core's flattened form"),
    (_record(f"optimizer.state.fp32_param.{FC2}", (2, 32, 16)), "is (2, 32, 16), its parameter"),
    (lambda metadata: metadata.mcore_data.pop(f"optimizer.state.exp_avg.{FC2}"), "records no original shape"),
    (_record("decoder.layers.mlp.linear_fc2.bias", (2, 16)), "not megatron-core's flattened form")],
    ids=["a shape that does not fit", "a shape that fits but is not its parameter's", "one record lost",
         "a record for a model tensor"])
def test_a_damaged_record_is_refused_in_one_line(change, named, cli, tmp_path):
    run = _copy(tmp_path)
    _rewrite_metadata(run / "iter_0000003", change)
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], named, inputs=[run])
