"""Megatron-Core's flattened optimizer tensors in a ``torch_dist`` save, read in their parameters' own shapes.

megatron-core 0.8-0.15's distributed optimizer saves, in its ``fully_sharded_model_space`` layout (their default),
each parameter's fp32 master and Adam states as ShardedTensors with a ``flattened_range``: a rank's part is a flat
range ``[start, stop)`` of its piece of the parameter (the piece flattened in C order), because the optimizer's
grad buffer is cut into data-parallel ranges without regard to parameters. Its torch_dist strategy cannot give DCP
such a range as a box, so it stores the tensor under another global shape (strategies/torch.py
``sharded_tensor_to_torch_sharded_tensor``, strategies/resharding.py ``nd_flattened_tensor_reformulated_global_shape``):
a parameter of global shape ``G`` cut into pieces of shape ``c`` (``F[i] = G[i] / c[i]`` pieces on axis ``i``; a
stacked layer axis counts as cut into single layers) is stored as ``[F[0], ..., F[n-1], prod(c)]``, and a rank's
range of the piece with index ``f`` as the DCP chunk at ``[f[0], ..., f[n-1], start]`` of size ``[1, ..., 1, stop -
start]``. ``G`` itself is recorded in the ``.metadata`` (``MCoreMetadata.mcore_data[key]
["nd_reformulated_orig_global_shape"]``, read by dcp_metadata.py); the rest follows from the stored shape.

``FlattenedFiles`` presents each such tensor as a tensor of shape ``G`` whose chunks are the whole pieces (``[f[i] *
c[i]]`` of size ``c``), each piece read from the flat ranges that make it up; everything else is the DCP save's as it
is. The ranges of every piece must cover it exactly (DCP's own check of the stored shape's chunks, which maps one to
one onto the pieces' elements), and a chunk that is not one piece's range, or a stored shape that does not follow from
``G``, is refused as a damaged ``.metadata``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..errors import CogExportError, quoted
from ..lazy import LazyTensor
from .dcp import DcpFiles
from .dcp_metadata import METADATA_FILE, Chunk, TensorEntry


@dataclass(frozen=True)
class Pieces:
    """How a flattened tensor is stored: the original shape, the piece shape, and each piece's flat ranges
    (``piece offsets -> ((start, stop, stored chunk), ...)`` in order)."""

    shape: tuple[int, ...]
    piece: tuple[int, ...]
    ranges: dict[tuple[int, ...], tuple[tuple[int, int, Chunk], ...]]


def is_flattened_form(stored: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether ``stored`` is megatron-core's flattened form of some cut of ``shape`` into even pieces."""
    return len(stored) == len(shape) + 1 and all(f > 0 and g % f == 0 for g, f in zip(shape, stored)) and \
        math.prod(g // f for g, f in zip(shape, stored)) == stored[-1]


def pieces_of(files: DcpFiles, key: str, shape: tuple[int, ...]) -> Pieces:
    """The pieces of the tensor stored under ``key`` whose original shape is ``shape``; one line if the stored shape
    or chunks do not follow megatron-core's rule (module docstring)."""
    entry = files.metadata.entries[key]
    stored = tuple(entry.size)
    where = f"{files.folder / METADATA_FILE}: {quoted(key)}"
    if not is_flattened_form(stored, shape):
        raise CogExportError(f"{where} is stored as {list(stored)}, which is not megatron-core's flattened form of "
                             f"the shape {list(shape)} it records (pieces per axis, then one piece's elements): the "
                             ".metadata is damaged; copy the iteration folder again")
    piece = tuple(g // f for g, f in zip(shape, stored))
    ranges: dict[tuple[int, ...], list[tuple[int, int, Chunk]]] = {}
    for chunk in files.check_chunks(key, entry):  # they tile the stored shape: each piece's ranges tile the piece
        if any(size != 1 for size in chunk.sizes[:-1]):
            raise CogExportError(f"{where}: a chunk at {list(chunk.offsets)} of size {list(chunk.sizes)} spans "
                                 "several pieces, where megatron-core stores one flat range of one piece: the "
                                 ".metadata is damaged; copy the iteration folder again")
        start = chunk.offsets[-1]
        ranges.setdefault(tuple(o * p for o, p in zip(chunk.offsets[:-1], piece)), []).append(
            (start, start + chunk.sizes[-1], chunk))
    return Pieces(shape, piece, {at: tuple(sorted(found, key=lambda r: r[0])) for at, found in ranges.items()})


class FlattenedFiles:
    """A torch_dist iteration's DCP save with its flattened tensors in their recorded shapes (module docstring); the
    rest of the save, and everything else DcpFiles does, as it is."""

    def __init__(self, files: DcpFiles) -> None:
        self._files = files
        self.flattened = {key: pieces_of(files, key, shape) for key, shape in files.metadata.reformulated.items()}
        entries = dict(files.metadata.entries)
        for key, pieces in self.flattened.items():
            entries[key] = TensorEntry(entries[key].dtype, torch.Size(pieces.shape),
                                       tuple(Chunk(at, pieces.piece) for at in pieces.ranges))
        self.metadata = replace(files.metadata, entries=entries)

    def __getattr__(self, name: str):  # folder, files, world_size, bytes_read, check_all, ...: the save's own
        return getattr(self._files, name)

    def check_chunks(self, key: str, entry: TensorEntry) -> tuple[Chunk, ...]:
        return entry.chunks if key in self.flattened else self._files.check_chunks(key, entry)

    def lazy(self, key: str, entry: TensorEntry, origin: str) -> LazyTensor:
        if key not in self.flattened:
            return self._files.lazy(key, entry, origin)
        return LazyTensor(entry.size, entry.dtype, lambda: self._assemble(key, entry), origin)

    def lazy_row(self, key: str, entry: TensorEntry, row: int, origin: str) -> LazyTensor:
        if key not in self.flattened:
            return self._files.lazy_row(key, entry, row, origin)
        return LazyTensor(entry.size[1:], entry.dtype, lambda: self._assemble_row(key, entry, row), origin)

    def read_elements(self, key: str, entry: TensorEntry, chunk: Chunk, start: int, stop: int) -> torch.Tensor:
        """Elements ``start .. stop`` of one piece, flattened, from the stored ranges holding them (unchecked: for a
        comparison only, as DcpFiles.read_elements)."""
        if key not in self.flattened:
            return self._files.read_elements(key, entry, chunk, start, stop)
        return self._piece(key, chunk.offsets, start, stop, check=False)

    def _piece(self, key: str, at: tuple[int, ...], start: int, stop: int, check: bool = True) -> torch.Tensor:
        stored_entry = self._files.metadata.entries[key]
        out = torch.empty(stop - start, dtype=stored_entry.dtype)
        for first, last, chunk in self.flattened[key].ranges[at]:
            low, high = max(first, start), min(last, stop)
            if low >= high:
                continue
            where = self._files.metadata.storage[(key, chunk.offsets)]
            archive, stored = self._files.open_chunk(key, stored_entry, chunk)
            try:
                stored.read_flat(low - first, high - first, out=out[low - start:high - start], check=check)
            finally:
                archive.close()
            self._files.bytes_read[where.file] = self._files.bytes_read.get(where.file, 0) + \
                (high - low) * stored_entry.dtype.itemsize
        return out

    def _assemble(self, key: str, entry: TensorEntry) -> torch.Tensor:
        pieces, out = self.flattened[key], torch.empty(entry.size, dtype=entry.dtype)
        count = math.prod(pieces.piece)
        for at in pieces.ranges:
            out[tuple(slice(o, o + p) for o, p in zip(at, pieces.piece))] = \
                self._piece(key, at, 0, count).view(pieces.piece)
        return out

    def _assemble_row(self, key: str, entry: TensorEntry, row: int) -> torch.Tensor:
        """Row ``row`` of the leading axis (a stacked tensor's layer), from the pieces holding it alone."""
        pieces, out = self.flattened[key], torch.empty(entry.size[1:], dtype=entry.dtype)
        per_row = math.prod(pieces.piece[1:])
        for at in pieces.ranges:
            if not at[0] <= row < at[0] + pieces.piece[0]:
                continue
            start = (row - at[0]) * per_row  # a row of a piece is one run of its flat elements
            out[tuple(slice(o, o + p) for o, p in zip(at[1:], pieces.piece[1:]))] = \
                self._piece(key, at, start, start + per_row).view(pieces.piece[1:])
        return out


def flattened_view(files: DcpFiles) -> DcpFiles | FlattenedFiles:
    """The save with its flattened tensors in their recorded shapes, where it has any; else the save itself."""
    return FlattenedFiles(files) if files.metadata.reformulated else files
