"""NaN and infinite values are never passed on silently: every tensor a write hands over is counted where the write's
streams already touch its values, and one holding any is refused (one line naming it and how many, and the run fails
before anything is published) unless the user asked for them to be written (``allow``), when a note names it.

Where the values are counted:

- a tensor the workers load (read, cast, assembled from ZeRO partitions, fused with a LoRA, quantized) is counted in
  the loading thread on the values just made, before the writer takes them: what is written, so a cast that
  overflows (fp32 past float16's range, to fp16) counts too;
- a tensor copied file to file (byte_copy.py) is counted a chunk at a time as each copied chunk is read back from the
  page cache, behind the copies: in the helper thread, on the map, that check a torch.save record's CRC-32; a
  safetensors input (no checksum) gets that read-back for its values alone;
- a producer that meets such values itself (a GGUF or fp8 scale) raises ``NonfiniteValuesError``, and the watch
  decides: refused, or written as the producer can write them.
"""

from __future__ import annotations

import threading
from functools import partial

import torch

from ..errors import CogExportError, quoted
from ..finite_values import ALLOW_FLAG, NONE_OF_NONE, NonfiniteCount, NonfiniteValuesError, can_hold_nonfinite, \
    count_nonfinite, count_nonfinite_bytes
from ..lazy import ByteRange, ByteRanges, LazyTensor
from ..tensor_bytes import opened, pread_exactly

_NAMED_IN_NOTE = 8  # tensors a note names; the rest are counted


class ValueWatch:
    """The non-finite values of one write's tensors (``allow``: written and named, rather than refused)."""

    def __init__(self, allow: bool = False) -> None:
        self.allow = allow
        self.passed_on: list[str] = []  # each tensor written with NaN or infinite values, and how many
        self._lock = threading.Lock()

    def watched(self, tensor: LazyTensor, name: str, file: str) -> LazyTensor:
        """``tensor`` as a feed hands it over, its values counted on the way (``name`` in ``file``: for messages)."""
        where = f"tensor {quoted(name)} of {file}"
        return LazyTensor(tensor.shape, tensor.dtype, partial(self._load, tensor, where), tensor.origin,
                          find_source=partial(self._counted_ranges, tensor, where))

    def report(self, where: str, count: NonfiniteCount, why_not: str = "") -> None:
        """The count of one whole tensor: refused if it holds any non-finite value (always, with ``why_not``: what
        the format cannot hold), unless asked for."""
        if not count:
            return
        if why_not or not self.allow:
            raise CogExportError(refusal(where, count, why_not))
        with self._lock:
            self.passed_on.append(f"{where} ({count})")

    def _load(self, tensor: LazyTensor, where: str) -> torch.Tensor:
        try:
            values = tensor.load()
        except NonfiniteValuesError as met:  # the producer met them and counted them
            self.report(where, met.count, "" if met.write_anyway else met.why_not)
            return met.write_anyway()
        self.report(where, count_nonfinite(values))
        return values

    def _counted_ranges(self, tensor: LazyTensor, where: str) -> ByteRanges | None:
        """The tensor's byte ranges, each checked as before and its values counted as it is read back; None (loaded,
        and counted whole) where a range does not hold whole values."""
        ranges = tensor.byte_ranges()
        if ranges is None or not can_hold_nonfinite(tensor.dtype):
            return ranges
        if any(part.length % tensor.dtype.itemsize for part in ranges):
            return None
        values = CopiedValues(self, where, tensor.dtype, tensor.nbytes)
        return tuple(ByteRange(part.path, part.offset, part.length, partial(values.check, part)) for part in ranges)


class CopiedValues:
    """One copied tensor's values, counted as its bytes are read back (pieces of any size, in any order, each byte
    once: the checks of a copy see every byte it copies once), and reported when the last byte is seen."""

    def __init__(self, watch: ValueWatch, where: str, dtype: torch.dtype, nbytes: int) -> None:
        self.watch, self.where, self.dtype, self.nbytes = watch, where, dtype, nbytes
        self.count, self.seen = NONE_OF_NONE, 0
        self._lock = threading.Lock()

    def check(self, part: ByteRange, start: int, data: memoryview) -> None:
        """``data``: ``part``'s bytes from ``start``. The part's own check (a record's CRC-32) runs first, so that
        damage is named as damage."""
        if part.check is not None:
            part.check(start, data)
        count = self._count_piece(part, start, data)
        with self._lock:
            self.count, self.seen = self.count + count, self.seen + len(data)
            done = self.seen == self.nbytes
        if done:
            self.watch.report(self.where, self.count)

    def _count_piece(self, part: ByteRange, start: int, data: memoryview) -> NonfiniteCount:
        """The values that begin in this piece: those it holds whole, and one it holds only the start of (a piece
        ending mid-value, after a short kernel copy), read from the file."""
        size = self.dtype.itemsize
        first = -start % size  # bytes of a value begun in the piece before
        whole = max(0, (len(data) - first) // size)
        count = count_nonfinite_bytes(data[first:first + whole * size], self.dtype)
        cut = first + whole * size
        if cut < len(data):
            count = count + self._count_read(part, start + cut)
        return count

    def _count_read(self, part: ByteRange, position: int) -> NonfiniteCount:
        value = memoryview(bytearray(self.dtype.itemsize))
        with opened(part.path) as descriptor:
            pread_exactly(part.path, descriptor, value, part.offset + position)
        return count_nonfinite_bytes(value, self.dtype)


def refusal(where: str, count: NonfiniteCount, why_not: str = "") -> str:
    advice = f"{why_not}; " if why_not else ""
    allow = "" if why_not else f", or pass {ALLOW_FLAG} to write them anyway"
    return (f"{where} holds NaN or infinite values ({count}); {advice}nothing was written: fix the checkpoint (a "
            f"damaged file, or a run that diverged: export an earlier step){allow}")


def passed_on_note(passed_on: list[str]) -> str | None:
    """The note naming the tensors written with NaN or infinite values, as the user asked (None: there were none)."""
    if not passed_on:
        return None
    named = "; ".join(passed_on[:_NAMED_IN_NOTE])
    more = f"; and {len(passed_on) - _NAMED_IN_NOTE} more tensors" if len(passed_on) > _NAMED_IN_NOTE else ""
    return f"written with NaN or infinite values, as {ALLOW_FLAG} asked: {named}{more}"
