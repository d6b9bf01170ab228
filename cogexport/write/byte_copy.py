"""Copy bytes of one file into another without passing them through this process, where the kernel can.

A tensor written exactly as it is stored in the input (same dtype, no transform) needs no load: its byte range is
copied file to file. ``os.copy_file_range`` copies inside the kernel (page cache to page cache, or a reflink on file
systems that share blocks); where it is refused (another file system on older kernels, a file system without it)
``os.sendfile`` still copies in the kernel; last, a read/write loop through one small reused buffer.

A range whose format stores a checksum (a torch.save record's CRC-32) is copied a chunk at a time, and each chunk,
still in the page cache, is passed to the reader's check through a memory map of the input (no copy into this
process; a plain read where the file cannot be mapped): an output is never made of bytes that fail it. The map is
private, so that torch can view its values (the values of every copied tensor are counted: value_watch.py) without
warning that they could be written: nothing writes to it. (Measured: no slower than a shared, pre-faulted map.) The
checks run in a helper thread (``TrailingChecks``) while the kernel copies the next chunk, and are all waited for
before a copy returns, or, where a writer hands its own over, before the writer finishes its file.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter, deque
from contextlib import ExitStack
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Callable

from ..errors import CogExportError
from ..lazy import ByteRange
from ..tensor_bytes import MappedWindow, opened, pread_exactly

METHODS = ("copy_file_range", "sendfile", "read_write")
CHECKED_CHUNK = 8 << 20  # bytes copied, then read back and checked, at a time
_WAITING_CHECKS = 16  # checks queued behind the copies at most (TrailingChecks)
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


class TrailingChecks:
    """The checks of copied chunks, run in turn by one helper thread while the writer copies on: a kernel copy and a
    CRC-32 of mapped page cache both release the GIL, so on two cores the checks cost no time of their own. Up to
    ``_WAITING_CHECKS`` wait their turn (a small tensor's check can outlast the next small copy; a queue evens that
    out); a waiting check holds nothing, and only the running one maps its chunk.

    A writer uses it as a context manager around the copies of one file and calls ``drain()`` before it finishes
    the file: that waits for every check and raises what the first failing one raised, so no file is finished with
    bytes that failed a check. Leaving on an error waits for the running check, drops the waiting ones and keeps the
    writer's error."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future] = deque()

    def run(self, check: Callable[[], None]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="cogexport-check")
        self._pending.append(self._pool.submit(check))
        while len(self._pending) > _WAITING_CHECKS:
            self._pending.popleft().result()

    def drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def __enter__(self) -> "TrailingChecks":
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is None:
                self.drain()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)


class _Unsupported(Exception):
    """This method cannot copy between these two files; the next one is tried."""


def copy_range(source: ByteRange, destination: int, destination_offset: int,
               methods: tuple[str, ...] | None = None, checks: TrailingChecks | None = None) -> str:
    """Copy ``source``'s bytes into the open file ``destination`` at ``destination_offset``; leaves the destination's
    file position after them. Returns the method that copied the (first) bytes. ``methods``: which to try, in order
    (default: ``METHODS``). ``checks``: where the checks of kernel-copied chunks run, a writer's for a whole file
    (some may still be running when this returns); by default, ones of this copy's own, all passed before it returns."""
    with opened(source.path) as descriptor, ExitStack() as stack:
        own_checks = checks if checks is not None else stack.enter_context(TrailingChecks())
        try:
            return _RangeCopy(source, descriptor, destination, destination_offset, own_checks).run(
                list(methods or METHODS))
        finally:
            os.lseek(destination, destination_offset + source.length, os.SEEK_SET)


class _RangeCopy:
    """One range from an open source to an open destination; positions count from the range's first byte."""

    def __init__(self, source: ByteRange, descriptor: int, destination: int, destination_offset: int,
                 checks: TrailingChecks) -> None:
        self.source, self.descriptor = source, descriptor
        self.destination, self.destination_offset = destination, destination_offset
        self.checks = checks
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
            self.checks.run(partial(check_copied, self.source, start, copied))
        if copied < count:
            self._read_write(start + copied, count - copied)

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


def check_copied(source: ByteRange, start: int, count: int) -> None:
    """Pass ``count`` bytes of ``source`` from ``start``, just copied and still in the page cache, to its check:
    mapped, not copied; read back through a buffer where the file cannot be mapped. The file is opened here: the
    check runs behind the copy, which may have closed its own descriptor by then."""
    with opened(source.path) as descriptor:
        _check_open_file(source, start, count, descriptor)


def _check_open_file(source: ByteRange, start: int, count: int, descriptor: int) -> None:
    try:
        window = MappedWindow(descriptor, source.offset + start, count, private=True)
    except (OSError, ValueError):  # a file system that cannot map: read the bytes back instead
        buffer = memoryview(bytearray(min(CHECKED_CHUNK, count)))
        for position in range(start, start + count, len(buffer)):
            piece = buffer[:min(len(buffer), start + count - position)]
            pread_exactly(source.path, descriptor, piece, source.offset + position)
            source.check(position, piece)
        return
    with window as view:
        source.check(start, view)


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
