"""Read safetensors files (one file, a sharded folder with its index, or a Diffusers/HF model folder) lazily.

The header is parsed and checked when the file is opened; each tensor is later read with ``pread`` straight
into its result, so memory never holds more than the tensor asked for (no memory map that would grow the
process's resident set to the size of the file).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

from ..errors import CogExportError
from ..lazy import LazyTensor
from ..tensor_bytes import pread_into, tensor_buffer
from ..write.safetensors_file import SAFETENSORS_DTYPES
from .base import CheckpointInfo, LazyCheckpoint

_DTYPES = {code: dtype for dtype, code in SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100_000_000


# The weights from_pretrained reads when no variant is asked for; a folder may hold variants beside them.
_PLAIN_STEMS = ("diffusion_pytorch_model", "model")


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a folder: the ones its index names, else its single *.safetensors file (the plain,
    non-variant weights when the folder also holds variants such as diffusion_pytorch_model.fp16.safetensors)."""
    for stem in _PLAIN_STEMS:
        if (folder / f"{stem}.safetensors.index.json").is_file():
            return _indexed_files(folder / f"{stem}.safetensors.index.json")
        if (folder / f"{stem}.safetensors").is_file():
            return [folder / f"{stem}.safetensors"]
    indexes = sorted(folder.glob("*.safetensors.index*.json"))
    if len(indexes) > 1:
        raise CogExportError(f"{folder} holds several safetensors indexes ({', '.join(p.name for p in indexes)}); "
                             "point at one file")
    if indexes:
        return _indexed_files(indexes[0])
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise CogExportError(f"{folder} holds {len(files)} safetensors files and no index; point at one file")
    return files


def _indexed_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError):
        raise CogExportError(f"{index} is not a valid safetensors index") from None
    return [index.parent / name for name in dict.fromkeys(weight_map.values())]


def component_prefixes(files: list[Path]) -> dict[Path, str]:
    """Separate files of one model's parts (Mochi's VAE: encoder.safetensors and decoder.safetensors, whose key names
    overlap): each file's tensors are named after the file, ``encoder.layers.0.weight``."""
    stems = [file.stem for file in files]
    if len(set(stems)) != len(stems):
        raise CogExportError(f"the safetensors files {', '.join(map(str, files))} share a file name; give each part once "
                             "(its name says which part of the model it holds)")
    return {file: f"{file.stem}." for file in files}


class SafetensorsCheckpoint(LazyCheckpoint):
    """One or more safetensors files as a single lazy mapping: a file, a folder (shards and their index), or several
    files each holding one part of a model (see ``component_prefixes``)."""

    def __init__(self, path: Path | list[Path]) -> None:
        super().__init__()
        parts = [Path(p) for p in path] if isinstance(path, list) else None
        path = parts[0] if parts else Path(path)
        files = parts or (safetensors_files(path) if path.is_dir() else [path])
        prefixes = component_prefixes(parts) if parts else {}
        self.info = CheckpointInfo(format="safetensors", paths=[str(p) for p in parts or [path]],
                                   weights_source="safetensors tensors")
        self._descriptors: dict[Path, int] = {}
        self._read: dict[Path, int] = {}
        try:
            for file in files:
                self._open_file(file, prefixes.get(file, ""))
        except BaseException:
            self.close()
            raise
        self.info.trainable = list(self._tensors)

    def _open_file(self, file: Path, name_prefix: str = "") -> None:
        try:
            descriptor = os.open(file, os.O_RDONLY)
        except OSError as error:
            raise CogExportError(f"cannot read {file}: {error.strerror}") from None
        self._descriptors[file] = descriptor
        self._read[file] = 0
        self.info.files.append(str(file))
        size = os.fstat(descriptor).st_size
        prefix = os.pread(descriptor, 8, 0)
        if len(prefix) < 8:
            raise CogExportError(f"{file} is not a safetensors file (too short)")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > min(_MAX_HEADER, size - 8):
            raise CogExportError(f"{file} is not a safetensors file, or it is truncated")
        try:
            header = json.loads(os.pread(descriptor, header_size, 8))
        except ValueError:
            raise CogExportError(f"{file} has a corrupt safetensors header") from None
        self.info.metadata.update(header.pop("__metadata__", None) or {})
        data_start = 8 + header_size
        for name, entry in header.items():
            name = name_prefix + name
            try:
                dtype = _DTYPES[entry["dtype"]]
                shape = torch.Size(entry["shape"])
                start, stop = entry["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise CogExportError(f"{file}: entry {name!r} is not a valid safetensors tensor") from None
            if stop - start != shape.numel() * dtype.itemsize or data_start + stop > size or start < 0:
                raise CogExportError(f"{file} is truncated or corrupt: tensor {name} lies outside the file")
            if name in self._tensors:
                raise CogExportError(f"tensor {name} appears in two files ({file} and another shard)")
            self._tensors[name] = LazyTensor(shape, dtype, self._reader(file, data_start + start, shape, dtype),
                                             f"{name} in {file.name}")

    def _reader(self, file: Path, offset: int, shape: torch.Size, dtype: torch.dtype):
        def read() -> torch.Tensor:
            out = torch.empty(shape, dtype=dtype)
            try:
                pread_into(self._descriptors[file], tensor_buffer(out), offset)
            except (OSError, EOFError) as error:
                raise CogExportError(f"cannot read {file}: {error}") from None
            self._read[file] += out.nbytes
            return out

        return read

    def bytes_read(self) -> dict[str, int]:
        return {str(path): count for path, count in self._read.items()}

    def close(self) -> None:
        for descriptor in self._descriptors.values():
            os.close(descriptor)
        self._descriptors.clear()
