"""Read safetensors files (one file, a sharded folder with its index, or a Diffusers/HF model folder) lazily.

The header is parsed and checked when the file is opened; each tensor is later read with ``pread`` straight
into its result, so memory never holds more than the tensor asked for (no memory map that would grow the
process's resident set to the size of the file).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path

import torch

from ..errors import CogExportError, quoted
from ..lazy import ByteRange, LazyTensor
from ..safetensors_dtypes import SAFETENSORS_DTYPES
from ..tensor_bytes import pread_into, tensor_buffer
from .base import CheckpointInfo, HeaderFacts, LazyCheckpoint
from .training_state import is_training_state, named_training_state

_DTYPES = {code: dtype for dtype, code in SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100_000_000


# The weights from_pretrained reads when no variant is asked for; a folder may hold variants beside them.
PLAIN_STEMS = ("diffusion_pytorch_model", "model")
# PyTorch's Hugging Face storage writer (hf_storage.py): one rank's file of a distributed save, and the header entry
# placing each of its pieces in the whole tensor.
RANK_FILE = re.compile(r"^shard-(\d+)-model-(\d+)-of-(\d+)\.safetensors$")
SHARDING_INFO = "DCP_SHARDING_INFO"


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a folder: a Diffusers model folder's by from_pretrained's names (model_folder.py), else the
    ones its index names, else its single *.safetensors file (the plain, non-variant weights when the folder also
    holds variants such as model.fp16.safetensors)."""
    from .model_folder import model_folder_weights  # it reads indexes with this module's indexed_files

    model = model_folder_weights(folder, sorted(folder.iterdir()), lambda name: False)
    if model is not None and model.kind == "safetensors":
        return [path for path in model.chosen if path.suffix != ".json"]
    if model is not None:
        raise model.refusal()
    for stem in PLAIN_STEMS:
        if (folder / f"{stem}.safetensors.index.json").is_file():
            return indexed_files(folder / f"{stem}.safetensors.index.json")
        if (folder / f"{stem}.safetensors").is_file():
            return [folder / f"{stem}.safetensors"]
    indexes = sorted(folder.glob("*.safetensors.index*.json"))
    if len(indexes) > 1:
        raise CogExportError(f"{folder} holds several safetensors indexes ({', '.join(p.name for p in indexes)}); "
                             "point at one file")
    if indexes:
        return indexed_files(indexes[0])
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise CogExportError(f"{folder} holds {len(files)} safetensors files and no index; point at one file")
    return files


def indexed_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = list(dict.fromkeys(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise CogExportError(f"{index} is not a valid safetensors index") from None
    for name in names:  # file names beside the index, never paths elsewhere
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise CogExportError(f"{index} names {quoted(name)} as a weight file, which is not a file name beside it")
    return [index.parent / name for name in names]


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
        self.header = HeaderFacts()  # every file's __metadata__, merged
        self.info = CheckpointInfo(format="safetensors", paths=[str(p) for p in parts or [path]], facts=self.header,
                                   weights_source="safetensors tensors")
        self._descriptors: dict[Path, int] = {}
        self._read: dict[Path, int] = {}
        try:
            for file in files:
                self._open_file(file, prefixes.get(file, ""))
            self._leave_out_training_state()
        except BaseException:
            self.close()
            raise
        self.info.trainable = list(self._tensors)

    def _leave_out_training_state(self) -> None:
        """Tensors a trainer saved beside the weights (training_state.py: ``optimizer.state.<name>.exp_avg``, a
        ``step``) are never weights: left out and named in a note; a file of nothing else holds no weights."""
        left_out = [name for name in self._tensors if is_training_state(name)]
        if not left_out:
            return
        if len(left_out) == len(self._tensors):
            raise CogExportError(f"{', '.join(self.info.files)} holds training state only "
                                 f"({named_training_state(left_out)}): optimizer, scheduler and trainer state are "
                                 "never model weights; point at the model's weights")
        for name in left_out:
            del self._tensors[name]
        self.info.notes.append(f"left out {len(left_out)} tensor{'s' * (len(left_out) != 1)} of training state, never model weights: "
                               f"{named_training_state(left_out)}")

    def _open_file(self, file: Path, name_prefix: str = "") -> None:
        try:
            descriptor = os.open(file, os.O_RDONLY)
        except OSError as error:
            raise CogExportError(f"cannot read {file}: {error.strerror}") from None
        self._descriptors[file] = descriptor
        self._read[file] = 0
        self.info.files.append(str(file))
        entries, metadata = read_header(file, descriptor)
        refuse_distributed_piece(file, metadata)
        self.header.metadata.update(metadata)
        for name, (dtype, shape, offset) in entries.items():
            name = name_prefix + name
            if name in self._tensors:
                raise CogExportError(f"tensor {quoted(name)} appears in two files ({file} and another shard)")
            self._tensors[name] = LazyTensor(shape, dtype, self._reader(file, offset, shape, dtype),
                                             f"{quoted(name)} in {file.name}",
                                             (ByteRange(str(file), offset, shape.numel() * dtype.itemsize),))

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


def refuse_distributed_piece(file: Path, metadata: dict[str, str]) -> None:
    """One rank's file of a distributed save holds that rank's pieces under the tensors' full names: read alone it
    would pass for a model of partial tensors. Known by its name (shard-R-model-K-of-N) or by pieces placed away
    from the start of their tensors (the writer's rank-0 mode records all-zero offsets for whole tensors)."""
    named = RANK_FILE.match(file.name)
    if named:
        raise CogExportError(f"{file} is rank {int(named.group(1))}'s file of a distributed save (PyTorch's Hugging "
                             "Face writer, save_distributed): it holds that rank's pieces of the tensors, not a "
                             f"model; point at its folder {file.parent} to read the whole save")
    try:
        placed = json.loads(metadata.get(SHARDING_INFO) or "{}")
        elsewhere = any(any(entry.get("saved_offsets") or ()) for entry in placed.values())
    except (ValueError, AttributeError, TypeError):
        return  # not the writer's entry: the header's own shapes are all there is
    if elsewhere:
        raise CogExportError(f"{file} holds pieces of tensors saved by several ranks ({SHARDING_INFO} places them "
                             "away from the start of their tensors), not a model; point at the folder of the whole "
                             "save")


def read_header(file: Path, descriptor: int) -> tuple[dict[str, tuple[torch.dtype, torch.Size, int]], dict[str, str]]:
    """A safetensors file's tensors (dtype, shape, absolute byte offset) and ``__metadata__``, checked as strictly
    as the safetensors library checks them: a JSON object of known dtypes and integer shapes and offsets whose
    byte ranges match the shapes and tile the data exactly (no overlap, no gap, nothing past the end)."""
    header, data_start, data_size = _header_object(file, descriptor)
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _corrupt(file, "__metadata__ is not an object of strings")
    entries, ranges = {}, []
    for name, entry in header.items():
        dtype, shape, offsets = _checked_entry(file, name, entry)
        entries[name] = (dtype, torch.Size(shape), data_start + offsets[0])
        ranges.append((offsets[0], offsets[1], name))
    _check_tiling(file, ranges, data_start, data_size)
    return entries, metadata


def _corrupt(file: Path, what: str) -> CogExportError:
    return CogExportError(f"{file} has a corrupt safetensors header: {what}; copy the file again")


def _header_object(file: Path, descriptor: int) -> tuple[dict, int, int]:
    """The header's JSON object, where the data starts and how many bytes of data the file holds."""
    size = os.fstat(descriptor).st_size
    prefix = os.pread(descriptor, 8, 0)
    if len(prefix) < 8:
        raise CogExportError(f"{file} is not a safetensors file (too short)")
    (header_size,) = struct.unpack("<Q", prefix)
    if header_size > min(_MAX_HEADER, size - 8):
        raise CogExportError(f"{file} is not a safetensors file, or it is truncated")
    try:
        header = json.loads(os.pread(descriptor, header_size, 8).decode("utf-8"),
                            object_pairs_hook=_unique_keys, parse_constant=_no_constants)
    except (ValueError, RecursionError) as error:
        raise _corrupt(file, f"not valid JSON ({quoted(str(error), 100)})") from None
    if not isinstance(header, dict):
        kind = {type(None): "null", list: "an array", str: "a string", bool: "a boolean"}.get(type(header), "a number")
        raise _corrupt(file, f"JSON {kind}, not an object")
    return header, 8 + header_size, size - 8 - header_size


def _checked_entry(file: Path, name: str, entry: object) -> tuple[torch.dtype, list[int], list[int]]:
    """One tensor's dtype, shape and data offsets, each of the right kind, the offsets spanning what the shape needs."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise _corrupt(file, f"entry {quoted(name)} is not a tensor (dtype, shape, data_offsets)")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise _corrupt(file, f"tensor {quoted(name)} has dtype {quoted(dtype)}, which cogexport does not read")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _corrupt(file, f"tensor {quoted(name)} has shape {quoted(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise _corrupt(file, f"tensor {quoted(name)} has data_offsets {quoted(offsets)}")
    dtype, needed = _DTYPES[dtype], math.prod(shape) * _DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != needed or any(d >= 2**62 for d in shape):
        raise _corrupt(file, f"tensor {quoted(name)} spans {offsets[1] - offsets[0]} bytes but its shape "
                             f"{quoted(shape)} and dtype need {needed}")
    return dtype, shape, offsets


def _check_tiling(file: Path, ranges: list[tuple[int, int, str]], data_start: int, data_size: int) -> None:
    """The tensors' byte ranges cover the data exactly: no overlap, no gap, nothing past the end of the file."""
    position = 0
    for start, stop, name in sorted(ranges):
        if start != position:
            what = "overlaps the tensor before it" if start < position else f"leaves a gap of {start - position} bytes"
            raise _corrupt(file, f"tensor {quoted(name)} {what}")
        position = stop
    # Said in bytes of the file (the header's offsets count from the end of the header, which users never see).
    needed, size = data_start + position, data_start + data_size
    if needed > size:
        raise CogExportError(f"{file} is truncated: its header places tensors up to byte {needed:,}, but the file has "
                             f"{size:,} bytes ({needed - size:,} missing); copy the file again")
    if needed < size:
        raise CogExportError(f"{file} is corrupt: {size - needed:,} bytes after the last tensor (its header places "
                             f"tensors up to byte {needed:,} of the {size:,}-byte file); copy the file again")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"key {quoted(next(k for k in keys if keys.count(k) > 1))} appears twice")
    return dict(pairs)


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
