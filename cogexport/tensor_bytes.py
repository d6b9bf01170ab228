"""Raw byte access to CPU tensors, so data moves between files and tensors without extra copies."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from .errors import CogExportError

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


def read_ranges(ranges: "ByteRanges", shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A new tensor of ``shape`` and ``dtype`` whose bytes are ``ranges`` end to end, each range's check (a
    record's CRC-32) passed the bytes read, as a copy of them would pass them."""
    tensor = torch.empty(shape, dtype=dtype)
    buffer, position = tensor_buffer(tensor), 0
    for part in ranges:
        piece = buffer[position:position + part.length]
        try:
            descriptor = os.open(part.path, os.O_RDONLY)
        except OSError as error:
            raise CogExportError(f"cannot read {part.path}: {error.strerror}") from None
        try:
            pread_into(descriptor, piece, part.offset)
        except EOFError:
            raise CogExportError(f"{part.path} ends early (truncated?); copy it again") from None
        except OSError as error:
            raise CogExportError(f"cannot read {part.path}: {error.strerror}") from None
        finally:
            os.close(descriptor)
        if part.check is not None:
            part.check(0, piece)
        position += part.length
    return tensor
