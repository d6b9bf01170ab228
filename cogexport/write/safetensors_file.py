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
from .file_parts import FileLayout, placed_one_after_another, write_run
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


def safetensors_layout(tensors: Mapping[str, LazyTensor], metadata: Mapping[str, str] | None) -> FileLayout:
    """Where everything lies in the file: the header, then each tensor's bytes in storage order, end to end."""
    return placed_one_after_another(build_header(tensors, metadata),
                                    [(name, tensors[name].nbytes) for name in storage_order(tensors)])


def write_safetensors(path: Path, tensors: Mapping[str, LazyTensor], metadata: Mapping[str, str] | None = None,
                      on_tensor: Callable[[str, int], None] | None = None,
                      payloads: Iterator[Payload] | None = None) -> int:
    """Stream ``tensors`` into ``path``; returns the bytes of tensor data written.

    ``on_tensor(name, nbytes)`` is called after each tensor (progress bars). ``payloads``: each tensor's data in
    storage order (``write_order``), from a ``TensorFeed`` that may load them ahead; by default they are loaded here
    one at a time.
    """
    layout = safetensors_layout(tensors, metadata)
    with ExitStack() as stack:
        if payloads is None:
            payloads = iter(stack.enter_context(TensorFeed(write_order(tensors))))
        return write_run(path, layout, range(len(layout.tensors)), payloads, whole=True, on_tensor=on_tensor)


def write_order(tensors: Mapping[str, LazyTensor]) -> list[LazyTensor]:
    """The tensors in the order their data is written (the payloads ``write_safetensors`` takes)."""
    return [tensors[name] for name in storage_order(tensors)]
