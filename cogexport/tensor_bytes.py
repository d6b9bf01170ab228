"""Raw byte access to CPU tensors, so data moves between files and tensors without extra copies."""

from __future__ import annotations

import mmap
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

from .errors import CogExportError

CAST_WINDOW = 64 << 20  # the most of a range mapped at once while it is cast (cast_ranges)

if TYPE_CHECKING:
    from .lazy import ByteRanges


def tensor_buffer(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (it keeps the tensor alive)."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise ValueError("tensor_buffer needs a contiguous CPU tensor")
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")


def pread_into(fd: int, buffer: memoryview, offset: int) -> None:
    """Fill ``buffer`` from ``fd`` at ``offset``; a short read means the file ended early."""
    done = 0
    while done < len(buffer):
        got = os.preadv(fd, [buffer[done:]], offset + done)
        if got == 0:
            raise EOFError(f"file ends {len(buffer) - done} bytes early")
        done += got


@contextmanager
def opened(path: str) -> Iterator[int]:
    """A read-only descriptor of the file ``path``; a file that cannot be opened is one line naming it."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError as error:
        raise CogExportError(f"cannot read {path}: {error.strerror}") from None
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def pread_exactly(path: str, descriptor: int, buffer: memoryview, offset: int) -> None:
    """``pread_into`` of the open file ``path``, its failures one line naming the file."""
    try:
        pread_into(descriptor, buffer, offset)
    except EOFError as error:
        raise CogExportError(f"{path}: {error} (truncated?); copy it again") from None
    except OSError as error:
        raise CogExportError(f"cannot read {path}: {error.strerror}") from None


class MappedWindow:
    """``length`` bytes at ``offset`` of an open file as a memory view (the page cache itself, nothing copied), used
    as a context manager. Made here, so that a file system that cannot map raises OSError or ValueError before any
    use: shared and read-only, pre-faulted; or (``private``) private and writable, only so that torch takes the view
    without a warning: nothing writes to it, and a write would change a private copy, never the file."""

    def __init__(self, descriptor: int, offset: int, length: int, private: bool = False) -> None:
        aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
        if private:
            flags, protection = mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE
        else:
            flags, protection = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), mmap.PROT_READ
        self._mapped = mmap.mmap(descriptor, offset - aligned + length, flags=flags, prot=protection, offset=aligned)
        self._view = memoryview(self._mapped)
        self._window = self._view[offset - aligned:]

    def __enter__(self) -> memoryview:
        return self._window

    def __exit__(self, *exc) -> None:  # views released before unmapping, even when their user raised
        self._window.release()
        self._view.release()
        self._mapped.close()


def read_ranges(ranges: "ByteRanges", shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A new tensor of ``shape`` and ``dtype`` whose bytes are ``ranges`` end to end, each range's check (a
    record's CRC-32) passed the bytes read, as a copy of them would pass them."""
    tensor = torch.empty(shape, dtype=dtype)
    buffer, position = tensor_buffer(tensor), 0
    for part in ranges:
        piece = buffer[position:position + part.length]
        with opened(part.path) as descriptor:
            pread_exactly(part.path, descriptor, piece, part.offset)
        if part.check is not None:
            part.check(0, piece)
        position += part.length
    return tensor


def cast_ranges(ranges: "ByteRanges", shape: torch.Size, stored: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """A new tensor of ``shape`` in ``dtype`` made from the bytes ``ranges`` hold end to end, elements of ``stored``:
    each range is cast straight from a memory map of its file (the page cache itself), not read into memory of this
    process first (a copy of every byte: reading then casting took 2.4 s where this takes 0.65 s, for a 5.7 GB fp32
    Wan release cast to bf16). Each range's check (a record's CRC-32) is passed the mapped bytes first. A range is
    mapped CAST_WINDOW bytes at a time, so that no more than that of the input is mapped at once beside the output
    (a 14B model's FFN weight is 283 MB in fp32)."""
    out = torch.empty(shape, dtype=dtype)
    flat, position = out.view(-1), 0
    step = CAST_WINDOW - CAST_WINDOW % stored.itemsize
    for part in ranges:
        with opened(part.path) as descriptor:
            if os.fstat(descriptor).st_size < part.offset + part.length:
                raise CogExportError(f"{part.path} ends early (truncated?); copy it again")
            for start in range(0, part.length, step):
                length = min(step, part.length - start)
                with MappedWindow(descriptor, part.offset + start, length, private=True) as view:
                    if part.check is not None:
                        part.check(start, view)
                    count = length // stored.itemsize
                    flat[position:position + count].copy_(torch.frombuffer(view, dtype=stored, count=count))
                position += count
    return out
