"""Write a safetensors file one tensor at a time, byte for byte what ``safetensors.torch.save_file`` writes.

The header (names, dtypes, shapes, offsets) depends only on shapes and dtypes, so it is written first and
each tensor's bytes follow as it is loaded: memory holds one tensor, never a shard. The layout rules below
are the safetensors library's own: tensors are stored by dtype (in its enum order, largest first), then by
name; the JSON header is compact, ``__metadata__`` first, padded with spaces to a multiple of 8 bytes.
"""

from __future__ import annotations

import json
import struct
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch

from ..lazy import LazyTensor
from ..safetensors_dtypes import SAFETENSORS_DTYPES
from ..tensor_bytes import tensor_buffer
from .byte_copy import TrailingChecks, copy_range
from .io_engine import Payload, TensorFeed

# The order safetensors stores dtypes in (its Dtype enum, descending).
_STORAGE_ORDER = ["U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16", "F8_E4M3",
                  "F8_E5M2", "I8", "U8", "BOOL"]
_RANK = {code: index for index, code in enumerate(_STORAGE_ORDER)}


def storage_order(tensors: Mapping[str, LazyTensor]) -> list[str]:
    """Names in the order their bytes are laid out in the file."""
    return sorted(tensors, key=lambda name: (_RANK[_code(tensors[name].dtype)], name.encode()))


def _code(dtype: torch.dtype) -> str:
    try:
        return SAFETENSORS_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"safetensors cannot store {dtype}") from None


def build_header(tensors: Mapping[str, LazyTensor], metadata: Mapping[str, str] | None) -> bytes:
    """The length-prefixed, padded JSON header for these tensors, in storage order."""
    entries: dict[str, object] = {}
    if metadata:
        entries["__metadata__"] = dict(metadata)
    offset = 0
    for name in storage_order(tensors):
        tensor = tensors[name]
        entries[name] = {"dtype": _code(tensor.dtype), "shape": list(tensor.shape),
                         "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-(len(text) + 8) % 8)
    return struct.pack("<Q", len(text)) + text


def write_safetensors(path: Path, tensors: Mapping[str, LazyTensor], metadata: Mapping[str, str] | None = None,
                      on_tensor: Callable[[str, int], None] | None = None,
                      payloads: Iterator[Payload] | None = None) -> int:
    """Stream ``tensors`` into ``path``; returns the bytes of tensor data written.

    ``on_tensor(name, nbytes)`` is called after each tensor (progress bars). ``payloads``: each tensor's data in
    storage order (``write_order``), from a ``TensorFeed`` that may load them ahead; by default they are loaded here
    one at a time.
    """
    header = build_header(tensors, metadata)
    written = 0
    with ExitStack() as stack:
        if payloads is None:
            payloads = iter(stack.enter_context(TensorFeed(write_order(tensors))))
        checks = stack.enter_context(TrailingChecks())
        handle = stack.enter_context(open(path, "wb", buffering=0))
        write_all(handle, memoryview(header))
        for name in storage_order(tensors):
            write_payload(handle, next(payloads), checks)
            written += tensors[name].nbytes
            if on_tensor is not None:
                on_tensor(name, tensors[name].nbytes)
        checks.drain()
    return written


def write_order(tensors: Mapping[str, LazyTensor]) -> list[LazyTensor]:
    """The tensors in the order their data is written (the payloads ``write_safetensors`` takes)."""
    return [tensors[name] for name in storage_order(tensors)]


def write_payload(handle, payload: Payload, checks: TrailingChecks | None = None) -> None:
    """A tensor's bytes at the file's position: copied from the input files (byte ranges, end to end) or from
    memory. ``checks``: where the copies' checks run (see ``copy_range``)."""
    if isinstance(payload, tuple):
        position = handle.tell()
        for part in payload:
            copy_range(part, handle.fileno(), position, checks=checks)
            position += part.length
    else:
        write_all(handle, tensor_buffer(payload.contiguous()))


def write_all(handle, data: memoryview) -> None:
    while len(data):
        done = handle.write(data)
        data = data[done:]
