"""The records of a ``torch.save`` zip archive: found through the central directory, each checked against its
local header, and every byte read checked against the record's CRC-32 as it goes by.

A reader often wants only part of a record (one parameter's slice of a ZeRO partition), in any order. Each
record therefore keeps the CRC-32 of every span read so far; adjacent spans merge (CRC-32s concatenate with
arithmetic, no re-reading), and when the spans cover the record the result is compared with the stored value.
A record read only in part is finished by ``finish_partial_reads()``, which reads just the bytes never read,
before an output is moved into place: no byte is read twice, and nothing read goes unchecked.

torch can be told to write no CRC-32s (every stored value is then 0); such archives are read unchecked and
say so.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .byte_window import ByteWindow
from ..crc32 import crc32
from ..errors import CogExportError, quoted
from ..pending_checks import before_publishing
from ..tensor_bytes import pread_into

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_SIGNATURE = b"PK\x03\x04"
_DESCRIPTOR_SIGNATURE = b"PK\x07\x08"
_HAS_DESCRIPTOR = 0x08  # general-purpose flag: CRC and sizes follow the data instead of the local header
_UTF8_NAMES = 0x800
_ZIP64_EXTRA = 0x0001
_CHUNK = 8 << 20  # bytes read at a time when finishing a record


# A private switch for measuring what the CRC checks cost (scripts/benchmark_consolidate.py); never for users.
_SKIP_CRC_VARIABLE = "_COGEXPORT_SKIP_CRC_FOR_BENCHMARK"

# -- CRC-32 arithmetic ------------------------------------------------------------------------------------
# zlib's CRC-32 is a polynomial remainder in bit-reversed order: bit 31 is the coefficient of x^0.
_POLYNOMIAL = 0xEDB88320
_X_TO_THE_0 = 1 << 31


def _multiply(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial (both in bit-reversed order)."""
    product = 0
    for bit in range(32):
        if a & (_X_TO_THE_0 >> bit):
            product ^= b
        b = (b >> 1) ^ _POLYNOMIAL if b & 1 else b >> 1
    return product


def _x_to_the_powers_of_two() -> list[int]:
    powers = [_X_TO_THE_0 >> 1]  # x^1
    for _ in range(66):
        powers.append(_multiply(powers[-1], powers[-1]))
    return powers


_X_POWERS = _x_to_the_powers_of_two()  # x^(2^k) for k = 0..66: enough for any 64-bit byte count


def crc32_concat(first: int, second: int, second_length: int) -> int:
    """The CRC-32 of A followed by B, from crc32(A), crc32(B) and len(B), without the bytes."""
    shift, exponent, k = _X_TO_THE_0, 8 * second_length, 0
    while exponent:
        if exponent & 1:
            shift = _multiply(shift, _X_POWERS[k])
        exponent >>= 1
        k += 1
    return _multiply(shift, first) ^ second


# -- records --------------------------------------------------------------------------------------------
@dataclass
class Record:
    """One member of the archive: where its bytes are, its stored CRC-32, and the spans checked so far."""

    name: str
    offset: int
    size: int
    crc: int
    spans: list[list[int]] = field(default_factory=list)  # sorted, disjoint [start, stop, crc32 of those bytes]
    verified: bool = False

    def missing(self) -> list[tuple[int, int]]:
        """Byte ranges of the record not read yet."""
        gaps, position = [], 0
        for start, stop, _ in self.spans:
            if start > position:
                gaps.append((position, start))
            position = stop
        if position < self.size:
            gaps.append((position, self.size))
        return gaps

    def add(self, start: int, data: memoryview) -> None:
        """Fold the bytes ``data`` read at ``start`` into the checked spans (parts already checked are skipped)."""
        for gap_start, gap_stop in self.missing():
            low, high = max(gap_start, start), min(gap_stop, start + len(data))
            if low < high:
                self._insert(low, high, crc32(data[low - start:high - start]))

    def _insert(self, start: int, stop: int, crc: int) -> None:
        index = next((i for i, span in enumerate(self.spans) if span[0] > start), len(self.spans))
        self.spans.insert(index, [start, stop, crc])
        if index + 1 < len(self.spans) and self.spans[index + 1][0] == stop:  # joins the span after it
            after = self.spans.pop(index + 1)
            self.spans[index] = [start, after[1], crc32_concat(crc, after[2], after[1] - after[0])]
        if index > 0 and self.spans[index - 1][1] == start:  # and the span before it
            span = self.spans.pop(index)
            before = self.spans[index - 1]
            self.spans[index - 1] = [before[0], span[1], crc32_concat(before[2], span[2], span[1] - span[0])]

    @property
    def complete(self) -> bool:
        return self.size == 0 or (len(self.spans) == 1 and self.spans[0][:2] == [0, self.size])

    def computed_crc(self) -> int:
        return self.spans[0][2] if self.size else 0


class ZipRecords:
    """The records of one archive, opened and checked against their local headers; reads checked by CRC-32."""

    def __init__(self, path: Path, offset: int = 0, length: int | None = None) -> None:
        """``offset`` and ``length``: an archive stored inside a bigger file (its positions count from ``offset``)."""
        self.path = Path(path)
        self.base = offset
        self.records: dict[str, Record] = {}
        self._fd: int | None = None
        self._lock = threading.RLock()
        try:
            with open(self.path, "rb") as whole:
                size = os.fstat(whole.fileno()).st_size - offset if length is None else length
                handle = ByteWindow(whole, offset, size) if offset or length is not None else whole
                with zipfile.ZipFile(handle) as archive:
                    for info in archive.infolist():
                        self.records[info.filename] = self._check_entry(handle, info, size)
        except CogExportError:
            raise
        except OSError as error:
            if error.errno not in (errno.EINVAL, None):  # the disk failed, not the archive
                raise CogExportError(f"cannot read {self.path}: {error.strerror}") from None
            raise self._damaged(error) from None
        except Exception as error:  # noqa: BLE001
            # zipfile reports a damaged directory in many ways (BadZipFile, struct.error, EOFError, UnicodeError,
            # NotImplementedError, ValueError, OverflowError, a seek before the start): all mean the same here.
            raise self._damaged(error) from None
        # torch.serialization.set_crc32_options(False) stores 0 for every record.
        self.has_crcs = any(r.crc for r in self.records.values() if r.size)
        self.checking = self.has_crcs and not os.environ.get(_SKIP_CRC_VARIABLE)

    def _damaged(self, error: Exception) -> CogExportError:
        return CogExportError(f"{self.path} is corrupt or truncated ({quoted(str(error) or type(error).__name__, 120)}); "
                              "copy it again")

    def _check_entry(self, handle, info: zipfile.ZipInfo, file_size: int) -> Record:
        """The record of one central-directory entry, once its local header agrees with the directory."""
        where = f"{self.path} is corrupt: record {quoted(info.filename)}"
        if info.compress_type != zipfile.ZIP_STORED:
            raise CogExportError(f"{where} is compressed, which torch.save never does; re-save it with torch.save")
        handle.seek(info.header_offset)
        header = handle.read(_LOCAL_HEADER.size)
        if len(header) < _LOCAL_HEADER.size:
            raise CogExportError(f"{where} has its local header past the end of the file (truncated?); copy it again")
        signature, _, flags, _, _, _, crc, compressed, uncompressed, name_length, extra_length = \
            _LOCAL_HEADER.unpack(header)
        name = handle.read(name_length)
        expected_name = info.orig_filename.encode("utf-8" if info.flag_bits & _UTF8_NAMES else "cp437")
        if signature != _LOCAL_SIGNATURE or name != expected_name:
            raise CogExportError(f"{where}: its local header does not match the zip directory (damaged directory "
                                 "or header); copy it again")
        extra = handle.read(extra_length)
        offset = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        if offset + info.file_size > file_size:
            raise CogExportError(f"{self.path} looks truncated: record {quoted(info.filename)} ends past the file; "
                                 "copy it again")
        if flags & _HAS_DESCRIPTOR:
            handle.seek(offset + info.compress_size)
            recorded = _descriptor_fields(handle.read(24))
        else:
            recorded = (crc, _zip64_sizes(extra, compressed, uncompressed))
        if info.CRC != recorded[0] or (info.compress_size, info.file_size) not in recorded[1]:
            raise CogExportError(f"{where}: its local CRC-32 or sizes differ from the zip directory's (damaged "
                                 "directory or header); copy it again")
        return Record(info.filename, self.base + offset, info.file_size, info.CRC)

    # -- reading ------------------------------------------------------------------------------------------
    def _descriptor(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            return self._fd

    def read_into(self, name: str, start: int, buffer: memoryview, check: bool = True) -> None:
        """Fill ``buffer`` with record ``name``'s bytes from ``start``, checking them against the record's CRC-32.

        ``check=False`` is only for bytes that are compared with others and never written anywhere: a damaged
        byte there can only make the comparison fail, never make an output wrong."""
        record = self.records[name]
        if start < 0 or start + len(buffer) > record.size:
            raise CogExportError(f"{self.path} is corrupt: a read of record {quoted(name)} reaches past its end")
        try:
            pread_into(self._descriptor(), buffer, record.offset + start)
        except (OSError, EOFError) as error:
            raise CogExportError(f"cannot read {self.path}: {error}") from None
        if check:
            self.check_bytes(name, start, buffer)

    def check_bytes(self, name: str, start: int, data: memoryview) -> None:
        """Fold bytes of record ``name`` from ``start`` that were read elsewhere (a file-to-file copy reading back
        what it copied) into the record's CRC-32 check, as ``read_into`` folds what it reads."""
        record = self.records[name]
        if start < 0 or start + len(data) > record.size:
            raise CogExportError(f"{self.path} is corrupt: a read of record {quoted(name)} reaches past its end")
        if self.checking and not record.verified:
            with self._lock:
                record.add(start, data)
                self._conclude(record)

    def read(self, name: str) -> bytes:
        """A whole (small) record, checked."""
        data = bytearray(self.records[name].size)
        self.read_into(name, 0, memoryview(data))
        return bytes(data)

    def _conclude(self, record: Record) -> None:
        if record.complete:
            record.spans, record.verified = [], record.computed_crc() == record.crc
            if not record.verified:
                record.spans = []
                raise CogExportError(f"{self.path} is corrupt: record {quoted(record.name)} fails its CRC-32 check "
                                     "(its bytes changed after it was saved); copy the file again")
            _UNFINISHED.discard(self)
        elif record.spans:
            _UNFINISHED.add(self)

    def finish(self, name: str) -> None:
        """Read the bytes of record ``name`` not read yet, completing its CRC-32 check."""
        record = self.records[name]
        if not self.checking or record.verified:
            return
        chunk = bytearray(min(_CHUNK, record.size))
        for start, stop in record.missing():
            for position in range(start, stop, len(chunk)):
                view = memoryview(chunk)[:min(len(chunk), stop - position)]
                self.read_into(name, position, view)

    @contextmanager
    def _reopened(self) -> Iterator[None]:
        """Read the file again, and leave it closed if it was (one file per parameter adds up)."""
        was_closed = self._fd is None
        try:
            yield
        finally:
            if was_closed:
                self.close()

    def finish_started(self) -> None:
        """Complete the check of every record read in part."""
        with self._reopened():
            for record in list(self.records.values()):
                if record.spans:
                    self.finish(record.name)
        _UNFINISHED.discard(self)

    def check_all(self) -> list[str]:
        """Read and check every record; one message per failing record (for ``inspect``)."""
        problems = []
        with self._reopened():
            for name in self.records:
                try:
                    self.finish(name)
                except CogExportError as error:
                    problems.append(str(error))
        _UNFINISHED.discard(self)
        return problems

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _descriptor_fields(data: bytes) -> tuple[int, set[tuple[int, int]]]:
    """CRC and the possible (compressed, uncompressed) sizes of a data descriptor (32- or 64-bit sizes)."""
    if data.startswith(_DESCRIPTOR_SIGNATURE):
        data = data[4:]
    if len(data) < 12:
        return -1, set()
    crc = struct.unpack_from("<I", data)[0]
    sizes = {struct.unpack_from("<II", data, 4)}
    if len(data) >= 20:
        sizes.add(struct.unpack_from("<QQ", data, 4))
    return crc, sizes


def _zip64_sizes(extra: bytes, compressed: int, uncompressed: int) -> set[tuple[int, int]]:
    """The local header's (compressed, uncompressed) sizes, taken from its zip64 field when they overflow."""
    if 0xFFFFFFFF not in (compressed, uncompressed):
        return {(compressed, uncompressed)}
    position = 0
    while position + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, position)
        if kind == _ZIP64_EXTRA and length >= 16:
            real_uncompressed, real_compressed = struct.unpack_from("<QQ", extra, position + 4)
            return {(real_compressed, real_uncompressed)}
        position += 4 + length
    return set()


# Archives with records read in part, to be finished before any output is moved into place.
_UNFINISHED: set[ZipRecords] = set()


@before_publishing
def finish_partial_reads() -> None:
    """Complete the CRC-32 check of every record read in part so far (raises on the first that fails)."""
    for records in list(_UNFINISHED):
        records.finish_started()
