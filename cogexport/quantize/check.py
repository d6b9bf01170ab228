"""Check a quantized file against the checkpoint it was made from (for ``verify``): every tensor of the file equal to
its source quantized by the reference, and the error the quantization cost, per tensor.

The reference for F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_0 and Q4_1 is the ``gguf`` package's own quantizer (llama.cpp's
gguf-py); the package has none for the K types, for which cogexport's port of llama.cpp's reference algorithm
stands in (its tests compare it with llama.cpp's C code byte for byte). For scaled fp8 the reference is the cast
ComfyUI describes, recomputed here from the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import gguf
import numpy as np
import torch

from ..lazy import LazyTensor
from .rows import quantize_tensor

GGUF_REFERENCE_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1"}


@dataclass(frozen=True)
class TensorCheck:
    """One tensor's verdict: ``exact`` (the file holds what the reference makes of the source), ``max_error`` and
    ``rms_relative`` (of the file's values against the unquantized source), and who judged the bytes."""

    name: str
    type: str
    exact: bool
    max_error: float
    rms_relative: float
    judge: str


def errors(restored: torch.Tensor, source: torch.Tensor) -> tuple[float, float]:
    """Largest absolute difference, and the RMS of the difference over the RMS of the source (0 for a zero source)."""
    source, diff = source.double(), restored.double() - source.double()
    if diff.numel() == 0:
        return 0.0, 0.0
    scale = source.pow(2).mean().sqrt().item()
    rms = diff.pow(2).mean().sqrt().item()
    relative = rms / scale if scale else (float("inf") if rms else 0.0)
    return diff.abs().max().item(), relative


def reference_bytes(values: torch.Tensor, type_name: str) -> tuple[np.ndarray, str]:
    """``values`` stored as ``type_name`` by the reference, and the reference's name."""
    if type_name in GGUF_REFERENCE_TYPES:
        stored = gguf.quants.quantize(values.float().numpy(), gguf.GGMLQuantizationType[type_name])
        return stored.reshape(-1).view(np.uint8), "gguf package"
    return quantize_tensor(values, type_name).numpy().reshape(-1), "cogexport (llama.cpp's reference algorithm)"


def check_gguf(checkpoint, source: Mapping[str, LazyTensor]) -> list[TensorCheck]:
    """``checkpoint``: a ``GgufCheckpoint``; ``source``: the original-layout tensors the file was made from."""
    checks = []
    for name in checkpoint:
        original = source[name].load()
        stored_shape = checkpoint.stored_shapes[name]
        expected, judge = reference_bytes(original.reshape(stored_shape), checkpoint.types[name])
        exact = bool(np.array_equal(checkpoint.stored_bytes(name), expected))
        max_error, relative = errors(checkpoint[name].load().float(), original.float())
        checks.append(TensorCheck(name, checkpoint.types[name], exact, max_error, relative, judge))
    return checks


def check_fp8(dequantized: Mapping[str, LazyTensor], fp8_names: set[str], source: Mapping[str, LazyTensor],
              fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> list[TensorCheck]:
    """``dequantized``: ``checkpoint.fp8_scaled.fp8_dequantized`` of the file; ``fp8_names``: its fp8 weights."""
    checks = []
    for name, tensor in dequantized.items():
        restored, original = tensor.load(), source[name].load()
        if name in fp8_names:
            peak = original.float().abs().max()
            scale = torch.where(peak > 0, peak / torch.finfo(fp8_dtype).max, torch.ones_like(peak))
            limit = torch.finfo(fp8_dtype).max
            expected = (original.float() / scale).clamp(-limit, limit).to(fp8_dtype).float() * scale
            exact, kind = torch.equal(restored, expected), str(fp8_dtype).replace("torch.", "")
        else:
            exact, kind = torch.equal(restored, original.to(restored.dtype)), str(restored.dtype).replace("torch.", "")
        max_error, relative = errors(restored.float(), original.float())
        checks.append(TensorCheck(name, kind, exact, max_error, relative, "ComfyUI's scaled fp8 cast"))
    return checks
