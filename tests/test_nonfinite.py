"""NaN and infinite values are never passed on silently (issue 40): every writer refuses a tensor holding any, in one
line naming it with how many of each, exit 2, nothing written and the input unchanged, unless --allow-nonfinite,
which writes it and names it in a note; inspect lists it. The inputs are real: a Diffusers model's safetensors
weights changed in place (as flipped bytes change them: the format has no checksum), DeepSpeed ZeRO runs of the
fixtures with a master or a moment gone bad (re-saved, so their CRC-32s hold), a DCP save, a LoRA file, GGUF and fp8
exports, and a torchrun job of two gloo ranks. Each writer's path is met: tensors copied file to file (safetensors,
and masters behind their CRC-32 checks), cast, fused, streamed into torch.save records, quantized."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, leftovers, snapshot
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import load_file

from cogexport.finite_values import NonfiniteCount, count_nonfinite
from cogexport.lazy import ByteRange
from cogexport.write.value_watch import CopiedValues, ValueWatch

ZERO2 = DeepSpeedVariant(2, "bf16", 2)
FFN = "blocks.0.ffn.net.0.proj.weight"  # a weight no family keeps in fp32
WEIGHTS = "diffusion_pytorch_model.safetensors"
NAN, INF = float("nan"), float("inf")


def plant(path: Path, name: str, values: dict[int, float]) -> None:
    """Set elements of tensor ``name`` in the safetensors file ``path`` in place, bytes and nothing else."""
    data = bytearray(path.read_bytes())
    size = struct.unpack("<Q", data[:8])[0]
    entry = json.loads(data[8:8 + size])[name]
    dtype = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[entry["dtype"]]
    for index, value in values.items():
        at = 8 + size + entry["data_offsets"][0] + index * dtype.itemsize
        data[at:at + dtype.itemsize] = torch.tensor([value], dtype=dtype).view(torch.uint8).numpy().tobytes()
    path.write_bytes(bytes(data))


@pytest.fixture
def model(tmp_path):
    """A copy of the tiny Wan pipeline's fp32 transformer folder (Diffusers weights, one safetensors file)."""
    from wan_fixtures import tiny_wan_pipeline

    folder = tmp_path / "model"
    shutil.copytree(tiny_wan_pipeline("t2v") / "transformer", folder)
    return folder


# -- counting ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.float8_e5m2])
def test_every_float_dtype_is_counted_exactly(dtype):
    values = torch.ones(5000)
    values[[3, 70]], values[4000], values[17] = NAN, INF, -INF
    assert count_nonfinite(values.to(dtype)) == NonfiniteCount(2, 2, 5000)
    assert not count_nonfinite(torch.ones(5000).to(dtype))


def test_finite_values_whose_sum_overflows_are_not_counted():
    assert not count_nonfinite(torch.full((100_000,), 60000.0, dtype=torch.float16))
    assert not count_nonfinite(torch.full((10,), 3e38))  # a float32 sum past its range: counted, none found


def test_copied_pieces_of_any_size_count_each_value_once(tmp_path):
    """A copy hands its checks pieces of whole chunks, and after a short kernel copy pieces that cut a value in two:
    a value is counted by the piece it begins in, read from the file where that piece holds only its start."""
    values = torch.arange(1000, dtype=torch.float32)
    values[[0, 1, 500, 999]] = torch.tensor([NAN, INF, NAN, -INF])
    path = tmp_path / "values.bin"
    path.write_bytes(b"pad" + values.numpy().tobytes())
    part = ByteRange(str(path), 3, 4000)
    data = memoryview(bytearray(path.read_bytes()[3:]))
    watch = ValueWatch(allow=True)
    copied = CopiedValues(watch, "tensor 'w' of f", torch.float32, 4000)
    for start, stop in [(0, 6), (6, 1999), (1999, 2001), (2001, 3998), (3998, 4000)]:
        assert not watch.passed_on
        copied.check(part, start, data[start:stop])
    assert watch.passed_on == ["tensor 'w' of f (2 NaN and 2 infinite of 1,000 values)"]


# -- export: a safetensors release ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, workers", [("fp32", "1"), ("bf16", "1"), ("bf16", "2")])
def test_a_release_holding_nan_and_inf_is_refused_copied_or_cast(cli, tmp_path, model, counted, dtype, workers):
    """fp32 to fp32: every tensor is copied file to file and counted as its chunks are read back; to bf16 it is
    cast, in worker threads with --workers 2, and counted as loaded."""
    plant(model / WEIGHTS, FFN, {5: NAN, 9: INF, 10: -INF})
    size = load_file(model / WEIGHTS)[FFN].numel()
    args = [model, tmp_path / "out", "--dtype", dtype, "--workers", workers]
    assert_refused(cli, tmp_path, args, f"tensor '{FFN}' of {WEIGHTS}", f"1 NaN and 2 infinite of {size:,} values",
                   "nothing was written", "--allow-nonfinite", inputs=[model])
    counted.reset()
    result = cli(*args, "--allow-nonfinite")
    assert result.exit_code == 0, result.stderr
    assert f"written with NaN or infinite values, as --allow-nonfinite asked: tensor '{FFN}'" in result.stderr
    written = load_file(tmp_path / "out" / WEIGHTS)[FFN].flatten()
    assert written[5].isnan() and written[9] == INF and written[10] == -INF
    copied, stored = sum(counted.bytes.values()), sum(t.nbytes for t in load_file(model / WEIGHTS).values())
    assert copied == stored if dtype == "fp32" else copied < stored  # every tensor copied where nothing is cast


def test_a_cast_that_overflows_float16_is_refused(cli, tmp_path, model):
    """The values written are counted, not only those read: 1e6 is finite in fp32 and infinite in fp16."""
    plant(model / WEIGHTS, FFN, {0: 1e6, 1: -1e6})
    assert cli(model, tmp_path / "fp32", "--dtype", "fp32").exit_code == 0
    assert_refused(cli, tmp_path, [model, tmp_path / "out", "--dtype", "fp16"], f"tensor '{FFN}'",
                   "0 NaN and 2 infinite", inputs=[model])


def test_inspect_lists_the_tensor_and_says_what_safetensors_cannot_show(cli, model):
    plant(model / WEIGHTS, FFN, {7: NAN})
    result = cli("inspect", model / WEIGHTS)
    assert result.exit_code == 1
    assert f"problem       tensor '{FFN}' holds NaN or infinite values (1 NaN and 0 infinite" in result.stdout
    assert "safetensors keeps no checksum, so a changed value that is still finite cannot be told" in result.stdout
    report = json.loads(cli("inspect", model / WEIGHTS, "--json").stdout)
    assert (report["usable"], report["nonfinite_tensors"]) == (False, 1)
    folder = json.loads(cli("inspect", model, "--json").stdout)  # a Diffusers model folder's own report
    assert not folder["usable"] and FFN in folder["problems"][0]


# -- consolidate and universal: DeepSpeed and DCP -----------------------------------------------------------
def spoiled_zero2(tmp_path: Path, state: str) -> Path:
    """A copy of the ZeRO-2 fixture whose rank-1 optimizer file holds a NaN and an infinity in the middle of its
    fp32 master partition (``state`` "master"; away from the elements compared with the module's copy) or of its
    exp_avg, re-saved as DeepSpeed would have saved them."""
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(deepspeed_checkpoint(ZERO2).checkpoint, checkpoint)
    victim = checkpoint / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    saved = torch.load(victim, weights_only=False)  # our own fixture
    optimizer = saved["optimizer_state_dict"]
    partition = optimizer["single_partition_of_fp32_groups"][0] if state == "master" else \
        optimizer["base_optimizer_state"]["state"][0]["exp_avg"]
    with torch.no_grad():
        partition[partition.numel() // 2:partition.numel() // 2 + 2] = torch.tensor([NAN, INF])
    torch.save(saved, victim)
    return checkpoint


@pytest.mark.parametrize("command, options, phrase", [
    ("consolidate", (), "of model.safetensors"),  # the masters copied file to file, behind their CRC-32 checks
    ("consolidate", ("--dtype", "bf16"), "of model.safetensors"),  # cast
    ("universal", (), "'param' of zero/block.2.weight/fp32.pt"),  # streamed into torch.save records
])
def test_a_deepspeed_master_holding_nan_is_refused(cli, tmp_path, command, options, phrase):
    checkpoint = spoiled_zero2(tmp_path, "master")
    assert_refused(cli, tmp_path, [command, checkpoint, tmp_path / "out", *options], "block.2.weight", phrase,
                   "1 NaN and 1 infinite of 377 values")
    result = cli(command, checkpoint, tmp_path / "out", *options, "--allow-nonfinite")
    assert result.exit_code == 0, result.stderr
    assert "cogexport: warning: written with NaN or infinite values, as --allow-nonfinite asked" in result.stderr


def test_universal_refuses_an_optimizer_moment_holding_nan(cli, tmp_path):
    checkpoint = spoiled_zero2(tmp_path, "exp_avg")
    assert cli("consolidate", checkpoint, tmp_path / "weights").exit_code == 0  # the weights themselves are fine
    shutil.rmtree(tmp_path / "weights")
    assert_refused(cli, tmp_path, ["universal", checkpoint, tmp_path / "out"], "exp_avg.pt",
                   "1 NaN and 1 infinite")
    inspected = cli("inspect", checkpoint)
    assert inspected.exit_code == 0 and "every value finite" in inspected.stdout  # it reports the model's values


def test_inspect_of_a_deepspeed_run_lists_the_master(cli, tmp_path):
    result = cli("inspect", spoiled_zero2(tmp_path, "master"))
    assert result.exit_code == 1 and "tensor 'block.2.weight' holds NaN or infinite values" in result.stdout
    assert "checked: every record's CRC-32" in result.stdout and "1 tensor holds NaN or infinite" in result.stdout


def test_a_dcp_save_holding_inf_is_refused(cli, tmp_path):
    import torch.distributed.checkpoint as dcp

    weights = {"a.weight": torch.randn(8, 4), "b.weight": torch.randn(16)}
    weights["b.weight"][3] = -INF
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": weights}, checkpoint_id=tmp_path / "run")
    assert_refused(cli, tmp_path, ["consolidate", tmp_path / "run", tmp_path / "out"], "tensor 'b.weight'",
                   "0 NaN and 1 infinite of 16 values")


def test_two_ranks_of_a_torchrun_job_refuse_it_and_publish_nothing(tmp_path):
    from test_torchrun import torchrun

    checkpoint = spoiled_zero2(tmp_path, "master")
    before = snapshot(checkpoint)
    done = torchrun(2, "consolidate", checkpoint, tmp_path / "out", "--max-shard-size", "2000")
    assert done.returncode != 0
    assert "tensor 'block.2.weight' of model-" in done.stderr and "1 NaN and 1 infinite" in done.stderr
    assert "nothing was published" in done.stderr  # the other rank
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == [] and snapshot(checkpoint) == before
    allowed = torchrun(2, "consolidate", checkpoint, tmp_path / "out", "--max-shard-size", "2000",
                       "--allow-nonfinite")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "as --allow-nonfinite asked: tensor 'block.2.weight'" in allowed.stderr


# -- LoRA, GGUF and fp8 -------------------------------------------------------------------------------------------
@pytest.fixture
def lora(tmp_path):
    """A ComfyUI LoRA file for the tiny Wan t2v pipeline, one of its B matrices holding a NaN; and the pipeline."""
    from test_lora_expert_pairs import MODULES, comfy
    from test_lora_wan import make_adapter
    from wan_fixtures import tiny_wan_pipeline

    pipeline = tiny_wan_pipeline("t2v")
    adapter = make_adapter(load_file(pipeline / "transformer" / WEIGHTS), MODULES, seed=5)
    path = comfy(tmp_path / "lora" / "run.safetensors", adapter)
    name = sorted(key for key in load_file(path) if key.endswith("lora_B.weight"))[0]
    plant(path, name, {2: NAN})
    return path, pipeline


def test_a_lora_adapter_holding_nan_is_refused_written_and_fused(cli, tmp_path, lora):
    path, pipeline = lora
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", pipeline / "transformer"], "lora_B",
                   "1 NaN", inputs=[path])
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", pipeline, "--lora", "fuse", "--dtype", "fp32"],
                   "of diffusion_pytorch_model.safetensors", "NaN", inputs=[path])
    fused = cli(path, tmp_path / "out", "--base", pipeline, "--lora", "fuse", "--allow-nonfinite")
    assert fused.exit_code == 0 and "as --allow-nonfinite asked" in fused.stderr


def test_quantized_files_refuse_nan_and_float_types_write_it_when_asked(cli, tmp_path, model):
    plant(model / WEIGHTS, FFN, {3: NAN})
    # a block's scale is made from its values: never, even when asked
    assert_refused(cli, tmp_path, [model, tmp_path / "out", "--to", "gguf", "--quant", "Q8_0", "--allow-nonfinite"],
                   "ffn.0.weight", "1 NaN", "Q8_0 blocks cannot hold them", inputs=[model])
    assert_refused(cli, tmp_path, [model, tmp_path / "out", "--to", "comfyui", "--quant", "fp8",
                                   "--allow-nonfinite"], "ffn.0.weight", "1 NaN", "weight's scale is made from its values",
                   inputs=[model])
    assert_refused(cli, tmp_path, [model, tmp_path / "out", "--to", "gguf", "--quant", "F16"], "ffn.0.weight",
                   "--allow-nonfinite", inputs=[model])
    written = cli(model, tmp_path / "out", "--to", "gguf", "--quant", "F16", "--allow-nonfinite")
    assert written.exit_code == 0, written.stderr
    assert "as --allow-nonfinite asked: tensor 'blocks.0.ffn.0.weight'" in written.stderr
