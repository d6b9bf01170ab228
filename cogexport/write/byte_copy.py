"""Copy bytes of one file into another without passing them through this process, where the kernel can.

A tensor written exactly as it is stored in the input (same dtype, no transform) needs no load: its byte range is
copied file to file. ``os.copy_file_range`` copies inside the kernel (page cache to page cache, or a reflink on file
systems that share blocks); where it is refused (another file system on older kernels, a file system without it)
``os.sendfile`` still copies in the kernel; last, a read/write loop through one small reused buffer.

A range whose format stores a checksum (a torch.save record's CRC-32) is copied a chunk at a time, and each chunk,
still in the page cache, is passed to the reader's check through a read-only memory map of the input (no copy into
this process; a plain read where the file cannot be mapped): an output is never made of bytes that fail it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from typing import Callable

from ..errors import CogExportError
from ..lazy import ByteRange
from ..tensor_bytes import MappedWindow, opened, pread_exactly

METHODS = ("copy_file_range", "sendfile", "read_write")
CHECKED_CHUNK = 8 << 20  # bytes copied, then read back and checked, at a time
_UNCHECKED_CHUNK = 1 << 30  # under the kernel's limit of one call (2 GiB - 4 KiB)
# What a file system or kernel answers when it cannot do a kind of copy (the next kind may still work).
_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.EBADF}


class CopyCounts:
    """Ranges and bytes copied by each method, for tests and reports (a process-wide tally)."""

    def __init__(self) -> None:
        self.ranges: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, method: str, nbytes: int, first_chunk: bool) -> None:
        with self._lock:
            self.bytes[method] += nbytes
            self.ranges[method] += first_chunk

    def reset(self) -> None:
        with self._lock:
            self.ranges.clear()
            self.bytes.clear()


COUNTS = CopyCounts()


class _Unsupported(Exception):
    """This method cannot copy between these two files; the next one is tried."""


def copy_range(source: ByteRange, destination: int, destination_offset: int,
               methods: tuple[str, ...] | None = None) -> str:
    """Copy ``source``'s bytes into the open file ``destination`` at ``destination_offset``; leaves the destination's
    file position after them. Returns the method that copied the (first) bytes. ``methods``: which to try, in order
    (default: ``METHODS``)."""
    with opened(source.path) as descriptor:
        try:
            return _RangeCopy(source, descriptor, destination, destination_offset).run(list(methods or METHODS))
        finally:
            os.lseek(destination, destination_offset + source.length, os.SEEK_SET)


class _RangeCopy:
    """One range from an open source to an open destination; positions count from the range's first byte."""

    def __init__(self, source: ByteRange, descriptor: int, destination: int, destination_offset: int) -> None:
        self.source, self.descriptor = source, descriptor
        self.destination, self.destination_offset = destination, destination_offset
        self._buffer: memoryview | None = None

    @property
    def buffer(self) -> memoryview:
        """The one buffer bytes pass through in user space, made when first needed (most copies need none)."""
        if self._buffer is None:
            self._buffer = memoryview(bytearray(min(CHECKED_CHUNK, self.source.length)))
        return self._buffer

    def run(self, methods: list[str]) -> str:
        chunk = CHECKED_CHUNK if self.source.check else _UNCHECKED_CHUNK
        done, used = 0, ""
        while done < self.source.length:
            count = min(chunk, self.source.length - done)
            while True:
                if not methods:
                    raise CogExportError(f"cannot copy from {self.source.path}: no way of copying between these "
                                         "files worked")
                try:
                    self._chunk(methods[0], done, count)
                    break
                except _Unsupported:
                    methods.pop(0)
            COUNTS.add(methods[0], count, first_chunk=not done)
            used = used or methods[0]
            done += count
        return used or methods[0]

    def _chunk(self, method: str, start: int, count: int) -> None:
        """Copy ``count`` bytes from ``start``, all of them (or raise _Unsupported having copied none)."""
        if method == "read_write":
            self._read_write(start, count)
            return
        copied = 0
        while copied < count:
            try:
                got = _kernel_copy(method, self.descriptor, self.source.offset + start + copied, count - copied,
                                   self.destination, self.destination_offset + start + copied)
            except OSError as error:
                if error.errno in _UNSUPPORTED and copied == 0:
                    raise _Unsupported() from None
                raise _read_or_write_error(self.source, error) from None
            if got == 0:  # the source ends early, or this file system copies nothing this way: a plain read tells
                break
            copied += got
        if copied == 0 and count:
            raise _Unsupported()
        if self.source.check is not None:
            self._check_copied(start, copied)
        if copied < count:
            self._read_write(start + copied, count - copied)

    def _check_copied(self, start: int, count: int) -> None:
        """Pass the bytes just copied (still in the page cache) to the format's check, mapped, not copied."""
        try:
            window = MappedWindow(self.descriptor, self.source.offset + start, count)
        except (OSError, ValueError):  # a file system that cannot map: read the bytes back instead
            for position in range(start, start + count, len(self.buffer)):
                piece = self.buffer[:min(len(self.buffer), start + count - position)]
                pread_exactly(self.source.path, self.descriptor, piece, self.source.offset + position)
                self.source.check(position, piece)
            return
        with window as view:
            self.source.check(start, view)

    def _read_write(self, start: int, count: int) -> None:
        """Through user space: each piece read (and checked, where the format has a checksum), then written."""
        for position in range(start, start + count, len(self.buffer)):
            piece = self.buffer[:min(len(self.buffer), start + count - position)]
            pread_exactly(self.source.path, self.descriptor, piece, self.source.offset + position)
            if self.source.check is not None:
                self.source.check(position, piece)
            written = 0
            while written < len(piece):
                written += os.pwrite(self.destination, piece[written:],
                                     self.destination_offset + position + written)


def stream_range(source: ByteRange, write: Callable[[memoryview], object]) -> None:
    """Pass ``source``'s bytes to ``write`` a chunk at a time through one buffer (checked where the format has a
    checksum), for a writer that must see the bytes (a zip record's CRC-32 is computed as it is written)."""
    with opened(source.path) as descriptor:
        buffer = memoryview(bytearray(min(CHECKED_CHUNK, source.length)))
        for position in range(0, source.length, len(buffer)):
            piece = buffer[:min(len(buffer), source.length - position)]
            pread_exactly(source.path, descriptor, piece, source.offset + position)
            if source.check is not None:
                source.check(position, piece)
            write(piece)
            COUNTS.add("streamed", len(piece), first_chunk=not position)


def _kernel_copy(method: str, descriptor: int, offset: int, count: int, destination: int,
                 destination_offset: int) -> int:
    if method == "copy_file_range":
        return os.copy_file_range(descriptor, destination, count, offset, destination_offset)
    if method == "sendfile":  # writes at the destination's file position
        os.lseek(destination, destination_offset, os.SEEK_SET)
        return os.sendfile(destination, descriptor, offset, count)
    raise ValueError(f"unknown copy method {method!r}")


def _read_or_write_error(source: ByteRange, error: OSError) -> Exception:
    """A failed kernel copy: the disk being full is the output's problem (OSError, as a write says it); anything
    else is reported on the input."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return error
    return CogExportError(f"cannot copy from {source.path}: {error.strerror}")
