"""Read zarr v2 arrays stored as plain files (``.zarray`` beside raw chunk files) without the zarr package.

A zarr v2 array is a folder: ``.zarray`` (JSON: ``shape``, ``chunks``, ``dtype``, ``compressor``, ``filters``,
``order``, ``fill_value``, ``zarr_format``; optionally ``dimension_separator``) and one file per chunk of the regular
grid ``chunks`` cuts the shape into, named by its grid indices joined with the separator (``1.0.0``; ``0`` for a 0-d
array). Uncompressed and unfiltered, a chunk file is the chunk's elements as raw bytes in C order, always the full
chunk shape: a chunk at the array's edge is stored whole, only the part inside the shape counts.

Only what a writer with no compressor and no filters leaves is read (Megatron-Core's zarr backend writes exactly
that); anything else is refused in one line naming the array. Opening checks every chunk file against the grid
(none missing, none outside it, each of the full chunk's size); zarr stores no checksum, so the bytes themselves
cannot be checked.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CogExportError, quoted
from ..tensor_bytes import opened, pread_exactly, tensor_buffer
from .dcp_metadata import Chunk
from .text_files import read_checkpoint_json

ARRAY_FILE = ".zarray"
# numpy's little-endian spellings, and Megatron-Core's own for bf16 (it rewrites numpy's "<V2" to "bfloat16")
ZARR_DTYPES = {
    "bfloat16": torch.bfloat16, "<f2": torch.float16, "<f4": torch.float32, "<f8": torch.float64,
    "|b1": torch.bool, "|u1": torch.uint8, "|i1": torch.int8, "<i2": torch.int16, "<i4": torch.int32,
    "<i8": torch.int64, "<c8": torch.complex64, "<c16": torch.complex128,
}


@dataclass(frozen=True)
class ZarrArray:
    """One array's folder and what its ``.zarray`` says of it."""

    folder: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    separator: str

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(math.ceil(size / chunk) for size, chunk in zip(self.shape, self.chunk_shape))

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    def chunk_file(self, index: tuple[int, ...]) -> str:
        return self.separator.join(map(str, index)) if index else "0"

    def chunks(self) -> Iterator[tuple[tuple[int, ...], Chunk]]:
        """Each grid index with the box of the array it holds (an edge chunk's box cut to the shape), in C order."""
        for index in grid_indices(self.grid):
            offsets = tuple(i * c for i, c in zip(index, self.chunk_shape))
            sizes = tuple(min(c, s - o) for c, s, o in zip(self.chunk_shape, self.shape, offsets))
            yield index, Chunk(offsets, sizes)


def grid_indices(grid: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """The indices of a grid in C order, one at a time (itertools.product would first hold every axis's range)."""
    if any(count == 0 for count in grid):
        return
    index = [0] * len(grid)
    while True:
        yield tuple(index)
        for axis in reversed(range(len(grid))):
            index[axis] += 1
            if index[axis] < grid[axis]:
                break
            index[axis] = 0
        else:
            return


def read_array(folder: Path) -> ZarrArray:
    """The array in ``folder``, once its ``.zarray`` is one cogexport reads and its chunk files fit it."""
    path = folder / ARRAY_FILE
    meta = read_checkpoint_json(path)
    if not isinstance(meta, dict) or meta.get("zarr_format") != 2:
        raise CogExportError(f"{path} is not a zarr v2 array description (zarr_format "
                             f"{quoted(meta.get('zarr_format') if isinstance(meta, dict) else meta)}); the checkpoint "
                             "is damaged")
    for field, allowed in (("compressor", (None,)), ("filters", (None, [])), ("order", ("C",)),
                           ("dimension_separator", (None, ".", "/"))):
        if meta.get(field) not in allowed:
            raise CogExportError(f"{path}: {field} {quoted(meta.get(field))}: cogexport reads uncompressed, "
                                 "unfiltered C-order zarr arrays only (as Megatron-Core writes them); load the "
                                 "checkpoint with Megatron-Core and save it again with the torch_dist backend")
    dtype = ZARR_DTYPES.get(meta.get("dtype")) if isinstance(meta.get("dtype"), str) else None
    if dtype is None:
        raise CogExportError(f"{path}: dtype {quoted(meta.get('dtype'))} is not one cogexport reads (it reads "
                             f"{', '.join(ZARR_DTYPES)}); the checkpoint is damaged or not Megatron-Core's")
    shape, chunks = meta.get("shape"), meta.get("chunks")
    if not _counts(shape, 0) or not _counts(chunks, 1) or len(shape) != len(chunks) or any(
            c > s for c, s in zip(chunks, shape) if s):
        raise CogExportError(f"{path}: shape {quoted(shape)} and chunks {quoted(chunks)} do not describe a chunked "
                             "array (a chunk larger than the array on an axis, or lists of other lengths); the "
                             "checkpoint is damaged")
    array = ZarrArray(folder, dtype, tuple(shape), tuple(chunks), meta.get("dimension_separator") or ".")
    check_chunk_files(array)
    return array


def _counts(value: object, least: int) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= least for v in value)


def check_chunk_files(array: ZarrArray) -> None:
    """Every chunk of the grid has its file, of the full chunk's size, and no chunk file lies outside the grid (a
    writer fills exactly the grid: a file more or less means the ``.zarray`` or the folder is not the one saved)."""
    found = _chunk_files(array.folder)
    total = math.prod(array.grid)
    # the grid is walked no further than the files there are: a damaged .zarray may describe billions of chunks
    expected = set(itertools.islice((array.chunk_file(index) for index, _ in array.chunks()), len(found) + 1))
    missing, extra = sorted(expected - set(found)), sorted(set(found) - expected)
    if missing:
        raise CogExportError(f"{array.folder}: the chunk file {missing[0]} is missing (its .zarray describes {total} "
                             f"chunks, the folder holds {len(found)} files); copy the checkpoint folder again")
    if extra:
        raise CogExportError(f"{array.folder / extra[0]} lies outside the array its {ARRAY_FILE} describes (shape "
                             f"{list(array.shape)}, chunks {list(array.chunk_shape)}): the {ARRAY_FILE} is damaged or "
                             "not this folder's; copy the checkpoint folder again")
    for name, size in found.items():
        if size != array.chunk_bytes:
            raise CogExportError(f"{array.folder / name} has {size} bytes, a chunk of {list(array.chunk_shape)} "
                                 f"{array.dtype} has {array.chunk_bytes}: the file or its {ARRAY_FILE} is damaged; "
                                 "copy the checkpoint folder again")


def _chunk_files(folder: Path) -> dict[str, int]:
    """The chunk files below ``folder`` (every file but zarr's own dot files), by name relative to it, with sizes."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if not name.startswith("."):
                path = Path(root) / name
                found[path.relative_to(folder).as_posix()] = path.stat().st_size
    return found


def read_chunk(array: ZarrArray, index: tuple[int, ...], first_row: int = 0, rows: int | None = None) -> torch.Tensor:
    """Rows ``first_row ..`` of one chunk's leading axis (all of them by default), at the full chunk shape."""
    rows = array.chunk_shape[0] - first_row if rows is None else rows
    out = torch.empty((rows, *array.chunk_shape[1:]) if array.chunk_shape else (), dtype=array.dtype)
    per_row = array.chunk_bytes // array.chunk_shape[0] if array.chunk_shape else array.chunk_bytes
    read_bytes(array, index, tensor_buffer(out), first_row * per_row)
    return out


def read_elements(array: ZarrArray, index: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
    """Elements ``start .. stop`` of one chunk file, in its own (full chunk) C order."""
    out = torch.empty(stop - start, dtype=array.dtype)
    read_bytes(array, index, tensor_buffer(out), start * array.dtype.itemsize)
    return out


def read_bytes(array: ZarrArray, index: tuple[int, ...], buffer: memoryview, offset: int) -> None:
    path = str(array.folder / array.chunk_file(index))
    with opened(path) as descriptor:
        pread_exactly(path, descriptor, buffer, offset)
