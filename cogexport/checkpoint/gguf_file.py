"""Read a GGUF model file (ComfyUI-GGUF's layout) as a lazy checkpoint: names, the tensors' own shapes (restored from
``comfy.gguf.orig_shape.<name>`` where the file stores a tensor reshaped), the GGML type of each tensor, and the
values dequantized on load by the ``gguf`` package's dequantizers (llama.cpp's own Python code).

The file is parsed by ``gguf.GGUFReader``; each tensor's bytes are then read with ``pread`` into a fresh buffer, so
reading a tensor never maps more of the file into memory than that tensor.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import gguf
import numpy as np
import torch

from ..errors import CogExportError, quoted
from ..lazy import LazyTensor
from ..tensor_bytes import pread_into
from .base import CheckpointInfo, HeaderFacts, LazyCheckpoint

ORIG_SHAPE_KEY = "comfy.gguf.orig_shape."
_PLAIN = {gguf.GGMLQuantizationType.F32: torch.float32, gguf.GGMLQuantizationType.F16: torch.float16,
          gguf.GGMLQuantizationType.BF16: torch.bfloat16}
GGUF_MAGIC = b"GGUF"


def is_gguf_file(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


class GgufCheckpoint(LazyCheckpoint):
    """One GGUF file as a lazy mapping of names to dequantized tensors (float32, or the stored float type)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._descriptor: int | None = None
        try:
            reader = gguf.GGUFReader(self.path)
        except (ValueError, OSError, KeyError, IndexError, TypeError, OverflowError, struct.error) as error:
            raise CogExportError(f"{self.path} is not a readable GGUF file ({quoted(str(error), 120)}); "
                                 "copy the file again") from None
        self.types: dict[str, str] = {}
        self.stored_shapes: dict[str, tuple[int, ...]] = {}
        self._ranges: dict[str, tuple[int, int]] = {}
        self.info = CheckpointInfo(format="gguf", paths=[str(self.path)], files=[str(self.path)],
                                   weights_source="GGUF tensors, dequantized on load",
                                   facts=HeaderFacts(_scalar_fields(reader)))
        self._descriptor = os.open(self.path, os.O_RDONLY)
        try:
            for tensor in reader.tensors:
                self._add(reader, tensor)
        except BaseException:
            self.close()
            raise
        del reader  # drops the memory map; tensors are read with pread
        self.info.trainable = list(self._tensors)
        self.info.notes.append("tensor types: " + ", ".join(f"{k} {v}" for k, v in self.type_counts().items()))

    def type_counts(self) -> dict[str, int]:
        """How many tensors the file stores in each GGML type (for inspect: what quantization cost)."""
        counts: dict[str, int] = {}
        for kind in self.types.values():
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def _add(self, reader: gguf.GGUFReader, tensor) -> None:
        stored = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        shape = original_shape(reader, tensor.name) or stored
        if int(np.prod(shape)) != int(np.prod(stored)):
            raise CogExportError(f"{self.path}: {ORIG_SHAPE_KEY}{tensor.name} gives {shape}, which does not hold the "
                                 f"{int(np.prod(stored))} values stored")
        kind = gguf.GGMLQuantizationType(tensor.tensor_type)
        self.types[tensor.name] = kind.name
        self.stored_shapes[tensor.name] = stored
        self._ranges[tensor.name] = (tensor.data_offset, int(tensor.n_bytes))
        dtype = _PLAIN.get(kind, torch.float32)
        loader = self._reader(tensor.data_offset, int(tensor.n_bytes), kind, stored, shape, dtype)
        self._tensors[tensor.name] = LazyTensor(torch.Size(shape), dtype, loader,
                                                f"{quoted(tensor.name)} ({kind.name}) in {self.path.name}")

    def _reader(self, offset: int, nbytes: int, kind, stored, shape, dtype):
        def read() -> torch.Tensor:
            raw = np.empty(nbytes, dtype=np.uint8)
            try:
                pread_into(self._descriptor, memoryview(raw), offset)
            except (OSError, EOFError) as error:
                raise CogExportError(f"cannot read {self.path}: {error}") from None
            if kind in _PLAIN:
                return torch.from_numpy(raw).view(dtype).reshape(shape)
            rows = raw.reshape(-1, gguf.quants.quant_shape_to_byte_shape(stored, kind)[-1])
            values = gguf.quants.dequantize(rows, kind)
            return torch.from_numpy(np.ascontiguousarray(values)).reshape(shape)

        return read

    def stored_bytes(self, name: str) -> np.ndarray:
        """The raw bytes the file stores for ``name`` (for byte-exact comparisons)."""
        offset, nbytes = self._ranges[name]
        raw = np.empty(nbytes, dtype=np.uint8)
        pread_into(self._descriptor, memoryview(raw), offset)
        return raw

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


def original_shape(reader: gguf.GGUFReader, name: str) -> tuple[int, ...] | None:
    """The shape ``comfy.gguf.orig_shape.<name>`` records (an array of int32, as ComfyUI-GGUF requires), if any."""
    field = reader.get_field(ORIG_SHAPE_KEY + name)
    if field is None:
        return None
    if field.types != [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]:
        raise CogExportError(f"{ORIG_SHAPE_KEY}{name} is not an array of int32; ComfyUI-GGUF would refuse this file")
    return tuple(int(field.parts[index][0]) for index in field.data)


def _scalar_fields(reader: gguf.GGUFReader) -> dict[str, str]:
    """The file's string and number fields (general.architecture, general.file_type, ...) as text."""
    found = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name.startswith(ORIG_SHAPE_KEY) or len(field.types) != 1:
            continue
        value = field.parts[field.data[-1]]
        found[name] = str(bytes(value), encoding="utf-8") if field.types[0] == gguf.GGUFValueType.STRING \
            else str(value[0])
    return found
