"""The three records at the end of a torch.save archive (the zip64 end-of-central-directory record, its locator and
the end-of-central-directory record), damaged byte by byte in a real ZeRO-2 optimizer file: every damaged copy is
read exactly or refused in one line; none raises zipfile's own exceptions (BadZipFile for "a multi-disk archive",
OSError for a seek before the start), which used to escape as tracebacks."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
import torch
from conftest import snapshot
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import load_file

from cogexport import consolidate
from cogexport.errors import CogExportError

ZERO2 = DeepSpeedVariant(2, "bf16", 2)
VICTIM = "global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
EOCD, ZIP64_LOCATOR, ZIP64_RECORD = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"


def end_records(data: bytes) -> dict[str, tuple[int, int]]:
    """Where each record of the archive's end lies (torch.save writes all three, and no archive comment)."""
    eocd = data.rindex(EOCD)
    locator = data.rindex(ZIP64_LOCATOR, 0, eocd)
    record = struct.unpack_from("<Q", data, locator + 8)[0]  # the locator points at the zip64 record
    assert data[record:record + 4] == ZIP64_RECORD and eocd + 22 == len(data)
    return {"end of central directory": (eocd, eocd + 22), "zip64 locator": (locator, locator + 20),
            "zip64 end record": (record, locator)}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    folder = tmp_path_factory.mktemp("zero2") / "checkpoint"
    shutil.copytree(deepspeed_checkpoint(ZERO2).checkpoint, folder)
    consolidate(folder, folder.parent / "truth")
    return folder, load_file(folder.parent / "truth" / "model.safetensors")


def outcome(checkpoint: Path, output: Path, truth: dict[str, torch.Tensor]) -> str:
    before = snapshot(checkpoint)
    try:
        consolidate(checkpoint, output)
    except CogExportError as error:
        assert "\n" not in str(error) and not output.exists() and snapshot(checkpoint) == before
        return "refused"
    written = load_file(output / "model.safetensors")
    assert set(written) == set(truth) and all(torch.equal(written[n], truth[n]) for n in truth), "silently wrong"
    shutil.rmtree(output)
    return "right"


@pytest.mark.parametrize("record", ["end of central directory", "zip64 locator", "zip64 end record"])
def test_every_byte_of_each_end_record_flipped(record, pristine, tmp_path):
    source, truth = pristine
    checkpoint = Path(shutil.copytree(source, tmp_path / "checkpoint"))
    victim = checkpoint / VICTIM
    data = victim.read_bytes()
    start, stop = end_records(data)[record]
    seen = set()
    for position in range(start, stop):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[position] ^= mask
            victim.write_bytes(bytes(damaged))
            seen.add(outcome(checkpoint, tmp_path / "out", truth))
    assert "refused" in seen  # each record matters somewhere; bytes zipfile never reads leave the output right


def test_the_multi_disk_claim_is_one_line_for_inspect_and_consolidate(pristine, tmp_path, cli):
    """The issue's case: the archive's end damaged so that it claims to span several disks (zipfile raised
    BadZipFile from is_zipfile, which should answer yes or no)."""
    source, _ = pristine
    checkpoint = Path(shutil.copytree(source, tmp_path / "checkpoint"))
    victim = checkpoint / VICTIM
    data = bytearray(victim.read_bytes())
    start, _ = end_records(bytes(data))["zip64 locator"]
    data[start + 16] ^= 0x02  # "total number of disks": 1 -> 3
    victim.write_bytes(bytes(data))
    for args in (("consolidate", checkpoint, tmp_path / "out"), ("inspect", checkpoint)):
        result = cli(*args)
        assert "Traceback" not in result.stderr and result.exit_code in (1, 2), result.stderr
        if result.exit_code == 2:
            assert len(result.error_lines) == 1 and victim.name in result.stderr, result.stderr
        else:
            assert victim.name in result.stdout and "usable" in result.stdout
    assert not (tmp_path / "out").exists()
