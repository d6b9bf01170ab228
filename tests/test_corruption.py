"""Damaged or mixed-up files are refused with one line, never turned into a silently wrong model: zip CRC-32s and
local headers, strict safetensors headers, rank identity, missing optimizer files, and what inspect says."""

from __future__ import annotations

import json
import os
import random
import struct
import zlib
from pathlib import Path

import pytest
import torch
from conftest import snapshot
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import load_file, save_file
from test_bad_input import assert_refused, copy_checkpoint

from cogexport.checkpoint.safetensors_files import SafetensorsCheckpoint
from cogexport.checkpoint.torch_archive import load_torch_file
from cogexport.checkpoint.zip_records import crc32_concat, finish_partial_reads
from cogexport.errors import CogExportError

ZERO1 = DeepSpeedVariant(1, "bf16", 2)
ZERO2 = DeepSpeedVariant(2, "bf16", 2)
ZERO2_WS1 = DeepSpeedVariant(2, "bf16", 1)
ZERO2_WS3 = DeepSpeedVariant(2, "bf16", 3)
ZERO3 = DeepSpeedVariant(3, "bf16", 2)


def optim_name(rank: int) -> str:
    return f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def record_span(path: Path, suffix: str) -> tuple[int, int]:
    """Where the data of the first record whose name ends with ``suffix`` lies in the file."""
    import zipfile

    with zipfile.ZipFile(path) as archive, open(path, "rb") as handle:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
        handle.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
        start = info.header_offset + 30 + name_length + extra_length
        return start, start + info.file_size


def master_partition_span(path: Path) -> tuple[int, int]:
    """Where a ZeRO-1/2 optimizer file keeps its fp32 partition."""
    archive, tree = load_torch_file(path)
    archive.close()
    return record_span(path, f"/data/{tree['optimizer_state_dict']['single_partition_of_fp32_groups'][0].key}")


def flip_byte(path: Path, position: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


# -- CRC-32 arithmetic and records read in part -------------------------------------------------------------
def test_crc32_of_concatenation_from_the_parts():
    rng = random.Random(0)
    for _ in range(50):
        first, second = rng.randbytes(rng.randrange(300)), rng.randbytes(rng.randrange(300))
        assert crc32_concat(zlib.crc32(first), zlib.crc32(second), len(second)) == zlib.crc32(first + second)


def test_a_record_read_in_part_is_finished_before_an_output_counts(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.arange(4096, dtype=torch.float32)}, path)
    _, end = record_span(path, "/data/0")
    flip_byte(path, end - 1)  # the last element: never read below
    archive, tree = load_torch_file(path)
    first_half = tree["w"].read_flat(0, 2048)
    assert torch.equal(first_half, torch.arange(2048, dtype=torch.float32))
    with pytest.raises(CogExportError, match=r"weights\.pt is corrupt: record 'weights/data/0' fails its CRC-32"):
        finish_partial_reads()
    archive.close()


def test_reading_in_any_order_checks_each_byte_once(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.arange(1000, dtype=torch.float32)}, path)
    archive, tree = load_torch_file(path)
    pieces = [(s, min(s + 97, 1000)) for s in range(0, 1000, 97)]
    random.Random(1).shuffle(pieces)
    for start, stop in pieces:
        tree["w"].read_flat(start, stop)
    record = archive.records.records["weights/data/0"]
    assert record.verified and archive.bytes_read == 4000
    archive.close()


# -- CRC-32 and local headers on real checkpoints ------------------------------------------------------------
def test_a_flipped_bit_in_a_master_partition_is_refused(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    victim = checkpoint / "global_step2" / optim_name(1)
    start, _ = master_partition_span(victim)
    flip_byte(victim, start + 5, 0x10)
    assert_refused(cli, checkpoint, tmp_path, victim.name, "fails its CRC-32 check", "copy the file again")


def test_a_flipped_bit_in_a_partition_nothing_reads_is_only_inspects_business(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    victim = checkpoint / "global_step2" / optim_name(0)
    archive, tree = load_torch_file(victim)
    moment = tree["optimizer_state_dict"]["base_optimizer_state"]["state"][0]["exp_avg"]
    start, _ = record_span(victim, f"/data/{moment.key}")
    archive.close()
    flip_byte(victim, start + 3)
    result = cli("consolidate", checkpoint, tmp_path / "out")  # reads the masters, never the moments
    assert result.exit_code == 0, result.stderr
    report = cli("inspect", checkpoint, "--json")
    assert report.exit_code == 1
    problems = json.loads(report.stdout)["problems"]
    assert problems == [f"{victim} is corrupt: record 'bf16_zero_pp_rank_0_mp_rank_00_optim_states/data/{moment.key}' "
                        "fails its CRC-32 check (its bytes changed after it was saved); copy the file again"]
    quick = cli("inspect", checkpoint, "--quick")
    assert quick.exit_code == 0 and "not read (--quick)" in quick.stdout


def test_a_local_header_that_disagrees_with_the_directory_is_refused(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    victim = checkpoint / "global_step2" / optim_name(1)
    start, _ = master_partition_span(victim)
    data = bytearray(victim.read_bytes())
    header = data.rfind(b"PK\x03\x04", 0, start)
    data[header + 30] ^= 0x20  # a letter of the record's name, in its local header only
    victim.write_bytes(bytes(data))
    assert_refused(cli, checkpoint, tmp_path, victim.name, "local header does not match the zip directory")


def test_archives_saved_without_crcs_are_read_with_a_note(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    victim = checkpoint / "global_step2" / optim_name(1)
    tree = torch.load(victim, weights_only=False)  # our own fixture
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(tree, victim)
    finally:
        torch.serialization.set_crc32_options(True)
    result = cli("consolidate", checkpoint, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "1 file(s) saved without CRC-32 checksums" in result.stderr and victim.name in result.stderr
    fixture = deepspeed_checkpoint(ZERO2)
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(written[n], fixture.tensors[n]) for n in fixture.truth["trainable"])


# -- rank identity ------------------------------------------------------------------------------------------
def test_swapped_rank_files_are_refused_by_the_name_inside(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2_WS3, tmp_path / "ckpt")
    tag = checkpoint / "global_step2"
    (tag / optim_name(1)).rename(tag / "x")
    (tag / optim_name(2)).rename(tag / optim_name(1))
    (tag / "x").rename(tag / optim_name(2))
    assert_refused(cli, checkpoint, tmp_path, f"{optim_name(1)} was saved as {optim_name(2)}", "swapped")


def test_a_rank_file_resaved_under_another_name_is_refused_by_its_slices(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2_WS3, tmp_path / "ckpt")
    tag = checkpoint / "global_step2"
    rank1, rank2 = torch.load(tag / optim_name(1), weights_only=False), torch.load(tag / optim_name(2), weights_only=False)
    torch.save(rank2, tag / optim_name(1))  # the archive root now says rank 1: only the content tells
    torch.save(rank1, tag / optim_name(2))
    assert_refused(cli, checkpoint, tmp_path, optim_name(1), "holds rank 2's parameter slices",
                   "param_slice_mappings")


def test_two_rank_files_with_the_same_content_are_refused(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO3, tmp_path / "ckpt")
    tag = checkpoint / "global_step2"
    torch.save(torch.load(tag / optim_name(0), weights_only=False), tag / optim_name(1))
    assert_refused(cli, checkpoint, tmp_path, f"{optim_name(0)} and {optim_name(1)}", "same content")


@pytest.mark.parametrize("variant", [ZERO1, ZERO2], ids=lambda v: v.id)
def test_masters_that_do_not_round_to_the_module_copy_are_refused(cli, tmp_path, variant):
    checkpoint = copy_checkpoint(variant, tmp_path / "ckpt")
    victim = checkpoint / "global_step2" / optim_name(1)
    saved = torch.load(victim, weights_only=False)
    partition = saved["optimizer_state_dict"]["single_partition_of_fp32_groups"][0]
    with torch.no_grad():
        partition.add_(torch.linspace(0.5, 1.5, partition.numel()))  # masters of another save, same layout
    torch.save(saved, victim)
    assert_refused(cli, checkpoint, tmp_path, "does not round to the module's bf16 copy", victim.name,
                   "mp_rank_00_model_states.pt")


def test_a_tag_that_records_an_optimizer_without_its_files_is_refused(cli, tmp_path):
    checkpoint = copy_checkpoint(ZERO2_WS1, tmp_path / "ckpt")
    (checkpoint / "global_step2" / optim_name(0)).unlink()
    assert_refused(cli, checkpoint, tmp_path, "records a ZeRO-2 optimizer", optim_name(0), "not the fp32 masters")


def test_sat_model_states_without_optimizer_files_still_export_the_module_copy(cli, tmp_path):
    # SAT saves DeepSpeed model states (param_shapes included) but never the optimizer; "iteration" marks it.
    checkpoint = copy_checkpoint(ZERO2_WS1, tmp_path / "ckpt")
    tag = checkpoint / "global_step2"
    (tag / optim_name(0)).unlink()
    states = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
    states["iteration"] = 2
    torch.save(states, tag / "mp_rank_00_model_states.pt")
    result = cli("consolidate", checkpoint, tmp_path / "out", "--dtype", "bf16")
    assert result.exit_code == 0, result.stderr
    assert "the weights are the module's bf16 copy" in result.stderr
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert torch.equal(written["block.0.weight"], states["module"]["block.0.weight"])


# -- untrusted text ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00garbage", b"../../etc", b"a\x00b", b"x" * 5000,
                                     b"global_step2\n\nrm -rf /"])
def test_a_damaged_latest_file_gives_one_escaped_line(cli, tmp_path, content):
    checkpoint = copy_checkpoint(ZERO2, tmp_path / "ckpt")
    (checkpoint / "latest").write_bytes(content)
    line = assert_refused(cli, checkpoint, tmp_path, "latest does not hold a tag name", "pass --tag")
    assert "\x00" not in line and "\r" not in line
    assert cli("consolidate", checkpoint, tmp_path / "out", "--tag", "global_step2").exit_code == 0


def test_a_tag_that_is_not_a_folder_name_is_refused(cli, tmp_path):
    result = cli("consolidate", deepspeed_checkpoint(ZERO2).checkpoint, tmp_path / "out", "--tag", "../x\n")
    assert result.exit_code == 2 and result.error_lines == ["cogexport: error: --tag '../x\\n' is not a tag name "
                                                            "(one folder name, such as global_step500)"]


# -- safetensors headers ------------------------------------------------------------------------------------
def write_with_header(path: Path, header: object, data: bytes) -> None:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


@pytest.fixture
def safetensors_parts(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.arange(4.0), "b": torch.ones(2, 3, dtype=torch.bfloat16)}, path, metadata={"format": "pt"})
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    return path, json.loads(raw[8:8 + size]), raw[8 + size:]


@pytest.mark.parametrize("change, phrase", [
    (lambda h: None, "JSON null, not an object"),
    (lambda h: [h], "JSON an array, not an object"),
    (lambda h: {**h, "__metadata__": {"format": 1}}, "__metadata__ is not an object of strings"),
    (lambda h: {**h, "__metadata__": "pt"}, "__metadata__ is not an object of strings"),
    (lambda h: {**h, "a": {**h["a"], "data_offsets": ["0", "16"]}}, "tensor 'a' has data_offsets"),
    (lambda h: {**h, "a": {**h["a"], "data_offsets": [0.0, 16]}}, "tensor 'a' has data_offsets"),
    (lambda h: {**h, "a": {**h["a"], "shape": [2, True]}}, "tensor 'a' has shape"),
    (lambda h: {**h, "a": {**h["a"], "dtype": "F31"}}, "dtype 'F31', which cogexport does not read"),
    (lambda h: {**h, "a": {**h["a"], "shape": [3]}}, "tensor 'a' spans 16 bytes but its shape '[3]'"),
    (lambda h: {**h, "b": {**h["b"], "data_offsets": [14, 26]}}, "tensor 'b' overlaps the tensor before it"),
    (lambda h: {**h, "b": {**h["b"], "data_offsets": [18, 30]}}, "tensor 'b' leaves a gap of 2 bytes"),
    (lambda h: {**h, "a": "x"}, "entry 'a' is not a tensor"),
], ids=["null", "array", "metadata-values", "metadata-string", "string-offsets", "float-offsets", "bool-dim",
        "dtype", "shape-vs-bytes", "overlap", "gap", "not-an-entry"])
def test_safetensors_headers_are_checked_like_the_library_does(cli, tmp_path, safetensors_parts, change, phrase):
    path, header, data = safetensors_parts
    write_with_header(path, change(header), data + (b"\0\0" if "gap" in phrase else b""))
    with pytest.raises(CogExportError, match="has a corrupt safetensors header") as error:
        SafetensorsCheckpoint(path)
    assert phrase in str(error.value)
    before = snapshot(tmp_path)
    for command in (["inspect", path], ["consolidate", path, tmp_path / "out"]):
        result = cli(*command)
        assert result.exit_code == 2 and len(result.error_lines) == 1 and phrase in result.stderr
    assert snapshot(tmp_path) == before


def test_bytes_after_the_last_tensor_are_refused(tmp_path, safetensors_parts):
    path, header, data = safetensors_parts
    write_with_header(path, header, data + b"\0" * 8)
    size = path.stat().st_size
    with pytest.raises(CogExportError, match=f"8 bytes after the last tensor .*up to byte {size - 8:,} of the "
                                             f"{size:,}-byte file"):
        SafetensorsCheckpoint(path)


def test_a_truncated_safetensors_file_is_told_in_bytes_of_the_file(cli, tmp_path, safetensors_parts):
    """Both numbers are positions in the file the user has: where the header says its tensors end (the whole file's
    size before it was cut) and the size it has (not an offset into the data region beside the file's size)."""
    path, header, data = safetensors_parts
    whole = path.stat().st_size
    os.truncate(path, whole - 6)
    result = cli("inspect", path)
    assert result.exit_code == 2 and len(result.error_lines) == 1
    assert f"is truncated: its header places tensors up to byte {whole:,}, but the file has {whole - 6:,} bytes (6 " \
           "missing); copy the file again" in result.stderr


def test_inspect_exit_codes(cli, tmp_path):
    assert cli("inspect", deepspeed_checkpoint(ZERO2).checkpoint).exit_code == 0
    checkpoint = copy_checkpoint(ZERO2_WS3, tmp_path / "ckpt")
    (checkpoint / "global_step2" / optim_name(2)).unlink()
    listed = cli("inspect", checkpoint)
    assert listed.exit_code == 1 and "usable        no (see problems)" in listed.stdout
    assert cli("inspect", tmp_path / "nowhere").exit_code == 2
    assert "Exit code 0 when the checkpoint is usable" in cli("inspect", "--help").stdout
