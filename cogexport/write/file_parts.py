"""Write a tensor file's tensors at the offsets its layout plans, so that any run of them can be written on its own.

A safetensors or GGUF file's layout (its header's bytes, where each tensor's data begins, the file's length) follows
from the tensors' names, shapes and dtypes alone, so it is known before a byte of data is. A whole file is then one
run written in order; under torchrun, ranks that have fewer files than processes each write a run of one file's
tensors, side by side, into the same file (rank_shares.py): each opens the file without truncating it, extends it
to its planned length (gaps read as zeros, as the format's padding is), and writes its tensors at their offsets; the
first rank's share writes the header. No rank's bytes depend on another's, so the file is the one a single
process writes.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from contextlib import ExitStack
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..tensor_bytes import tensor_buffer
from .byte_copy import TrailingChecks, copy_range
from .io_engine import Payload


@dataclass(frozen=True)
class PlacedTensor:
    """One tensor's data in a file: ``nbytes`` at ``offset``, written under ``name`` (progress reports)."""

    name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class FileLayout:
    """A tensor file as planned: ``header`` (every byte before the first tensor's data), its tensors in the order
    their data is written, and ``size``, the file's length (any padding after the last tensor included)."""

    header: bytes
    tensors: tuple[PlacedTensor, ...]
    size: int

    def run_bytes(self, run: range) -> int:
        return sum(self.tensors[index].nbytes for index in run)


def placed_one_after_another(header: bytes, tensors: Sequence[tuple[str, int]], alignment: int = 1) -> FileLayout:
    """The layout of ``header`` followed by ``tensors`` (name, bytes) in order: the header padded with zeros to a
    multiple of ``alignment`` bytes, and each tensor padded to the next multiple (GGUF's data section; safetensors
    packs them, ``alignment`` 1)."""
    header = header + bytes(-len(header) % alignment)
    placed, offset = [], len(header)
    for name, nbytes in tensors:
        placed.append(PlacedTensor(name, offset, nbytes))
        offset += nbytes + -nbytes % alignment
    return FileLayout(header, tuple(placed), offset)


def balanced_runs(layout: FileLayout, count: int) -> list[range]:
    """The layout's tensors cut into ``count`` runs in order, of nearly equal bytes: run k begins at the boundary
    between tensors nearest to k / count of the whole (a tensor is never cut, so a run may be empty)."""
    bounds = [0, *accumulate(tensor.nbytes for tensor in layout.tensors)]
    cuts = [0]
    for part in range(1, count):
        target = bounds[-1] * part / count
        above = bisect_left(bounds, target)  # the first boundary at or past the target
        below_is_nearer = above == len(bounds) or (above > 0 and target - bounds[above - 1] <= bounds[above] - target)
        nearest = above - 1 if below_is_nearer else above
        cuts.append(max(cuts[-1], nearest))
    cuts.append(len(layout.tensors))
    return [range(cuts[part], cuts[part + 1]) for part in range(count)]


def write_run(path: Path, layout: FileLayout, run: range, payloads: Iterator[Payload], *, whole: bool,
              header: bool = True, on_tensor: Callable[[str, int], None] | None = None) -> int:
    """Write the tensors ``run`` of ``layout`` (their data: ``payloads``, in order) into the file ``path`` at their
    offsets, and (``header``) the header; returns the bytes of tensor data written. ``whole``: this is the whole
    file, written by this process alone (an existing file is emptied first); else other processes write the other
    runs into the same file at the same time, and nothing they write is touched."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if whole else 0)
    written = 0
    with ExitStack() as stack:
        descriptor = os.open(path, flags, 0o666)
        stack.callback(os.close, descriptor)
        checks = stack.enter_context(TrailingChecks())
        if os.fstat(descriptor).st_size < layout.size:  # any rank may be first: each only ever extends it
            os.ftruncate(descriptor, layout.size)
        if header:
            pwrite_all(descriptor, memoryview(layout.header), 0)
        for index in run:
            placed = layout.tensors[index]
            write_payload_at(descriptor, next(payloads), placed.offset, checks)
            written += placed.nbytes
            if on_tensor is not None:
                on_tensor(placed.name, placed.nbytes)
        checks.drain()
    return written


def write_payload_at(descriptor: int, payload: Payload, offset: int, checks: TrailingChecks | None = None) -> None:
    """A tensor's bytes at ``offset`` of the open file: copied from the input files (byte ranges, end to end: see
    ``copy_range``; ``checks``, where their checks run) or from memory."""
    if isinstance(payload, tuple):
        for part in payload:
            copy_range(part, descriptor, offset, checks=checks)
            offset += part.length
    else:
        pwrite_all(descriptor, tensor_buffer(payload.contiguous()), offset)


def pwrite_all(descriptor: int, data: memoryview, offset: int) -> None:
    while len(data):
        done = os.pwrite(descriptor, data, offset)
        data, offset = data[done:], offset + done
