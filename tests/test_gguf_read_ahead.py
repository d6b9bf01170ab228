"""A GGUF job with workers reads the next tensors in a thread of its own while the feed's threads quantize and the
writer writes (cogexport/write/read_ahead.py): the file is the serial job's byte for byte, and what goes wrong
in a tensor read ahead (a NaN the quantizer refuses, a record whose CRC-32 fails) is the serial job's one line,
exit code 2, nothing written."""

from __future__ import annotations

import threading
import zipfile

import pytest
import torch
from conftest import assert_refused
from quantized_models import FAMILIES
from test_corruption import flip_byte, record_span

from cogexport.checkpoint import safetensors_files, torch_archive
from cogexport.lazy import LazyTensor
from cogexport.quantize import threads as pool_threads
from cogexport.write.read_ahead import ReadAhead


@pytest.fixture(scope="module")
def tiny_wan(tmp_path_factory):
    """A tiny Wan transformer saved as Diffusers saves it, as safetensors and as a torch.save file."""
    folder = tmp_path_factory.mktemp("read_ahead")
    model = FAMILIES["wan"].build()
    model.save_pretrained(folder / "model")
    model.save_pretrained(folder / "pickled", safe_serialization=False)
    return model, folder


@pytest.fixture
def read_in(monkeypatch):
    """The threads the source tensors are read in, by name (the pool numbers them: its prefix is kept)."""
    names: set[str] = set()
    monkeypatch.setattr(pool_threads, "MIN_PIECE_VALUES", 1 << 14)  # the tiny model's tensors go to the pool too
    real_read = safetensors_files.pread_into

    def pread_into(*args):
        names.add(threading.current_thread().name.rsplit("_", 1)[0])
        return real_read(*args)

    monkeypatch.setattr(safetensors_files, "pread_into", pread_into)
    return names


def gguf_bytes(folder) -> bytes:
    (path,) = folder.rglob("*.gguf")
    return path.read_bytes()


def test_reading_ahead_writes_the_serial_file(tiny_wan, read_in, cli, tmp_path):
    _, folder = tiny_wan
    files = {}
    for workers in ("1", "2"):
        read_in.clear()
        result = cli(folder / "model", tmp_path / f"w{workers}", "--to", "gguf", "--quant", "Q8_0",
                     "--workers", workers)
        assert result.exit_code == 0, result.stderr
        files[workers] = (gguf_bytes(tmp_path / f"w{workers}"), set(read_in))
    assert files["1"][1] == {"MainThread"} and files["2"][1] == {"cogexport-read"}
    assert files["1"][0] == files["2"][0]


def test_a_nan_in_a_tensor_read_ahead_is_one_line_and_nothing_is_written(tiny_wan, read_in, cli, tmp_path):
    model, _ = tiny_wan
    state = model.state_dict()
    state["blocks.0.attn1.to_v.weight"] = state["blocks.0.attn1.to_v.weight"].clone()
    state["blocks.0.attn1.to_v.weight"][7, 3] = float("nan")
    bad = FAMILIES["wan"].build()
    bad.load_state_dict(state)
    bad.save_pretrained(tmp_path / "bad")
    (tmp_path / "refusal").mkdir()
    assert_refused(cli, tmp_path / "refusal", [tmp_path / "bad", tmp_path / "refusal" / "out", "--to", "gguf",
                                               "--quant", "Q8_0", "--workers", "2"],
                   "self_attn.v.weight", "NaN or infinite", inputs=[tmp_path / "bad"])
    assert read_in == {"cogexport-read"}


def test_a_damaged_record_read_ahead_is_one_line_and_nothing_is_written(tiny_wan, cli, tmp_path, monkeypatch):
    _, folder = tiny_wan
    (tmp_path / "pickled").mkdir()
    for name in ("diffusion_pytorch_model.bin", "config.json"):
        (tmp_path / "pickled" / name).write_bytes((folder / "pickled" / name).read_bytes())
    victim = tmp_path / "pickled" / "diffusion_pytorch_model.bin"
    with zipfile.ZipFile(victim) as archive:  # a record past the first: read ahead, not where it is asked for
        keys = sorted(int(info.filename.rsplit("/", 1)[1]) for info in archive.infolist() if "/data/" in info.filename)
    start, _ = record_span(victim, f"/data/{keys[len(keys) // 2]}")
    flip_byte(victim, start + 5, 0x10)
    read_in, real_read = set(), torch_archive.TorchArchive.read_elements

    def read_elements(archive, *args, **kwargs):
        read_in.add(threading.current_thread().name.rsplit("_", 1)[0])
        return real_read(archive, *args, **kwargs)

    monkeypatch.setattr(torch_archive.TorchArchive, "read_elements", read_elements)
    (tmp_path / "refusal").mkdir()
    assert_refused(cli, tmp_path / "refusal", [tmp_path / "pickled", tmp_path / "refusal" / "out", "--to", "gguf",
                                               "--quant", "Q8_0", "--workers", "2"],
                   victim.name, "fails its CRC-32 check", inputs=[victim])
    assert read_in == {"cogexport-read"}


def test_reads_go_at_most_two_tensors_past_the_latest_asked_for_and_errors_surface_where_asked():
    loaded = []

    def load(index: int) -> torch.Tensor:
        loaded.append(index)
        if index in (5, 7):
            raise OSError(f"tensor {index} cannot be read")
        return torch.full((4,), float(index))

    tensors = [LazyTensor(torch.Size([4]), torch.float32, lambda index=index: load(index)) for index in range(8)]
    with ReadAhead(2) as reading:
        ahead = reading.sequence(tensors)
        assert torch.equal(ahead[3].load(), torch.full((4,), 3.0))  # a torchrun rank's run begins within the file
        assert torch.equal(ahead[4].load(), torch.full((4,), 4.0))
        with pytest.raises(OSError, match="tensor 5 cannot be read"):
            ahead[5].load()
        assert torch.equal(ahead[1].load(), torch.full((4,), 1.0))  # before the run's start: read where asked
    assert set(loaded) <= {1, 3, 4, 5, 6, 7} and {1, 3, 4, 5} <= set(loaded)  # never 0 or 2; 7's error never raised
    assert torch.equal(ahead[0].load(), torch.full((4,), 0.0))  # past the job's end: read where asked, no thread
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("cogexport-read")]
