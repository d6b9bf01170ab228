"""One Megatron-Core iteration saved with the ``zarr`` backend, read through the same calls as a torch_dist
iteration's ``DcpFiles`` (megatron.py and megatron_masters.py use either).

The layout, from megatron-core's ``dist_checkpointing/strategies/zarr.py`` (0.8 to 0.15; 0.16 dropped it) and
``strategies/common.py`` (docs: checkpoint-formats.md, "Megatron-Core runs"):

  ITER/metadata.json          {"sharded_backend": "zarr", "sharded_backend_version": 1, "common_backend": "torch", ...}
  ITER/common.pt              the common state (torch.save of the run's arguments, iteration, ...): never read
  ITER/<key>/.zarray          one zarr v2 array per sharded tensor (the model's, the optimizer's states and fp32
                              masters), in its global shape, named by the tensor's key; its chunks are the shards:
                              the global shape divided by the tensor's fragmentation on each axis, so each rank's
                              piece is one chunk file (``1.0.0``: layer 1 of a stacked key, TP piece 0); no
                              compressor, no filters, every chunk written, bf16 spelled ``bfloat16``
  ITER/<key>/shard_<offsets>_<grid>.pt   a ShardedObject's pieces (``rng_state``, each layer's ``_extra_state``):
                              pickles, never read
  ITER/<key>.sync/            zarr's process locks for pieces of flattened tensors (the distributed optimizer's):
                              no data

The keys are the torch_dist save's keys; each is placed by megatron.py's rules alike. No file records which rank
wrote what, and zarr stores no checksum: the chunk files are checked against each ``.zarray`` (zarr_arrays.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CogExportError
from ..lazy import LazyTensor
from .dcp_metadata import BytesEntry, Chunk, TensorEntry
from .zarr_arrays import ARRAY_FILE, ZarrArray, check_chunk_files, read_array, read_chunk, read_elements

SHARDED_OBJECT = re.compile(r"^shard_[\d.]+_[\d.]+\.pt$")  # shard_<offsets>_<grid>.pt, each joined with "."
LOCKS = ".sync"


@dataclass
class ZarrIndex:
    """The iteration's keys, as a torch_dist save's ``.metadata`` lists them: tensors with their chunks, and the
    sharded objects (pickles, never read)."""

    entries: dict[str, TensorEntry | BytesEntry]


def box(chunk: Chunk) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))


def inside(chunk: Chunk) -> tuple[slice, ...]:
    """The part of a stored chunk that lies inside the array (all of it but at the array's edge)."""
    return tuple(slice(0, s) for s in chunk.sizes)


def read_megatron_array(folder: Path) -> ZarrArray:
    """The array in ``folder``, once its chunks cut it evenly, as Megatron-Core cuts every array (its chunks are the
    global shape divided by the tensor's fragmentation): a shape that is not a multiple of its chunks is a damaged
    ``.zarray`` (an edge chunk would be cut to it, and the tensor read at a wrong shape)."""
    array = read_array(folder)
    if any(size % chunk for size, chunk in zip(array.shape, array.chunk_shape)):
        raise CogExportError(f"{folder / ARRAY_FILE}: shape {list(array.shape)} is not a multiple of its chunks "
                             f"{list(array.chunk_shape)}, which Megatron-Core never writes (each rank's piece is one "
                             "whole chunk): the .zarray is damaged; copy the iteration folder again")
    return array


def check_sharded_object(folder: Path) -> None:
    """A key folder without a .zarray holds a sharded object's pieces, shard_*.pt, and nothing else."""
    names = sorted(p.name for p in folder.iterdir())
    other = [name for name in names if not SHARDED_OBJECT.match(name)]
    if not names or other:
        found = f"holds {other[0]}" if other else "is empty"
        raise CogExportError(f"{folder} is neither a zarr array (no {ARRAY_FILE}) nor a Megatron-Core sharded object "
                             f"(only shard_*.pt files): it {found}; the iteration folder is damaged, or a tensor's "
                             f"{ARRAY_FILE} was lost; copy it again")


class ZarrFiles:
    """A zarr-backend iteration folder: its arrays, checked against their chunk files, and reads of tensors from
    them."""

    world_size = None  # nothing in a zarr save says how many ranks wrote it

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.arrays: dict[str, ZarrArray] = {}
        entries: dict[str, TensorEntry | BytesEntry] = {}
        for path in sorted(p for p in self.folder.iterdir() if p.is_dir() and not p.name.endswith(LOCKS)):
            if (path / ARRAY_FILE).is_file():
                array = self.arrays[path.name] = read_megatron_array(path)
                entries[path.name] = TensorEntry(array.dtype, torch.Size(array.shape),
                                                 tuple(chunk for _, chunk in array.chunks()))
            else:
                check_sharded_object(path)
                entries[path.name] = BytesEntry()
        if not self.arrays:
            raise CogExportError(f"{self.folder}: its metadata.json names the zarr backend, but it holds no zarr array "
                                 f"(no <key>/{ARRAY_FILE}): the metadata.json is not this folder's, or the arrays were "
                                 "not copied; copy the iteration folder again")
        self.metadata = ZarrIndex(entries)
        self.bytes_read: dict[str, int] = {}

    @property
    def files(self) -> list[str]:
        return [str(array.folder / name) for array in self.arrays.values()
                for name in (ARRAY_FILE, *(array.chunk_file(index) for index, _ in array.chunks()))]

    def check_chunks(self, key: str, entry: TensorEntry) -> tuple[Chunk, ...]:
        return entry.chunks  # checked against the files when the folder was opened

    def check_all(self) -> list[str]:
        """Each array's chunk files against its .zarray again (for ``inspect``: zarr keeps no checksum)."""
        problems = []
        for array in self.arrays.values():
            try:
                check_chunk_files(array)
            except CogExportError as error:
                problems.append(str(error))
        return problems

    def _index(self, array: ZarrArray, chunk: Chunk) -> tuple[int, ...]:
        return tuple(o // c for o, c in zip(chunk.offsets, array.chunk_shape))

    def _count(self, array: ZarrArray, index: tuple[int, ...], count: int) -> None:
        name = f"{array.folder.name}/{array.chunk_file(index)}"
        self.bytes_read[name] = self.bytes_read.get(name, 0) + count

    def lazy(self, key: str, entry: TensorEntry, origin: str) -> LazyTensor:
        return LazyTensor(entry.size, entry.dtype, lambda: self.assemble(key), origin)

    def assemble(self, key: str) -> torch.Tensor:
        array = self.arrays[key]
        out = torch.empty(array.shape, dtype=array.dtype)
        for index, chunk in array.chunks():
            out[box(chunk)].copy_(read_chunk(array, index)[inside(chunk)])
            self._count(array, index, array.chunk_bytes)
        return out

    def lazy_row(self, key: str, entry: TensorEntry, row: int, origin: str) -> LazyTensor:
        """Row ``row`` of the leading axis alone (a stacked key's one layer), read from the chunk files holding it."""
        return LazyTensor(entry.size[1:], entry.dtype, lambda: self.assemble_row(key, row), origin)

    def assemble_row(self, key: str, row: int) -> torch.Tensor:
        array = self.arrays[key]
        out = torch.empty(array.shape[1:], dtype=array.dtype)
        for index, chunk in array.chunks():
            if chunk.offsets[0] <= row < chunk.offsets[0] + chunk.sizes[0]:
                out[box(chunk)[1:]].copy_(read_chunk(array, index, row - chunk.offsets[0], 1)[0][inside(chunk)[1:]])
                self._count(array, index, array.chunk_bytes // array.chunk_shape[0])
        return out

    def read_elements(self, key: str, entry: TensorEntry, chunk: Chunk, start: int, stop: int) -> torch.Tensor:
        """Elements ``start .. stop`` of one chunk's box, flattened in C order (compared only, never written)."""
        array = self.arrays[key]
        index = self._index(array, chunk)
        if chunk.sizes == array.chunk_shape:  # the box is the whole stored chunk: read just those elements
            return read_elements(array, index, start, stop)
        return read_chunk(array, index)[inside(chunk)].reshape(-1)[start:stop]
