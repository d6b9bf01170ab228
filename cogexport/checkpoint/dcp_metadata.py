"""Read a DCP checkpoint's ``.metadata`` pickle safely: what each entry is, its chunks, and where their bytes are.

``.metadata`` is a plain pickle of torch.distributed.checkpoint's metadata dataclasses. It is unpickled with an
allowlist of exactly those classes (and the torch types they hold: ``torch.Size``, dtypes, the tensor layout, the
path of the save), each becoming an inert ``PickledObject`` stand-in that only records its state; anything else is
refused before it can run. The stand-ins are then read into the plain records below, every field type-checked, so
a damaged or hand-made file gives one line instead of a wrong model.
"""

from __future__ import annotations

import collections
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import CogExportError, UnsafeCheckpointError
from ..pickled import AllowlistUnpickler, PickledObject, stand_in
from .torch_archive import _ALLOWED

METADATA_FILE = ".metadata"
_DCP = "torch.distributed.checkpoint.metadata"
_OLD_PROPERTIES = "torch.distributed._shard.sharded_tensor.metadata"  # where TensorProperties lived before DCP's own
_STAND_INS = (
    *(f"{_DCP}.{name}" for name in ("Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
                                    "MetadataIndex", "StorageMeta", "TensorProperties", "_MEM_FORMAT_ENCODING")),
    f"{_OLD_PROPERTIES}.TensorProperties", f"{_OLD_PROPERTIES}.MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    # Megatron-Core keeps each rank's save plan in the metadata (``all_local_plans``, to reuse the plan at the next
    # save): inert dataclasses and an enum, recorded and never read
    *(f"torch.distributed.checkpoint.planner.{name}" for name in ("SavePlan", "WriteItem", "WriteItemType",
                                                                  "TensorWriteData")),
    # megatron-core 0.8-0.15 pickle their subclasses of Metadata and SavePlan, which add ``mcore_data``: the global
    # shape each flattened tensor had before its strategy stored it under another (read below)
    *(f"megatron.core.dist_checkpointing.strategies.torch.{name}" for name in ("MCoreMetadata", "MCoreSavePlan")),
    # StorageMeta.checkpoint_id: the folder the save was written to (pathlib moved its classes in Python 3.13)
    *(f"{module}.{name}" for module in ("pathlib", "pathlib._local")
      for name in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")),
)
_LAYOUTS = {"torch.strided": torch.strided, "torch.sparse_coo": torch.sparse_coo}


def _layout(name: str) -> torch.layout:
    if name not in _LAYOUTS:
        raise pickle.UnpicklingError(f"unknown tensor layout {name!r}")
    return _LAYOUTS[name]


_ALLOWED_HERE: dict[str, Any] = {
    **{name: value for name, value in _ALLOWED.items() if isinstance(value, torch.dtype) or name == "torch.Size"},
    "torch.serialization._get_layout": _layout,
    "collections.OrderedDict": collections.OrderedDict,
    **{name: stand_in(name) for name in _STAND_INS},
}


@dataclass(frozen=True)
class Chunk:
    """One saved piece of a tensor: ``global[offsets[0]:offsets[0] + sizes[0], ...]``."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        count = 1
        for size in self.sizes:
            count *= size
        return count


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    size: torch.Size
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True)
class BytesEntry:
    """A non-tensor value (a number, a list, a BytesIO, ...): a pickle we never load."""


@dataclass(frozen=True)
class StorageLocation:
    file: str  # relative to the checkpoint folder, e.g. __1_0.distcp
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass
class DcpMetadata:
    entries: dict[str, TensorEntry | BytesEntry]
    paths: dict[str, tuple]  # flat key -> its path in the saved nested dict (planner_data)
    storage: dict[tuple[str, tuple[int, ...] | None], StorageLocation]  # (flat key, chunk offsets) -> bytes
    version: str | None
    # flat key -> the global shape its writer recorded it had before storing it under another (megatron-core's
    # ``mcore_data[key]["nd_reformulated_orig_global_shape"]``); what the stored shape means is the writer's reader's
    reformulated: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def path_of(self, key: str) -> tuple:
        return tuple(self.paths.get(key) or (key,))


def read_metadata(folder: Path) -> DcpMetadata:
    """The checkpoint's metadata, from ``folder/.metadata``; nothing of the file's choosing runs."""
    path = Path(folder) / METADATA_FILE
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CogExportError(f"cannot read {path}: {error.strerror}") from None
    try:
        root = AllowlistUnpickler(data, _ALLOWED_HERE, lambda qualified: UnsafeCheckpointError(
            f"refused to load {path}: it pickles '{qualified}', which would run code when loaded; a DCP .metadata "
            "holds only checkpoint metadata (if this save is not yours, do not load it with torch either)")).load()
    except CogExportError:
        raise
    except Exception as error:  # a damaged pickle fails in many ways; all mean the same to the user
        raise CogExportError(f"{path} is corrupt: it does not unpickle ({error}); copy the checkpoint again") from None
    try:
        return _records(root)
    except (_Malformed, TypeError, ValueError, AttributeError) as error:
        raise CogExportError(f"{path} is corrupt: {error}; copy the checkpoint again") from None


class _Malformed(Exception):
    pass


def _state(obj: Any, *classes: str) -> dict:
    if not isinstance(obj, PickledObject) or obj.type_name.rsplit(".", 1)[-1] not in classes:
        raise _Malformed(f"expected {' or '.join(classes)}, found {getattr(obj, 'type_name', type(obj).__name__)}")
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], (dict, type(None))):
        state = {**(state[0] or {}), **(state[1] or {})}
    if not isinstance(state, dict):
        raise _Malformed(f"{obj.type_name} has no fields")
    return state


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (torch.Size, tuple, list)) or not all(type(v) is int and v >= 0 for v in value):
        raise _Malformed(f"{what} is not a list of sizes")
    return tuple(value)


def _dtype(properties: Any) -> torch.dtype:
    obj = properties
    state = obj.state if isinstance(obj, PickledObject) else None
    if not isinstance(obj, PickledObject) or not obj.type_name.endswith("TensorProperties"):
        raise _Malformed("tensor properties missing")
    dtype = state[0] if isinstance(state, tuple) and state else _state(obj, "TensorProperties").get("dtype")
    if not isinstance(dtype, torch.dtype):
        raise _Malformed("a tensor entry has no dtype")
    return dtype


def _records(root: Any) -> DcpMetadata:
    fields = _state(root, "Metadata", "MCoreMetadata")
    entries: dict[str, TensorEntry | BytesEntry] = {}
    for key, value in (fields.get("state_dict_metadata") or {}).items():
        if not isinstance(key, str):
            raise _Malformed("an entry name is not a string")
        if isinstance(value, PickledObject) and value.type_name.endswith("BytesStorageMetadata"):
            entries[key] = BytesEntry()
            continue
        tensor = _state(value, "TensorStorageMetadata")
        size = torch.Size(_ints(tensor.get("size"), f"the size of {key}"))
        chunks = []
        for chunk in tensor.get("chunks") or []:
            box = _state(chunk, "ChunkStorageMetadata")
            chunks.append(Chunk(_ints(box.get("offsets"), f"a chunk offset of {key}"),
                                _ints(box.get("sizes"), f"a chunk size of {key}")))
        entries[key] = TensorEntry(_dtype(tensor.get("properties")), size, tuple(chunks))
    storage = {}
    for index, where in (fields.get("storage_data") or {}).items():
        index_fields, info = _state(index, "MetadataIndex"), _state(where, "_StorageInfo")
        fqn, offset = index_fields.get("fqn"), index_fields.get("offset")
        file, start, length = info.get("relative_path"), info.get("offset"), info.get("length")
        if not isinstance(fqn, str) or not isinstance(file, str) or type(start) is not int or type(length) is not int \
                or start < 0 or length < 0:
            raise _Malformed(f"the storage record of {fqn!r} is not valid")
        transforms = tuple(str(t) for t in info.get("transform_descriptors") or ())
        storage[(fqn, None if offset is None else _ints(offset, f"the storage offset of {fqn}"))] = \
            StorageLocation(file, start, length, transforms)
    paths = {key: tuple(path) for key, path in (fields.get("planner_data") or {}).items()
             if isinstance(key, str) and isinstance(path, (tuple, list))}
    _check_paths(entries, paths)
    version = fields.get("version")
    return DcpMetadata(entries, paths, storage, version if isinstance(version, str) else None,
                       _reformulated(fields.get("mcore_data"), entries))


def _reformulated(mcore_data: Any, entries: dict) -> dict[str, tuple[int, ...]]:
    """The original global shape of each tensor megatron-core recorded one for (the others' records are empty)."""
    if mcore_data is None:
        return {}
    if not isinstance(mcore_data, dict):
        raise _Malformed("mcore_data is not a mapping")
    shapes = {}
    for key, record in mcore_data.items():
        if not isinstance(key, str) or not isinstance(record, dict):
            raise _Malformed(f"the mcore_data record of {key!r} is not a mapping")
        shape = record.get("nd_reformulated_orig_global_shape")
        if shape is None:
            continue
        if not isinstance(entries.get(key), TensorEntry):
            raise _Malformed(f"mcore_data records a shape for {key!r}, which is no tensor entry")
        shapes[key] = _ints(shape, f"the original shape of {key}")
    return shapes


def _check_paths(entries: dict, paths: dict[str, tuple]) -> None:
    """DCP flattens the saved state dict by joining each value's path with dots, and keeps every path in
    ``planner_data``: a name and its path that disagree, or an entry without a path, mean a damaged name (which would
    otherwise put a tensor under another name, or out of the model)."""
    for key, path in paths.items():
        joined = ".".join(str(part) for part in path)
        if joined != key:
            raise _Malformed(f"the entry {key!r} is filed under the path {joined!r}")
    if paths:
        unplaced = [key for key in entries if key not in paths]
        if unplaced:
            raise _Malformed(f"the entry {unplaced[0]!r} has no path in the saved state dict")
