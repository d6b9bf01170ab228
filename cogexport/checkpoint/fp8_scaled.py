"""ComfyUI's scaled fp8 safetensors read back as the weights they stand for: each fp8 weight times its scale
(``weight.float() * weight_scale``, as ComfyUI dequantizes it), in either layout (per-layer ``weight_scale`` with
``comfy_quant`` markers or ``_quantization_metadata``, or the legacy ``scale_weight`` with a ``scaled_fp8`` marker);
the markers and scales themselves are left out. For ``inspect`` and ``verify``."""

from __future__ import annotations

from typing import Mapping

import torch

from ..errors import CogExportError, quoted
from ..lazy import LazyTensor

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
SCALE_SUFFIXES = (".weight_scale", ".scale_weight")
MARKERS = (".comfy_quant", ".input_scale", ".scale_input")


def is_scaled_fp8(tensors: Mapping[str, LazyTensor]) -> bool:
    return any(t.dtype in FP8_DTYPES for t in tensors.values()) and any(
        name.endswith(SCALE_SUFFIXES) for name in tensors)


def fp8_dequantized(tensors: Mapping[str, LazyTensor]) -> dict[str, LazyTensor]:
    """Names -> the dequantized weights (float32) and every other tensor as stored."""
    out: dict[str, LazyTensor] = {}
    for name, tensor in tensors.items():
        if name == "scaled_fp8" or name.endswith(SCALE_SUFFIXES) or name.endswith(MARKERS):
            continue
        if tensor.dtype in FP8_DTYPES:
            out[name] = _dequantized(name, tensor, _scale_of(name, tensors))
        else:
            out[name] = tensor
    return out


def _scale_of(name: str, tensors: Mapping[str, LazyTensor]) -> LazyTensor:
    layer = name[: -len(".weight")] if name.endswith(".weight") else name
    for suffix in SCALE_SUFFIXES:
        if layer + suffix in tensors:
            return tensors[layer + suffix]
    raise CogExportError(f"fp8 tensor {quoted(name)} has no {layer}.weight_scale (or scale_weight): "
                         "the file is not ComfyUI's scaled fp8 layout")


def _dequantized(name: str, weight: LazyTensor, scale: LazyTensor) -> LazyTensor:
    if scale.numel != 1:
        raise CogExportError(f"the scale of {quoted(name)} holds {scale.numel} values; per-tensor scales hold one")

    def load() -> torch.Tensor:
        return weight.load().float() * scale.load().float().reshape(())

    return LazyTensor(weight.shape, torch.float32, load, f"{weight.origin} times its scale")
