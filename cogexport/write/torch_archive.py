"""Write a ``torch.save`` file one tensor at a time: the same zip archive torch writes (``data.pkl`` naming each
storage by a persistent id, then one stored, 64-byte-aligned record per storage), so ``torch.load`` (and
``mmap=True``) reads it, while memory holds one tensor, never the whole object."""

from __future__ import annotations

import collections
import hashlib
import pickle
import struct
import threading
import zipfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ..crc32 import crc32
from ..lazy import LazyTensor
from ..tensor_bytes import tensor_buffer
from .byte_copy import stream_range
from .io_engine import Payload, TensorFeed

_ALIGNMENT = 64
_DATE = (1980, 1, 1, 0, 0, 0)  # every record's: the output depends on its content only
_ZIP64_EXTRA = 20  # what zipfile adds to a local header whose record is over 4 GiB
_STORAGE_CLASSES = {torch.float32: "FloatStorage", torch.bfloat16: "BFloat16Storage", torch.float16: "HalfStorage",
                    torch.float64: "DoubleStorage", torch.int64: "LongStorage", torch.int32: "IntStorage",
                    torch.int16: "ShortStorage", torch.int8: "CharStorage", torch.uint8: "ByteStorage",
                    torch.bool: "BoolStorage"}


class _Global:
    """A module-level name written into the pickle as it is (``torch FloatStorage``): nothing is imported."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class _StoredTensor:
    """Where a lazy tensor goes: its record key, and how torch rebuilds it from that storage."""

    def __init__(self, key: str, tensor: LazyTensor) -> None:
        self.key, self.tensor = key, tensor


class _ArchivePickler(pickle._Pickler):  # the Python pickler, whose save() can be extended
    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if isinstance(obj, _Global):
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
            return
        if isinstance(obj, _StoredTensor):
            shape = tuple(obj.tensor.shape)
            stride = _contiguous_strides(shape)
            storage = ("storage", _Global("torch", _STORAGE_CLASSES[obj.tensor.dtype]), obj.key, "cpu",
                       obj.tensor.numel)
            self.save(_Global("torch._utils", "_rebuild_tensor_v2"))
            self.save((_PersistentId(storage), 0, shape, stride, False, collections.OrderedDict()))
            self.write(pickle.REDUCE)
            return
        if isinstance(obj, _PersistentId):
            self.save(obj.value)
            self.write(pickle.BINPERSID)
            return
        super().save(obj, save_persistent_id)


class _PersistentId:
    def __init__(self, value: tuple) -> None:
        self.value = value


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _stored(tree: Any, records: list[_StoredTensor]) -> Any:
    """The object tree with every LazyTensor replaced by its record reference (records listed in order)."""
    if isinstance(tree, LazyTensor):
        records.append(_StoredTensor(str(len(records)), tree))
        return records[-1]
    if isinstance(tree, dict):
        return type(tree)((key, _stored(value, records)) for key, value in tree.items())
    if isinstance(tree, (list, tuple)):
        return type(tree)(_stored(value, records) for value in tree)
    return tree


def write_torch_archive(path: Path, tree: Any, on_tensor: Callable[[str, int], None] | None = None,
                        payloads: Iterator[Payload] | None = None) -> None:
    """torch.save ``tree`` (plain containers and values, LazyTensor leaves) to ``path``, loading one tensor at a time.
    ``payloads``: the leaves' data in order (``lazy_leaves``), from a ``TensorFeed`` that may load them ahead."""
    records: list[_StoredTensor] = []
    stored = _stored(tree, records)
    pickled = _pickle(stored)
    root = path.stem
    with ExitStack() as stack:
        if payloads is None:
            payloads = iter(stack.enter_context(TensorFeed([record.tensor for record in records])))
        stack.enter_context(_records_summed_by_isal())
        archive = stack.enter_context(zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True))
        _write_small(archive, f"{root}/data.pkl", pickled)
        _write_small(archive, f"{root}/.format_version", b"1")
        _write_small(archive, f"{root}/.storage_alignment", str(_ALIGNMENT).encode())
        _write_small(archive, f"{root}/byteorder", b"little")
        for record in records:
            _write_record(archive, f"{root}/data/{record.key}", record.tensor, next(payloads), on_tensor)
        _write_small(archive, f"{root}/version", b"3\n")
        _write_small(archive, f"{root}/.data/serialization_id", _serialization_id(path.name, pickled))


class _IsalRecordSums:
    """zipfile computes each record's CRC-32 as it is written with the function its module holds as ``crc32``
    (zlib's); while an archive is written here it holds ISA-L's, which gives the same values 3.5x as fast (1.2 s of a
    6.6 GB universal checkpoint). Archives written at once in several threads share one swap: the first to start puts
    ISA-L's in, the last to finish puts zlib's back (each putting back what it found would leave ISA-L's in place
    when two overlap). A thread that meets either function computes the same CRC-32."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writing = 0  # archives being written with ISA-L's function in place
        self._found: Callable[..., int] | None = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._writing == 0:
                self._found, zipfile.crc32 = zipfile.crc32, crc32
            self._writing += 1
        try:
            yield
        finally:
            with self._lock:
                self._writing -= 1
                if self._writing == 0:
                    zipfile.crc32 = self._found


_records_summed_by_isal = _IsalRecordSums()


def lazy_leaves(tree: Any) -> list[LazyTensor]:
    """The LazyTensors of ``tree`` in the order ``write_torch_archive`` writes their records."""
    records: list[_StoredTensor] = []
    _stored(tree, records)
    return [record.tensor for record in records]


def leaf_names(tree: Any, prefix: str = "") -> list[str]:
    """The names of ``lazy_leaves(tree)``, in the same order: their keys (and list positions) joined with dots."""
    if isinstance(tree, LazyTensor):
        return [prefix]
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    return [name for key, value in items for name in leaf_names(value, f"{prefix}.{key}" if prefix else str(key))]


def _serialization_id(name: str, pickled: bytes) -> bytes:
    """torch.save's id of a save (40 decimal digits), here made from what is saved rather than drawn at random, so
    that a file is the same bytes whenever, and by whichever process or torchrun rank, it is written."""
    digest = int(hashlib.sha256(name.encode() + b"\0" + pickled).hexdigest(), 16)
    return str(digest % 10**40).zfill(40).encode()


def _write_small(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    """A small record, dated like the tensor records (a fixed date, as torch.save's own; not the time of writing)."""
    info = zipfile.ZipInfo(name, date_time=_DATE)
    info.compress_type = zipfile.ZIP_STORED
    archive.writestr(info, data)


def _pickle(tree: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    _ArchivePickler(buffer, protocol=2).dump(tree)
    return buffer.getvalue()


def _write_record(archive: zipfile.ZipFile, name: str, tensor: LazyTensor, payload: Payload,
                  on_tensor: Callable[[str, int], None] | None) -> None:
    info = zipfile.ZipInfo(name, date_time=_DATE)
    info.compress_type, info.file_size = zipfile.ZIP_STORED, tensor.nbytes
    data_start = archive.fp.tell() + 30 + len(name.encode()) + 4 \
        + (_ZIP64_EXTRA if tensor.nbytes > zipfile.ZIP64_LIMIT else 0)
    padding = -data_start % _ALIGNMENT
    info.extra = struct.pack("<HH", 0x4246, padding) + b"Z" * padding  # "FB": the id torch's own padding uses
    with archive.open(info, "w", force_zip64=tensor.nbytes > zipfile.ZIP64_LIMIT) as out:
        if isinstance(payload, tuple):  # the record's CRC-32 is computed from the bytes: they pass through here
            for part in payload:
                stream_range(part, out.write)
        else:
            out.write(tensor_buffer(payload.contiguous()))
    if on_tensor is not None:
        on_tensor(name, tensor.nbytes)
