"""A tensor cut from another along its first dimension (a fused q/k/v split into q, k and v, or q, k and v joined
back) is a run of the input's bytes: a writer copies it file to file, its record's CRC-32 still checked, and a cast
of it reads just its own bytes."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, write_sat_run
from conftest import assert_refused
from safetensors.torch import load_file, save_file
from test_io_floor import record_data_offset

from cogexport import tensor_bytes
from cogexport.checkpoint.safetensors_files import SafetensorsCheckpoint
from cogexport.checkpoint.torch_archive import load_torch_file
from cogexport.keymap.pattern import KeyPattern
from cogexport.keymap.rules import Regroup
from cogexport.write.safetensors_file import write_safetensors

QKV = "model.diffusion_model.transformer.layers.0.attention.query_key_value.weight"
SPLIT = ("transformer_blocks.0.attn1.to_q.weight", "transformer_blocks.0.attn1.to_k.weight",
         "transformer_blocks.0.attn1.to_v.weight")




def flip_byte_in_qkv(run, at: int, mask: int) -> None:
    """Flip bits of the byte ``at`` bytes into the fused q/k/v record of the run's model states file (``at`` < 0:
    from the record's end)."""
    states = next(run.run_dir.glob("*/mp_rank_00_model_states.pt"))
    archive, tree = load_torch_file(states)
    stored = tree["module"][QKV]
    archive.close()
    with zipfile.ZipFile(states) as opened:
        size = next(i for i in opened.infolist() if i.filename.endswith(f"data/{stored.key}")).file_size
    data = bytearray(states.read_bytes())
    data[record_data_offset(states, f"data/{stored.key}") + at % size] ^= mask
    states.write_bytes(bytes(data))


def fp32_sat_run(folder: Path):
    original = build_tiny_transformer("5b", num_layers=2, seed=5)
    return write_sat_run(folder / "run", original.state_dict(), dtype=torch.float32), \
        config_folder(folder / "base", original)


def export_args(run, base, output: Path, dtype: str) -> list:
    return [run.run_dir, output, "--base", base, "--component", "transformer", "--dtype", dtype]


def test_a_split_qkv_is_copied_in_the_kernel_and_checked(tmp_path, cli, counted):
    """An fp32 SAT run to fp32: every tensor, the q, k and v cut from SAT's fused query_key_value among them, is
    copied file to file, and equals the weights the run was written from."""
    run, base = fp32_sat_run(tmp_path)
    result = cli(*export_args(run, base, tmp_path / "out", "fp32"))
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert set(written) == set(run.expected) and set(SPLIT) <= set(written)
    assert all(torch.equal(written[name], tensor) for name, tensor in run.expected.items())
    assert counted.bytes["copy_file_range"] == sum(tensor.nbytes for tensor in written.values())
    assert counted.ranges["copy_file_range"] >= sum(1 for tensor in written.values() if tensor.nbytes)


def test_a_damaged_byte_under_a_copied_split_is_refused(tmp_path, cli):
    """A byte of the fused q/k/v record flipped where k is cut from: the copy of k fails the record's CRC-32."""
    run, base = fp32_sat_run(tmp_path / "inputs")
    qkv_bytes = 3 * run.expected[SPLIT[1]].nbytes
    flip_byte_in_qkv(run, qkv_bytes // 3 + 5, 0x10)  # inside k's third
    assert_refused(cli, tmp_path, export_args(run, base, tmp_path / "out", "fp32"), "fails its CRC-32 check",
                   inputs=[run.run_dir, base])


@pytest.mark.parametrize("window", [None, 64])
def test_a_cast_split_reads_its_own_bytes(window, tmp_path, cli, counted, monkeypatch):
    """fp32 to bf16: q, k and v are cast, so loaded, each from its third of the fused record (mapped whole, or 64
    bytes at a time, each window's bytes told to the record's CRC-32 check in turn); only the tensors kept in fp32 are
    copied."""
    if window is not None:
        monkeypatch.setattr(tensor_bytes, "CAST_WINDOW", window)
    run, base = fp32_sat_run(tmp_path)
    result = cli(*export_args(run, base, tmp_path / "out", "bf16"))
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    for name in SPLIT:
        assert torch.equal(written[name], run.expected[name].to(torch.bfloat16)), name
    assert counted.bytes["copy_file_range"] == sum(t.nbytes for t in written.values() if t.dtype == torch.float32)


def rule(kind: str, sources: tuple[str, ...], chunks: tuple[int, ...], targets: tuple[str, ...],
         target_chunks: tuple[tuple[int, ...], ...], dim: int = 0) -> Regroup:
    return Regroup(kind, tuple(KeyPattern(s, {}) for s in sources), chunks, tuple(KeyPattern(t, {}) for t in targets),
                   target_chunks, dim)


@pytest.mark.parametrize("shape, dim, ranged", [((12, 5), 0, True), ((1, 12, 5), 1, True), ((4, 12), 1, False)])
def test_splits_and_joins_of_safetensors_tensors(shape, dim, ranged, tmp_path, counted):
    """A split along dim 0 (or after leading sizes of 1) and the join back are byte ranges of the inputs; a split
    along another dimension is not (its chunks interleave) and is loaded and cut as before. Both write what torch's
    own chunk and cat make."""
    generator = torch.Generator().manual_seed(0)
    truth = {"qkv": torch.randn(*shape, generator=generator), "other": torch.randn(3, generator=generator)}
    save_file(truth, tmp_path / "input.safetensors")
    split = rule("chunk", ("qkv",), (3,), ("q", "k", "v"), ((0,), (1,), (2,)), dim)
    with SafetensorsCheckpoint(tmp_path / "input.safetensors") as source:
        parts = split.build([source["qkv"]], ["qkv"], [0, 1, 2])
        assert all((part.byte_ranges() is not None) == ranged for part in parts.values())
        pieces = dict(zip("qkv", (parts[i] for i in range(3))))
        joined = split.inverse().build([pieces["q"], pieces["k"], pieces["v"]], ["q", "k", "v"], [0])[0]
        # k and v swapped: a join of chunks in another order than stored
        swapped = rule("regroup", ("qkv",), (3,), ("kvq",), ((1, 2, 0),), dim).build([source["qkv"]], ["qkv"], [0])[0]
        write_safetensors(tmp_path / "ours.safetensors", {**pieces, "qkv": joined, "kvq": swapped})
        loaded = {name: tensor.load() for name, tensor in {**pieces, "qkv": joined, "kvq": swapped}.items()}
    q, k, v = torch.chunk(truth["qkv"], 3, dim=dim)
    expected = {"q": q, "k": k, "v": v, "qkv": truth["qkv"], "kvq": torch.cat([k, v, q], dim=dim)}
    assert all(torch.equal(loaded[name], tensor) for name, tensor in expected.items())
    save_file({name: tensor.clone().contiguous() for name, tensor in expected.items()}, tmp_path / "theirs.safetensors")
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    assert counted.bytes["copy_file_range"] == (sum(t.nbytes for t in expected.values()) if ranged else 0)


@pytest.mark.parametrize("window", [None, 6000])
def test_casts_are_read_from_a_memory_map_to_the_bit(window, tmp_path, monkeypatch):
    """A cast of a tensor whose bytes lie in a file (cast_ranges: from a memory map of the file) equals torch's own
    cast of the loaded tensor, at offsets and sizes that fall anywhere in the file's pages; mapped whole, or a window
    at a time (6000 bytes: most tensors here take several)."""
    if window is not None:
        monkeypatch.setattr(tensor_bytes, "CAST_WINDOW", window)
    generator = torch.Generator().manual_seed(1)
    truth = {"odd": torch.randn(4099, generator=generator), "scalar": torch.tensor(3.3),
             "wide": torch.randn(3, 70001, generator=generator) * 1e4,
             "specials": torch.tensor([float("nan"), float("inf"), -0.0, 1e-40, 65504.0, 1e39]),
             "half": torch.randn(513, generator=generator).half(),
             "brain": torch.randn(77, generator=generator).bfloat16()}
    save_file(truth, tmp_path / "input.safetensors")
    with SafetensorsCheckpoint(tmp_path / "input.safetensors") as source:
        for name, stored in source.items():
            assert stored.byte_ranges() is not None
            for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
                if dtype != stored.dtype:
                    cast = stored.to(dtype).load()
                    expected = truth[name].to(dtype)
                    assert cast.dtype == dtype and cast.shape == expected.shape, (name, dtype)
                    assert torch.equal(cast.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)), \
                        (name, dtype)  # bit for bit: NaN, -0.0 and subnormals too


@pytest.mark.parametrize("window, at", [(None, 7), (64, 7), (64, -5)])
def test_a_cast_from_a_damaged_record_is_refused(window, at, tmp_path, cli, monkeypatch):
    """bf16 SAT weights exported to fp32 are cast from the mapped record: a flipped byte fails its CRC-32, in the
    first or the last of the windows a record is mapped in (64 bytes: the record takes many)."""
    if window is not None:
        monkeypatch.setattr(tensor_bytes, "CAST_WINDOW", window)
    original = build_tiny_transformer("5b", num_layers=2, seed=6)
    run = write_sat_run(tmp_path / "inputs" / "run", original.state_dict())
    base = config_folder(tmp_path / "inputs" / "base", original)
    flip_byte_in_qkv(run, at, 0x04)
    assert_refused(cli, tmp_path, export_args(run, base, tmp_path / "out", "fp32"), "fails its CRC-32 check",
                   inputs=[run.run_dir, base])
