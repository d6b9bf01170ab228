"""Open ``torch.save`` files safely and lazily.

A torch.save file is a zip archive: ``data.pkl`` describes the object tree and each tensor storage sits
uncompressed in its own member. We unpickle ``data.pkl`` with an unpickler that resolves only an explicit
allowlist of names (tensor rebuilders, dtypes, plain containers) and turns the classes DeepSpeed and numpy
pickle into inert stand-ins, so no pickled callable of the file's choosing ever runs. Tensors come back as
``StoredTensor`` references (dtype, shape, where the bytes are); data is read only when asked, straight
from the file into the result, a slice at a time if that is all that is needed.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CogExportError, UnsafeCheckpointError, quoted
from ..lazy import ByteRange, ByteRanges, SizedTensor
from ..pickled import AllowlistUnpickler, stand_in
from ..tensor_bytes import tensor_buffer
from .byte_window import ByteWindow
from .zip_records import ZipRecords

# torch.save's legacy (non-zip) format starts with a pickled magic number.
_LEGACY_MAGIC_PREFIX = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."


# Classes that training checkpoints legitimately pickle. DeepSpeed adds classes between versions, so any
# name under its package is accepted as an inert stand-in; stand-ins only hold data, so this runs nothing.
_STAND_IN_NAMES = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    "numpy.ndarray",
    "numpy.dtype",
    "argparse.Namespace",
)
_STAND_IN_PREFIXES = ("deepspeed.",)


@dataclass(frozen=True)
class _StorageType:
    dtype: torch.dtype


@dataclass(frozen=True)
class _StorageRef:
    archive: "TorchArchive"
    key: str
    dtype: torch.dtype
    numel: int


class _TensorType:
    """What ``torch.Tensor`` / ``Parameter`` resolve to: a marker, never a constructor."""


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    # Protocol-2 pickles store bytes as _codecs.encode(str, "latin1"); nothing else is allowed through.
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError("_codecs.encode is only allowed for latin1 byte strings")
    return text.encode("latin1")


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


def _rebuild_from_type(func: Any, _new_type: Any, args: tuple, _state: Any) -> Any:
    # Tensors with Python attributes (DeepSpeed's ds_id) come through here; the attributes are dropped.
    return func(*args)


def _rebuild_tensor(storage: Any, storage_offset: int, size: Any, stride: Any, *_: Any) -> "StoredTensor":
    if not isinstance(storage, _StorageRef):
        raise pickle.UnpicklingError("tensor without a storage")
    tensor = StoredTensor(storage.archive, storage.key, storage.dtype, int(storage_offset),
                          torch.Size(size), tuple(int(s) for s in stride))
    tensor.check_bounds(storage.numel)
    return tensor


def _allowed_globals() -> dict[str, Any]:
    table: dict[str, Any] = {
        "collections.OrderedDict": collections.OrderedDict,
        "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
        "torch._utils._rebuild_tensor": _rebuild_tensor,
        "torch._utils._rebuild_parameter": _rebuild_parameter,
        "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
        "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
        "torch.Tensor": _TensorType,
        "torch.nn.parameter.Parameter": _TensorType,
        "torch.Size": torch.Size,
        "torch.device": torch.device,
        "torch.storage.UntypedStorage": _StorageType(torch.uint8),
        "_codecs.encode": _latin1_encode,
        "builtins.set": set,
        "builtins.frozenset": frozenset,
        "builtins.complex": complex,
        "builtins.bytearray": bytearray,
        "builtins.slice": slice,
        "deepspeed.runtime.zero.config.ZeroStageEnum": int,
    }
    for name in dir(torch):
        if isinstance(getattr(torch, name), torch.dtype):
            table[f"torch.{name}"] = getattr(torch, name)
    for dtype, storage_name in torch.storage._dtype_to_storage_type_map().items():
        table[f"torch.{storage_name}"] = _StorageType(dtype)
    for name in _STAND_IN_NAMES:
        table[name] = stand_in(name)
    return table


_ALLOWED = _allowed_globals()


class _RestrictedUnpickler(AllowlistUnpickler):
    """The allowlist above, and storages resolved to where their bytes sit in the archive."""

    def __init__(self, data: bytes, archive: "TorchArchive") -> None:
        super().__init__(data, _ALLOWED, lambda qualified: UnsafeCheckpointError(
            f"refused to load {archive.path}: it pickles {quoted(qualified)}, which would run code when loaded; "
            "cogexport loads only tensors and plain data (if this file is yours, re-save its state dict with "
            "torch.save; if not, do not load it with torch.load(weights_only=False) either)"), _STAND_IN_PREFIXES)
        self._archive = archive

    def persistent_load(self, pid: Any) -> _StorageRef:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unexpected storage type {storage_type!r}")
        return self._archive.storage(str(key), storage_type.dtype, int(numel))


@dataclass(frozen=True, eq=False)
class StoredTensor(SizedTensor):
    """A tensor inside a torch.save archive: its dtype, shape and where its bytes are. Reads nothing by itself."""

    archive: "TorchArchive"
    key: str
    dtype: torch.dtype
    storage_offset: int
    shape: torch.Size
    stride: tuple[int, ...]

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for dim, step in zip(reversed(self.shape), reversed(self.stride)):
            if dim != 1 and step != expected:
                return False
            expected *= dim
        return True

    @property
    def location(self) -> tuple:
        """Identifies the bytes: two tensors with the same location are the same data (tied weights)."""
        return (self.archive.path, self.key, self.storage_offset, tuple(self.shape), self.stride)

    def check_bounds(self, storage_numel: int) -> None:
        last = self.storage_offset + sum((d - 1) * s for d, s in zip(self.shape, self.stride)) if self.numel else -1
        if self.storage_offset < 0 or last >= storage_numel:
            raise CogExportError(f"{self.archive.path} is corrupt: a tensor reaches past its storage {quoted(self.key)}")

    def read(self) -> torch.Tensor:
        """The whole tensor, as a new contiguous CPU tensor."""
        if self.is_contiguous:
            return self.read_flat(0, self.numel).view(self.shape)
        span = self.storage_offset + 1 + sum((d - 1) * s for d, s in zip(self.shape, self.stride))
        window = self.archive.read_elements(self.key, self.dtype, 0, span)
        return window.as_strided(self.shape, self.stride, self.storage_offset).contiguous()

    def read_flat(self, start: int, stop: int, out: torch.Tensor | None = None, check: bool = True) -> torch.Tensor:
        """Elements ``start:stop`` of the flattened tensor (contiguous tensors only), into ``out`` if given.
        ``check=False``: see ``ZipRecords.read_into``."""
        if not self.is_contiguous:
            return self.read().reshape(-1)[start:stop].clone()
        if not 0 <= start <= stop <= self.numel:
            raise IndexError(f"range {start}:{stop} outside a tensor of {self.numel} elements")
        return self.archive.read_elements(self.key, self.dtype, self.storage_offset + start, stop - start, out, check)

    def byte_ranges(self) -> ByteRanges | None:
        """The file bytes that are exactly this tensor (a contiguous tensor: its part of a stored record), with the
        record's CRC-32 check for whoever copies them."""
        if not self.is_contiguous:
            return None
        return self.flat_range(0, self.numel),

    def flat_range(self, start: int, stop: int) -> ByteRange:
        """The file bytes of elements ``start:stop`` of this contiguous tensor, checked as ``byte_ranges``'."""
        if not self.is_contiguous or not 0 <= start <= stop <= self.numel:
            raise IndexError(f"no byte range for elements {start}:{stop} of {quoted(self.key)}")
        itemsize = self.dtype.itemsize
        return self.archive.byte_range(self.key, (self.storage_offset + start) * itemsize, (stop - start) * itemsize)

    def finish_check(self) -> None:
        """Complete the CRC-32 check of the record holding this tensor (raises if it fails)."""
        self.archive.records.finish(self.archive.member(self.key))


def _has_zip_directory(handle) -> bool:
    """Whether the end of ``handle`` holds a zip directory. ``zipfile.is_zipfile`` answers no only for some damaged
    ends: a damaged zip64 record (a multi-disk archive claimed, a size past the file) makes it raise instead."""
    try:
        return zipfile.is_zipfile(handle)
    except Exception:  # noqa: BLE001 - whatever the damaged end makes zipfile raise, the answer is no
        return False


class TorchArchive:
    """One torch.save zip archive on disk: its pickle, and reads of storage bytes by position, each checked
    against its record's CRC-32 (see ``zip_records``).

    ``offset`` and ``length`` name an archive stored inside a bigger file (a DCP chunk in a ``.distcp`` file).
    """

    def __init__(self, path: Path, offset: int = 0, length: int | None = None) -> None:
        self.path = Path(path)
        self.offset, self.length = offset, length
        self.bytes_read = 0  # tensor data read so far (small pickles not counted)
        self._pickle = self._read_directory()

    def _read_directory(self) -> bytes:
        try:
            with open(self.path, "rb") as whole:
                handle = whole if self.length is None else ByteWindow(whole, self.offset, self.length)
                head = handle.read(len(_LEGACY_MAGIC_PREFIX))
                if head.startswith(_LEGACY_MAGIC_PREFIX):
                    raise CogExportError(
                        f"{self.path} uses torch's legacy (non-zip) format, which cannot be read lazily; re-save it "
                        "with torch.save's default format (DeepSpeed: drop \"checkpoint_serialization\": false)"
                    )
                if not _has_zip_directory(handle):
                    what = "looks truncated (its zip directory is missing or damaged)" if head.startswith(b"PK") \
                        else "is not a torch.save archive"
                    raise CogExportError(f"{self.path} {what}; copy it again or point at another checkpoint")
        except OSError as error:
            raise CogExportError(f"cannot read {self.path}: {error.strerror}") from None
        self.records = ZipRecords(self.path, self.offset, self.length)
        pickles = [name for name in self.records.records if name.endswith("/data.pkl") and name.count("/") == 1]
        if len(pickles) != 1:
            raise CogExportError(f"{self.path} is a zip file but not a torch.save archive (no single data.pkl)")
        self.root = pickles[0][: -len("/data.pkl")]  # torch.save names it after the file it saved to
        byteorder = f"{self.root}/byteorder"
        if byteorder in self.records.records and self.records.read(byteorder).strip() not in (b"", b"little"):
            raise CogExportError(f"{self.path} was saved on a big-endian machine, which is not supported")
        return self.records.read(pickles[0])

    def load(self) -> Any:
        """The archive's object tree, tensors replaced by ``StoredTensor`` references."""
        try:
            return _RestrictedUnpickler(self._pickle, self).load()
        except CogExportError:
            raise
        except Exception as error:  # a malformed pickle can fail in many ways; all mean the same to the user
            raise CogExportError(f"{self.path} is corrupt: its data.pkl does not unpickle "
                                 f"({quoted(str(error), 100)})") from None

    def fingerprint(self) -> tuple:
        """What the archive holds, from its directory alone: equal for two copies of one file."""
        return tuple(sorted((name.split("/", 1)[-1], record.size, record.crc)
                            for name, record in self.records.records.items()))

    def storage(self, key: str, dtype: torch.dtype, numel: int) -> _StorageRef:
        member = self.member(key)
        if member not in self.records.records:
            raise CogExportError(f"{self.path} is corrupt: storage {quoted(key)} is missing")
        if self.records.records[member].size < numel * dtype.itemsize:
            raise CogExportError(f"{self.path} is corrupt or truncated: storage {quoted(key)} is short")
        return _StorageRef(self, key, dtype, numel)

    def member(self, key: str) -> str:
        """The zip record holding storage ``key``."""
        return f"{self.root}/data/{key}"

    def read_elements(self, key: str, dtype: torch.dtype, start: int, count: int,
                      out: torch.Tensor | None = None, check: bool = True) -> torch.Tensor:
        """``count`` elements of storage ``key`` from element ``start``, read straight into a tensor."""
        if out is None:
            out = torch.empty(count, dtype=dtype)
        elif out.dtype != dtype or out.numel() != count or not out.is_contiguous():
            raise ValueError("output tensor does not match the requested range")
        if count:
            self.records.read_into(self.member(key), start * dtype.itemsize, tensor_buffer(out), check)
            if check:  # the few elements read only to cross-check others are not data used
                self.bytes_read += count * dtype.itemsize
        return out

    def byte_range(self, key: str, start: int, length: int) -> ByteRange:
        """``length`` bytes of storage ``key`` from byte ``start``, where they lie in the file; the bytes a copy
        reads back go through the record's CRC-32 check (``ZipRecords.check_bytes``) unless the archive stores
        no CRC-32s."""
        member = self.member(key)

        def check(position: int, data: memoryview) -> None:
            self.records.check_bytes(member, start + position, data)

        return ByteRange(str(self.path), self.records.records[member].offset + start, length,
                         check if self.records.checking else None)

    def close(self) -> None:
        self.records.close()


def load_torch_file(path: Path) -> tuple[TorchArchive, Any]:
    """Open a torch.save file: the archive (for reading tensor data later) and its object tree."""
    archive = TorchArchive(path)
    return archive, archive.load()
