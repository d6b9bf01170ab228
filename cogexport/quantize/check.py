"""Check a quantized file against the checkpoint it was made from (for ``verify``): every tensor of the file equal to
its source quantized by the reference, and the error the quantization cost, per tensor.

The reference for F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_0 and Q4_1 is the ``gguf`` package's own quantizer (llama.cpp's
gguf-py); the package has none for the K types, for which cogexport's port of llama.cpp's reference algorithm
stands in (its tests compare it with llama.cpp's C code byte for byte). For ComfyUI's formats the reference is each
format's quantizer (quantize/comfy_quant.py: scaled fp8 the cast ComfyUI describes, nvfp4, mxfp8 and int8 the rules of
comfy-kitchen's quantizers, which the tests compare with comfy-kitchen's own byte for byte), recomputed here from the
source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import gguf
import numpy as np
import torch

from ..lazy import LazyTensor
from .comfy_quant import ComfyQuantization
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
    stored: int = 1  # the tensors the file stores for it (a quantized layer's weight and each of its scales)


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


def check_comfy_quant(layers: Mapping[str, ComfyQuantization], stored: Mapping[str, LazyTensor],
                      weights: Mapping[str, LazyTensor], source: Mapping[str, LazyTensor]) -> list[TensorCheck]:
    """``stored``: a ComfyUI quantized file's tensors; ``layers``: its quantized layers and their formats;
    ``weights``: ``checkpoint.comfy_quant.dequantized`` of it. A quantized layer is exact when every tensor it stores
    (the weight and each scale) is what the format's quantizer makes of the source weight, byte for byte; any other
    tensor, when it holds the source cast to its dtype."""
    from ..checkpoint.comfy_quant import layer_parts

    checks = []
    for name, tensor in weights.items():
        restored, original = tensor.load(), source[name].load()
        quantization = layers.get(name[: -len(".weight")]) if name.endswith(".weight") else None
        parts = {}
        if quantization is not None:
            parts = layer_parts(name[: -len(".weight")], quantization, stored)
            exact = all(_same_bytes(parts[part.name].load(), part.make(original, name)) for part in quantization.parts)
            kind, judge = quantization.format, quantization.judge
        else:
            exact, kind = torch.equal(restored, original.to(restored.dtype)), str(restored.dtype).replace("torch.", "")
            judge = "the dtype cast"
        max_error, relative = errors(restored.float(), original.float())
        checks.append(TensorCheck(name, kind, exact, max_error, relative, judge, max(len(parts), 1)))
    return checks


def _same_bytes(stored: torch.Tensor, expected: torch.Tensor) -> bool:
    return stored.shape == expected.shape and torch.equal(stored.reshape(-1).contiguous().view(torch.uint8),
                                                            expected.reshape(-1).contiguous().view(torch.uint8))
