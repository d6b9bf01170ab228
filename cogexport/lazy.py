"""The unit every stage of the pipe hands to the next: a tensor known by shape and dtype, loaded on demand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .tensor_bytes import cast_ranges


class SizedTensor:
    """numel and nbytes for anything with a ``shape`` and a ``dtype``."""

    shape: torch.Size
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return self.shape.numel()

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class ByteRange:
    """Where a tensor's bytes lie in a file exactly as they would be written (same dtype, C order, nothing to
    transform): ``length`` bytes at ``offset`` of ``path``. A writer may then copy them file to file, in the kernel,
    instead of loading the tensor.

    ``check(start, data)`` checks ``data``, the range's bytes from ``start`` as read from the file, for formats that
    store a checksum (a torch.save record's CRC-32; it raises on a mismatch once the bytes it covers are all seen):
    a copy must pass every byte it copies through it, so that a damaged input is refused as a load would refuse it.
    None where the format stores no checksum.
    """

    path: str
    offset: int
    length: int
    check: Callable[[int, memoryview], None] | None = None


# A tensor's bytes as file ranges to be joined end to end, in order.
ByteRanges = tuple[ByteRange, ...]


def joined_ranges(parts: list[ByteRange]) -> ByteRanges:
    """``parts`` end to end, empty ones dropped and neighbours in one file that meet merged (one copy, not two);
    pieces with a checksum are kept apart, since each carries its own record's check."""
    joined: list[ByteRange] = []
    for part in parts:
        if not part.length:
            continue
        last = joined[-1] if joined else None
        if last is not None and last.check is None and part.check is None and last.path == part.path \
                and last.offset + last.length == part.offset:
            joined[-1] = ByteRange(last.path, last.offset, last.length + part.length)
        else:
            joined.append(part)
    return tuple(joined)


def slice_ranges(ranges: ByteRanges, start: int, length: int) -> list[ByteRange]:
    """Bytes ``start`` .. ``start + length`` of the bytes ``ranges`` hold end to end, as ranges of the same files.
    A piece of a checked range keeps its check, told positions in the whole range (what the check counts from)."""
    pieces, position = [], 0
    for part in ranges:
        low, high = max(start, position), min(start + length, position + part.length)
        if low < high:
            pieces.append(_sub_range(part, low - position, high - low))
        position += part.length
    if sum(piece.length for piece in pieces) != length:
        raise ValueError(f"bytes {start}:{start + length} lie outside ranges of {position} bytes")
    return pieces


def _sub_range(part: ByteRange, skip: int, length: int) -> ByteRange:
    if skip == 0 and length == part.length:
        return part
    check = part.check
    shifted = None if check is None else (lambda position, data: check(skip + position, data))
    return ByteRange(part.path, part.offset + skip, length, shifted)


@dataclass(frozen=True)
class LazyTensor(SizedTensor):
    """A tensor whose shape and dtype are known up front and whose data is made only by ``load()``.

    ``origin`` says in a few words where the data comes from (for reports and error messages). ``source``, when
    known, is the byte ranges of files that hold exactly this tensor's bytes, end to end (one range for a tensor
    stored whole; several for one stored in pieces, as ZeRO and FSDP shard it across ranks); a plain rename hands
    the same LazyTensor on, so it keeps it, and any new LazyTensor (a cast, a split, anything computed) starts
    without one. ``find_source`` finds them when asked, for a reader that must open files to know (a DCP chunk's
    bytes lie inside its own small archive): see ``byte_ranges``.
    """

    shape: torch.Size
    dtype: torch.dtype
    loader: Callable[[], torch.Tensor]
    origin: str = ""
    source: ByteRanges | None = None
    find_source: Callable[[], ByteRanges | None] | None = None

    def __post_init__(self) -> None:
        if self.source is not None and sum(part.length for part in self.source) != self.nbytes:
            raise ValueError(f"{self.origin or 'lazy tensor'}: byte ranges of {sum(p.length for p in self.source)} "
                             f"bytes cannot hold {tuple(self.shape)} {self.dtype}")

    def byte_ranges(self) -> ByteRanges | None:
        """Where this tensor's bytes lie in input files as they are, if anywhere (the writer copies them from
        there); found on demand when the reader said how (``find_source``)."""
        if self.source is not None or self.find_source is None:
            return self.source
        found = self.find_source()
        if found is not None and sum(part.length for part in found) != self.nbytes:
            raise ValueError(f"{self.origin or 'lazy tensor'}: found byte ranges that cannot hold it")
        return found

    def load(self) -> torch.Tensor:
        tensor = self.loader()
        if tensor.shape != self.shape or tensor.dtype != self.dtype:
            raise RuntimeError(
                f"{self.origin or 'lazy tensor'} produced {tuple(tensor.shape)} {tensor.dtype}, "
                f"expected {tuple(self.shape)} {self.dtype}"
            )
        return tensor

    def to(self, dtype: torch.dtype) -> "LazyTensor":
        """The same tensor cast to ``dtype`` when loaded (itself, byte range included, when the dtype matches)."""
        if dtype == self.dtype:
            return self
        return LazyTensor(self.shape, dtype, lambda: self._cast(dtype), self.origin)

    def _cast(self, dtype: torch.dtype) -> torch.Tensor:
        """This tensor's data in ``dtype``: cast straight from the input files where its bytes lie in them as they
        are (``byte_ranges``), else loaded, then cast."""
        ranges = self.byte_ranges() if self.numel else None
        if ranges is None or any(part.length % self.dtype.itemsize for part in ranges):  # whole elements only
            return self.load().to(dtype)
        return cast_ranges(ranges, self.shape, self.dtype, dtype)
