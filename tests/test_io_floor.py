"""At the I/O floor: unchanged tensors copied file to file in the kernel (and every fallback), their CRC-32 still
checked; tensors loaded ahead by worker threads within a byte budget. Every output is judged by the safetensors
library's own writer (``save_file``) or by ``torch.load``, never by cogexport's own reading."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import zipfile
import zlib
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, leftovers
from isal.isal_zlib import crc32 as isal_crc32
from safetensors.torch import load_file, save_file

from cogexport.checkpoint.safetensors_files import SafetensorsCheckpoint
from cogexport.checkpoint.torch_state_dict import TorchStateDictCheckpoint
from cogexport.errors import CogExportError
from cogexport.lazy import LazyTensor
from cogexport.write import byte_copy
from cogexport.write.folder_plan import FolderPlan, TensorFile
from cogexport.write.io_engine import IOSettings
from cogexport.write.publish_plan import write_plan
from cogexport.write.safetensors_file import write_safetensors
from cogexport.write.torch_archive import write_torch_archive

FALLBACKS = {"sendfile": ("sendfile", "read_write"), "read_write": ("read_write",)}


def random_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"blocks.0.weight": torch.randn(96, 64, generator=generator),
            "blocks.0.bias": torch.randn(96, generator=generator).to(torch.bfloat16),
            "blocks.1.weight": torch.randn(3, 5, 7, generator=generator).half(),
            "steps": torch.arange(11), "scalar": torch.tensor(0.5), "empty": torch.zeros(0, 4)}


def renamed(tensors: dict, prefix: str = "model.") -> dict:
    return {prefix + name: tensor for name, tensor in tensors.items()}


@pytest.fixture(autouse=True)
def reset_counts(counted):
    """Every test here starts with the copy counts at zero (conftest's ``counted``)."""


def test_unchanged_safetensors_tensors_are_copied_in_the_kernel(tmp_path, counted):
    truth = random_tensors()
    save_file(truth, tmp_path / "input.safetensors")
    with SafetensorsCheckpoint(tmp_path / "input.safetensors") as source:
        lazy = renamed(dict(source))  # plain renames keep the byte range
        lazy["model.blocks.0.weight"] = lazy["model.blocks.0.weight"].to(torch.bfloat16)  # a cast drops it
        assert lazy["model.blocks.0.weight"].source is None and lazy["model.steps"].source is not None
        assert lazy["model.steps"].to(torch.int64) is lazy["model.steps"]  # a same-dtype cast keeps it
        write_safetensors(tmp_path / "ours.safetensors", lazy, {"format": "pt"})
    expected = renamed(truth)
    expected["model.blocks.0.weight"] = expected["model.blocks.0.weight"].to(torch.bfloat16)
    save_file(expected, tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    ranged = [name for name, tensor in truth.items() if tensor.nbytes and name != "blocks.0.weight"]
    assert counted.ranges["copy_file_range"] == len(ranged)
    assert counted.bytes["copy_file_range"] == sum(truth[name].nbytes for name in ranged)


@pytest.mark.parametrize("forced", FALLBACKS, ids=list(FALLBACKS))
def test_each_fallback_writes_the_same_bytes(tmp_path, counted, monkeypatch, forced):
    monkeypatch.setattr(byte_copy, "METHODS", FALLBACKS[forced])
    test_unchanged = random_tensors(seed=1)
    save_file(test_unchanged, tmp_path / "input.safetensors")
    with SafetensorsCheckpoint(tmp_path / "input.safetensors") as source:
        write_safetensors(tmp_path / "ours.safetensors", renamed(dict(source)))
    save_file(renamed(test_unchanged), tmp_path / "theirs.safetensors")
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    assert counted.ranges[forced] == sum(1 for t in test_unchanged.values() if t.nbytes)
    assert counted.bytes["copy_file_range"] == 0


def test_another_file_system_falls_back_to_sendfile(tmp_path, counted):
    """tmpfs to this disk: copy_file_range refuses (EXDEV), sendfile still copies in the kernel."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's folder")
    truth = random_tensors(seed=2)
    source_file = shm / f"cogexport-test-{tmp_path.name}.safetensors"
    save_file(truth, source_file)
    try:
        with SafetensorsCheckpoint(source_file) as source:
            write_safetensors(tmp_path / "ours.safetensors", dict(source))
    finally:
        source_file.unlink()
    save_file(truth, tmp_path / "theirs.safetensors")
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    assert counted.ranges["sendfile"] + counted.ranges["copy_file_range"] == sum(1 for t in truth.values() if t.nbytes)
    assert counted.ranges["sendfile"] >= 1


def record_data_offset(archive: Path, member_suffix: str) -> int:
    """Where a record's bytes start in a zip file (from zipfile's own directory and the local header)."""
    with zipfile.ZipFile(archive) as opened:
        info = next(i for i in opened.infolist() if i.filename.endswith(member_suffix))
    with open(archive, "rb") as handle:
        handle.seek(info.header_offset + 26)
        name_length, extra_length = (int.from_bytes(handle.read(2), "little") for _ in range(2))
    return info.header_offset + 30 + name_length + extra_length


def saved_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """fp32 and integer tensors (which consolidate --dtype fp32 writes as they are), saved by torch.save."""
    generator = torch.Generator().manual_seed(3)
    truth = {"blocks.0.weight": torch.randn(300, 64, generator=generator), "blocks.0.bias": torch.randn(300),
             "steps": torch.arange(11), "scalar": torch.tensor(0.5)}
    torch.save(truth, path)
    return truth


@pytest.mark.parametrize("forced", ["copy_file_range", *FALLBACKS])
def test_torch_records_are_copied_and_checked(tmp_path, cli, counted, monkeypatch, forced):
    """consolidate of a torch.save state dict (same dtype): each record copied in the kernel and read back through its
    CRC-32; the output equals what torch.load reads, in save_file's bytes."""
    monkeypatch.setattr(byte_copy, "METHODS", FALLBACKS.get(forced, byte_copy.METHODS))
    truth = saved_state_dict(tmp_path / "weights.pt")
    result = cli("consolidate", tmp_path / "weights.pt", tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    save_file(torch.load(tmp_path / "weights.pt"), tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    assert counted.ranges[forced] == len(truth)


@pytest.mark.parametrize("forced", ["copy_file_range", *FALLBACKS])
def test_a_copied_record_that_fails_its_crc_is_refused(tmp_path, cli, monkeypatch, forced):
    monkeypatch.setattr(byte_copy, "METHODS", FALLBACKS.get(forced, byte_copy.METHODS))
    weights = tmp_path / "inputs" / "weights.pt"
    weights.parent.mkdir()
    saved_state_dict(weights)
    position = record_data_offset(weights, "data/0") + 100  # inside the first tensor's bytes
    data = bytearray(weights.read_bytes())
    data[position] ^= 0x01
    weights.write_bytes(bytes(data))
    assert_refused(cli, tmp_path, ["consolidate", weights, tmp_path / "out", "--dtype", "fp32"],
                   "fails its CRC-32 check", inputs=[weights])


def test_copied_chunks_are_checked_in_a_helper_thread_behind_the_copies(tmp_path, monkeypatch, counted):
    """A writer's kernel copies hand their CRC-32 checks to one helper thread, each chunk's check running while the
    next chunk is copied: every byte is still checked, in copy order, and the output is still save_file's."""
    monkeypatch.setattr(byte_copy, "CHECKED_CHUNK", 4096)  # the 300 x 64 fp32 weight: 19 chunks
    truth = saved_state_dict(tmp_path / "weights.pt")
    seen, check_copied = [], byte_copy.check_copied

    def watched(source, start, count):
        seen.append((threading.current_thread().name, source.offset + start, count))
        check_copied(source, start, count)

    monkeypatch.setattr(byte_copy, "check_copied", watched)
    with TorchStateDictCheckpoint(tmp_path / "weights.pt") as source:
        write_safetensors(tmp_path / "ours.safetensors", dict(source), {"format": "pt"})
    save_file(truth, tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()
    assert {name for name, _, _ in seen} == {"cogexport-check_0"}
    assert sum(count for _, _, count in seen) == sum(t.nbytes for t in truth.values()) == counted.bytes["copy_file_range"]
    weight = [offset for _, offset, count in seen if count == 4096]
    assert len(weight) >= 18 and weight == sorted(weight)


@pytest.mark.parametrize("record", ["data/0", "data/3"])
def test_the_last_chunk_checked_behind_the_copies_is_waited_for(tmp_path, monkeypatch, record):
    """Damage in any record, the last one copied included (its check is the one still running when the copies
    end), fails the write: the writer waits for every check before it finishes the file."""
    monkeypatch.setattr(byte_copy, "CHECKED_CHUNK", 4096)
    weights = tmp_path / "weights.pt"
    saved_state_dict(weights)
    with zipfile.ZipFile(weights) as archive:
        size = next(i for i in archive.infolist() if i.filename.endswith(record)).file_size
    data = bytearray(weights.read_bytes())
    data[record_data_offset(weights, record) + size - 1] ^= 0x01  # the record's very last byte
    weights.write_bytes(bytes(data))
    with TorchStateDictCheckpoint(weights) as source, pytest.raises(CogExportError, match="CRC-32"):
        write_safetensors(tmp_path / "ours.safetensors", dict(source), {"format": "pt"})


def test_trailing_checks_keep_the_writers_own_error():
    """Leaving on the writer's error waits for the check in flight and raises the writer's error, not the check's."""
    finished = []

    def failing_check():
        time.sleep(0.05)
        finished.append(True)
        raise CogExportError("the check's error")

    with pytest.raises(OSError, match="the writer's error"):
        with byte_copy.TrailingChecks() as checks:
            checks.run(failing_check)
            raise OSError("the writer's error")
    assert finished == [True]
    with pytest.raises(CogExportError, match="the check's error"):
        with byte_copy.TrailingChecks() as checks:
            checks.run(failing_check)


def test_a_written_archive_sums_its_records_by_isal_and_zlib_agrees(tmp_path):
    """While a torch.save archive is written, zipfile sums its records with ISA-L's CRC-32, and is given zlib's back
    after; zlib's own check of every record (zipfile.testzip) and torch.load agree with what was written."""
    truth = saved_state_dict(tmp_path / "weights.pt")
    summed_by_isal = []
    with TorchStateDictCheckpoint(tmp_path / "weights.pt") as source:
        write_torch_archive(tmp_path / "copy.pt", dict(source),
                            on_tensor=lambda name, nbytes: summed_by_isal.append(zipfile.crc32 is isal_crc32))
    assert summed_by_isal == [True] * len(truth) and zipfile.crc32 is zlib.crc32
    with zipfile.ZipFile(tmp_path / "copy.pt") as archive:
        assert archive.testzip() is None
    loaded = torch.load(tmp_path / "copy.pt")
    assert loaded.keys() == truth.keys() and all(torch.equal(loaded[k], truth[k]) for k in truth)


def test_archives_written_at_once_in_two_threads_leave_zlibs_crc32_in_place(tmp_path):
    """Two archives written in threads, the second started while the first is written and finished after it: every
    record of both is summed by ISA-L's CRC-32, and zipfile holds zlib's once both are written (each writer putting
    back the function it found would leave ISA-L's there: the second found it)."""
    truth = saved_state_dict(tmp_path / "weights.pt")
    first_started, second_started, first_done = threading.Event(), threading.Event(), threading.Event()
    summed_by_isal: dict[str, list[bool]] = {"first": [], "second": []}

    def on_tensor(which: str, mine: threading.Event, other: threading.Event):
        def seen(name: str, nbytes: int) -> None:
            summed_by_isal[which].append(zipfile.crc32 is isal_crc32)
            mine.set()
            assert other.wait(30), "the other writer never reached its point"
        return seen

    def write(which: str, mine: threading.Event, other: threading.Event) -> None:
        with TorchStateDictCheckpoint(tmp_path / "weights.pt") as source:
            write_torch_archive(tmp_path / f"{which}.pt", dict(source), on_tensor=on_tensor(which, mine, other))

    first = threading.Thread(target=lambda: (write("first", first_started, second_started), first_done.set()))
    first.start()
    assert first_started.wait(30)
    write("second", second_started, first_done)  # its records after the first's: the first writer is done
    first.join()
    assert summed_by_isal == {"first": [True] * len(truth), "second": [True] * len(truth)}
    assert zipfile.crc32 is zlib.crc32
    for which in summed_by_isal:
        loaded = torch.load(tmp_path / f"{which}.pt")
        assert all(torch.equal(loaded[k], truth[k]) for k in truth)


def test_a_streamed_record_that_fails_its_crc_is_refused(tmp_path):
    """A torch.save output computes its records' CRC-32 from the bytes, so ranges pass through user space: still
    checked against the input's CRC-32."""
    truth = saved_state_dict(tmp_path / "weights.pt")
    with TorchStateDictCheckpoint(tmp_path / "weights.pt") as source:
        write_torch_archive(tmp_path / "copy.pt", dict(source))
    assert byte_copy.COUNTS.ranges["streamed"] == len(truth)
    loaded = torch.load(tmp_path / "copy.pt")
    assert loaded.keys() == truth.keys() and all(torch.equal(loaded[k], truth[k]) for k in truth)
    data = bytearray((tmp_path / "weights.pt").read_bytes())
    data[record_data_offset(tmp_path / "weights.pt", "data/2") + 3] ^= 0x80
    (tmp_path / "weights.pt").write_bytes(bytes(data))
    with TorchStateDictCheckpoint(tmp_path / "weights.pt") as source, pytest.raises(CogExportError, match="CRC-32"):
        write_torch_archive(tmp_path / "copy2.pt", dict(source))


def test_a_streamed_record_whose_file_was_cut_short_is_one_line(tmp_path):
    """The file shrinks between planning and writing: one line naming it, not a short record."""
    saved_state_dict(tmp_path / "weights.pt")
    with TorchStateDictCheckpoint(tmp_path / "weights.pt") as source:
        tensors = dict(source)
        os.truncate(tmp_path / "weights.pt", record_data_offset(tmp_path / "weights.pt", "data/0") + 100)
        with pytest.raises(CogExportError, match=r"weights.pt: file ends \d+ bytes early \(truncated\?\)"):
            write_torch_archive(tmp_path / "copy.pt", tensors)


# -- reading ahead --------------------------------------------------------------------------------------------
def test_loads_run_ahead_in_worker_threads(tmp_path):
    """Two loads that can only finish together (each waits for the other to start): one thread would never get
    past the first."""
    meeting = threading.Barrier(2, timeout=20)
    truth = {f"t{i}": torch.full((8,), float(i)) for i in range(4)}

    def meet(name: str) -> torch.Tensor:
        meeting.wait()
        return truth[name]

    lazy = {name: LazyTensor(t.shape, t.dtype, lambda name=name: meet(name)) for name, t in truth.items()}
    plan = FolderPlan([TensorFile("model.safetensors", lazy)])
    write_plan(plan, tmp_path / "out", IOSettings(workers=2), "test", progress=False)
    save_file(truth, tmp_path / "theirs.safetensors")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (tmp_path / "theirs.safetensors").read_bytes()


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_the_budget_bounds_the_bytes_held(tmp_path, workers):
    """Loaded-and-not-yet-written bytes never exceed the budget, across file boundaries; with room for several
    tensors and several workers, more than one is held ahead."""
    megabyte = 1 << 18  # float32 elements
    truth = {f"file{i // 5}.t{i}": torch.full((megabyte,), float(i)) for i in range(15)}
    held, most, lock = [0], [0], threading.Lock()

    def load(name: str) -> torch.Tensor:
        with lock:
            held[0] += truth[name].nbytes
            most[0] = max(most[0], held[0])
        time.sleep(0.02)  # a load takes longer than a write: the workers run ahead while the writer waits
        return truth[name].clone()

    def written(_name: str, nbytes: int) -> None:
        with lock:
            held[0] -= nbytes

    files = {}
    for name, tensor in truth.items():
        files.setdefault(name.split(".")[0], {})[name] = LazyTensor(tensor.shape, tensor.dtype,
                                                                    lambda name=name: load(name))
    from cogexport.write.folder_plan import write_data_files

    (tmp_path / "out").mkdir()
    plan = FolderPlan([TensorFile(f"{f}.safetensors", t) for f, t in files.items()])
    write_data_files(tmp_path / "out", plan.data_files, written, IOSettings(workers=workers, budget=3 << 20))
    assert most[0] <= 3 << 20
    assert (most[0] > 1 << 20) == (workers > 1)
    for name, tensors in files.items():
        save_file({n: truth[n] for n in tensors}, tmp_path / f"{name}.safetensors")
        assert (tmp_path / "out" / f"{name}.safetensors").read_bytes() == \
            (tmp_path / f"{name}.safetensors").read_bytes()


def test_a_failing_load_in_a_worker_publishes_nothing(tmp_path):
    def load(index: int) -> torch.Tensor:
        if index == 5:
            raise CogExportError("tensor 5 is broken")
        return torch.ones(1000)

    lazy = {f"t{i}": LazyTensor(torch.Size([1000]), torch.float32, lambda i=i: load(i)) for i in range(12)}
    plan = FolderPlan([TensorFile(f"part{i}.safetensors", {f"t{j}": lazy[f"t{j}"] for j in range(i, 12, 3)})
                       for i in range(3)])
    with pytest.raises(CogExportError, match="tensor 5 is broken"):
        write_plan(plan, tmp_path / "out", IOSettings(workers=3), "test", progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_workers_option_is_checked(tmp_path, cli):
    saved_state_dict(tmp_path / "weights.pt")
    result = cli("consolidate", tmp_path / "weights.pt", tmp_path / "out", "--workers", "0")
    assert result.exit_code == 2 and "--workers" in result.stderr and not (tmp_path / "out").exists()
    result = cli("consolidate", tmp_path / "weights.pt", tmp_path / "out", "--workers", "3")
    assert result.exit_code == 0, result.stderr
    assert load_file(tmp_path / "out" / "model.safetensors").keys() == torch.load(tmp_path / "weights.pt").keys()


def test_a_kill_signal_during_the_clean_up_does_not_stop_it(tmp_path, monkeypatch):
    """torchrun stops the other ranks with SIGTERM, which may arrive while a rank removes the staging folder of a
    failed run: the removal finishes first, then the signal ends the run (as the command line's handler does)."""
    from cogexport.write import staging

    real_rmtree = staging.shutil.rmtree

    def rmtree_signalled(path, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at the next bytecode: before the removal below
        real_rmtree(path, **kwargs)

    previous = signal.signal(signal.SIGTERM, lambda number, _frame: sys.exit(128 + number))
    monkeypatch.setattr(staging.shutil, "rmtree", rmtree_signalled)
    try:
        with pytest.raises(SystemExit) as stopped:
            with staging.staged_folder(tmp_path / "out") as folder:
                (folder / "part.safetensors").write_bytes(b"partial")
                raise CogExportError("a rank failed")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_a_kill_signal_before_the_clean_up_holds_signals_does_not_stop_it(tmp_path, monkeypatch):
    """The signal may also come as the failure reaches the clean-up, before it holds signals (the likeliest way a CI
    run's killed-rank test, under load, left its staging folder): its exit, raised there, starts the removal again
    under the hold."""
    from cogexport.write import staging

    real_current_thread, calls = staging.threading.current_thread, []

    def signalled_first(*args):
        calls.append(1)
        if len(calls) == 1:
            sys.exit(128 + signal.SIGTERM)  # what the command line's handler raises, at the hold's first line
        return real_current_thread(*args)

    monkeypatch.setattr(staging.threading, "current_thread", signalled_first)
    with pytest.raises(SystemExit) as stopped:
        with staging.staged_folder(tmp_path / "out") as folder:
            (folder / "part.safetensors").write_bytes(b"partial")
            raise CogExportError("a rank failed")
    assert stopped.value.code == 128 + signal.SIGTERM and len(calls) == 2
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("cores, local_processes, writer_core, expected",
                         [(2, "1", True, 1), (2, "1", False, 2), (16, "1", True, 8), (16, "4", True, 3),
                          (16, "4", False, 4), (1, "1", True, 1)])
def test_default_workers_share_the_cores(monkeypatch, cores, local_processes, writer_core, expected):
    """One loader per core but the writer's (none kept for a writer of quantized bytes, whose loads are the work),
    the cores shared among a torchrun job's processes on the machine, at least one and at most eight."""
    from cogexport.write import io_engine

    monkeypatch.setattr(io_engine.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_processes)
    assert io_engine.default_workers(writer_core) == expected
