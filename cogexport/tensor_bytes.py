"""Raw byte access to CPU tensors, so data moves between files and tensors without extra copies."""

from __future__ import annotations

import os

import torch


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
