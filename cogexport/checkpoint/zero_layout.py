"""Where each parameter lives inside ZeRO's rank partitions, and gathering it from only the ranks that hold it.

ZeRO-1/2 flatten each parameter group into one buffer, padded so it splits evenly, and give rank r the slice
``[r*S, (r+1)*S)``. ZeRO-3 splits every parameter separately into ``ceil(n/ws)``-element pieces, one per rank,
packed one after another in each rank's sub-group buffer. Both layouts are pure arithmetic on the shapes the
model-states file records, so a parameter can be located and read before touching any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .torch_archive import StoredTensor


@dataclass(frozen=True)
class Slot:
    """One parameter's place in a flat group: element offset and count, and its shape."""

    offset: int
    numel: int
    shape: torch.Size


@dataclass
class FlatGroupLayout:
    """A ZeRO-1/2 flat group: parameters laid end to end (with alignment gaps), cut into equal rank slices."""

    world_size: int
    slots: dict[str, Slot] = field(default_factory=dict)
    total: int = 0  # N: elements used, gaps included, tail padding excluded

    @classmethod
    def build(cls, shapes: dict[str, torch.Size], world_size: int, gaps: Sequence[int] | None) -> "FlatGroupLayout":
        layout = cls(world_size)
        offset = 0
        for index, (name, shape) in enumerate(shapes.items()):
            numel = torch.Size(shape).numel()
            layout.slots[name] = Slot(offset, numel, torch.Size(shape))
            offset += numel + (gaps[index] if gaps else 0)
        layout.total = offset
        return layout

    @property
    def partition_size(self) -> int:
        # DeepSpeed pads the group to a multiple of 2 * world_size before splitting it.
        alignment = 2 * self.world_size
        return math.ceil(self.total / alignment) * alignment // self.world_size

    def saved_length(self, rank: int, padding_stripped: bool = True) -> int:
        """Elements rank ``rank`` saved: its slice, without the tail padding unless the optimizer keeps it."""
        size = self.partition_size
        return min(max(self.total - rank * size, 0), size) if padding_stripped else size

    def gather(self, name: str, partitions: Sequence[StoredTensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Parameter ``name`` read from the rank partitions that hold it (usually one, two where it straddles)."""
        slot = self.slots[name]
        out = torch.empty(slot.numel, dtype=dtype)
        done = 0
        for rank, start, stop in self.partition_pieces(name):
            partitions[rank].read_flat(start, stop, out[done:done + stop - start])
            done += stop - start
        return out.view(slot.shape)

    def partition_pieces(self, name: str) -> list[tuple[int, int, int]]:
        """(rank, start, stop): the elements of rank partitions that, end to end, are parameter ``name``."""
        slot, size = self.slots[name], self.partition_size
        return [(rank, slot.offset + start - rank * size, slot.offset + stop - rank * size)
                for rank, start, stop in self.pieces(name)]

    def pieces(self, name: str) -> list[tuple[int, int, int]]:
        """(rank, start, stop): which elements of parameter ``name`` each rank holding it has."""
        slot, size = self.slots[name], self.partition_size
        return [(rank, max(slot.offset, rank * size) - slot.offset, min(slot.offset + slot.numel, (rank + 1) * size)
                 - slot.offset) for rank in self.ranks_holding(name) if slot.numel]

    def fragments(self, rank: int) -> dict[str, tuple[int, int]]:
        """What DeepSpeed records as rank ``rank``'s param_slice_mappings: {name: (start in the partition, numel)}."""
        size = self.partition_size
        return {name: (self.slots[name].offset + start - rank * size, stop - start)
                for name in self.slots for piece_rank, start, stop in self.pieces(name) if piece_rank == rank}

    def ranks_holding(self, name: str) -> range:
        slot = self.slots[name]
        size = self.partition_size
        return range(slot.offset // size, (slot.offset + max(slot.numel, 1) - 1) // size + 1)


@dataclass
class Zero3SubGroupLayout:
    """A ZeRO-3 sub-group: each parameter split into ``ceil(n/ws)``-element pieces, one per rank."""

    world_size: int
    slots: dict[str, Slot] = field(default_factory=dict)  # offset and piece length within each rank's buffer
    length: int = 0

    @classmethod
    def build(cls, shapes: dict[str, torch.Size], world_size: int) -> "Zero3SubGroupLayout":
        layout = cls(world_size)
        for name, shape in shapes.items():
            piece = math.ceil(torch.Size(shape).numel() / world_size)
            layout.slots[name] = Slot(layout.length, piece, torch.Size(shape))
            layout.length += piece
        return layout

    def gather(self, name: str, partitions: Sequence[StoredTensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        slot = self.slots[name]
        return gather_zero3_pieces(partitions, slot.offset, slot.numel, slot.shape, dtype)

    def partition_pieces(self, name: str) -> list[tuple[int, int, int]]:
        """(rank, start, stop): the elements of rank partitions that, end to end, are parameter ``name`` (the
        padding at the end of the last pieces left out)."""
        slot = self.slots[name]
        total = slot.shape.numel()
        counts = [min(slot.numel, total - rank * slot.numel) for rank in range(self.world_size)]
        return [(rank, slot.offset, slot.offset + count) for rank, count in enumerate(counts) if count > 0]


def gather_zero3_pieces(pieces: Sequence[StoredTensor], offset: int, piece: int, shape: torch.Size,
                        dtype: torch.dtype) -> torch.Tensor:
    """Concatenate each rank's ``piece`` elements from ``offset`` and cut the padding (garbage) off the end."""
    out = torch.empty(piece * len(pieces), dtype=dtype)
    for rank, stored in enumerate(pieces):
        stored.read_flat(offset, offset + piece, out[rank * piece:(rank + 1) * piece])
    return out[: shape.numel()].view(shape)
