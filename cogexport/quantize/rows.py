"""Quantize a tensor to a GGML type, a bounded chunk of rows at a time: tensor in, the stored bytes out."""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import Callable

import torch

from ..errors import CogExportError, quoted
from ..finite_values import NonfiniteValuesError, count_nonfinite
from . import kernel, kquants, legacy
from .formats import GgmlType, ggml_type

_BLOCK_QUANTIZERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "F32": legacy.quantize_f32, "F16": legacy.quantize_f16, "BF16": legacy.quantize_bf16,
    "Q8_0": legacy.quantize_q8_0, "Q5_1": legacy.quantize_q5_1, "Q5_0": legacy.quantize_q5_0,
    "Q4_1": legacy.quantize_q4_1, "Q4_0": legacy.quantize_q4_0,
    "Q6_K": kquants.quantize_q6_k, "Q5_K": kquants.quantize_q5_k, "Q4_K": kquants.quantize_q4_k,
}
# Types whose values or scales are stored as float16: a magnitude past float16's largest finite value would be
# stored as infinity, so it is refused instead.
_HALF_LIMIT = 65504.0
_BOUNDLESS = ("F32", "BF16")
# Values quantized at once: bounds the working memory to a few MB and keeps each vector operation in cache. The K
# types' searches make some 20 passes over arrays of a chunk's size per candidate scale: measured on a 2 MB L2,
# 2^16 to 2^17 values is the fastest (2^18 about 10% slower, 2^15 20% slower: a fixed cost per operation).
CHUNK_VALUES = 1 << 17


def quantize_tensor(tensor: torch.Tensor, type_name: str, name: str = "tensor",
                    allow_nonfinite: bool = False, into: torch.Tensor | None = None) -> torch.Tensor:
    """``tensor`` (any float dtype, its rows along the last dimension) stored as ``type_name``: a uint8 tensor of
    shape (rows, bytes per row), ``into`` where given (contiguous: a piece's rows of the whole tensor's bytes, so
    that the pieces need no joining copy). Refuses rows the type cannot hold, naming ``name``, and non-finite
    values (``NonfiniteValuesError``, which says how the float types can write them anyway: ``allow_nonfinite``)."""
    kind = ggml_type(type_name)
    rows = tensor.reshape(-1, tensor.shape[-1] if tensor.dim() else 1)
    if not kind.fits(rows.shape[1]):
        raise CogExportError(f"{quoted(name)}: rows of {rows.shape[1]} values cannot be stored as {type_name} "
                             f"(blocks of {kind.block})")
    out = torch.empty(rows.shape[0], kind.row_bytes(rows.shape[1]), dtype=torch.uint8) if into is None else into
    step = max(1, CHUNK_VALUES // max(1, rows.shape[1]))
    compiled = kernel.handles(type_name)
    # the compiled quantizer's threads call this at once: torch's thread count, one setting of the process, is
    # left alone for them (their only torch operation here is the cast)
    with nullcontext() if compiled else _one_thread():
        for start in range(0, rows.shape[0], step):
            chunk = rows[start:start + step].to(torch.float32)
            # the compiled quantizer checks the values as it goes; what it refuses, the checks below name
            if compiled and kernel.quantize_blocks(chunk.reshape(-1, kind.block), type_name, out[start:start + step]):
                continue
            refuse_nonfinite = not (allow_nonfinite and kind.is_float)
            if not (refuse_nonfinite and _plainly_fits(chunk, kind)):  # else the exact checks find the error
                if refuse_nonfinite and not torch.isfinite(chunk).all():
                    raise _nonfinite(tensor, type_name, name)
                _check_range(chunk, kind, name)
            out[start:start + step] = _quantize_rows(chunk, kind)
    return out


def _nonfinite(tensor: torch.Tensor, type_name: str, name: str) -> NonfiniteValuesError:
    """The whole tensor's non-finite values counted; a float type stores them as they are if asked, a block type's
    scale, made from all of a block's values, cannot hold them."""
    if ggml_type(type_name).is_float:
        return NonfiniteValuesError(name, count_nonfinite(tensor), lambda: quantize_tensor(tensor, type_name, name,
                                                                                              allow_nonfinite=True))
    return NonfiniteValuesError(name, count_nonfinite(tensor), why_not=f"{type_name} blocks cannot hold them (a "
                                "block's scale is made from all of its values)")


@contextmanager
def _one_thread():
    """The quantizers run thousands of small elementwise operations per chunk; split over threads they spend more
    time synchronising than computing (measured 5-10x slower with 2 threads on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _quantize_rows(rows: torch.Tensor, kind: GgmlType) -> torch.Tensor:
    quantizer = _BLOCK_QUANTIZERS[kind.name]
    if kind.is_float:
        return quantizer(rows).reshape(rows.shape[0], -1)
    blocks = rows.reshape(-1, kind.block)
    return quantizer(blocks).reshape(rows.shape[0], -1)


def _plainly_fits(chunk: torch.Tensor, kind: GgmlType) -> bool:
    """Whether every value of ``chunk`` is finite and, for a type storing float16, within its range: one pass
    (``aminmax``: NaN makes both extremes NaN, which fails either comparison) where ``isfinite(...).all()`` made
    four (an equality, an absolute value, an inequality, a reduction: 18 ns a value here, twice llama.cpp's whole
    Q8_0). When it says no, the exact checks below find which error to raise."""
    if not chunk.numel():
        return True
    low, high = (float(extreme) for extreme in torch.aminmax(chunk))
    if kind.name in _BOUNDLESS:
        return -math.inf < low and high < math.inf
    return -_HALF_LIMIT <= low and high <= _HALF_LIMIT


def _check_range(chunk: torch.Tensor, kind: GgmlType, name: str) -> None:
    if kind.name not in _BOUNDLESS and chunk.numel() and chunk.abs().max() > _HALF_LIMIT:
        raise CogExportError(f"{quoted(name)} holds values beyond {_HALF_LIMIT:g}, which {kind.name} stores as "
                             "float16 (it would hold infinity): choose BF16 or F32 for it")
