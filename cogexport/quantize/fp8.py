"""ComfyUI's scaled fp8 (``--quant fp8``, ``fp8_e5m2``): a layer's weight in float8 with one float32 scale for the
whole tensor, ``max|W| / the type's largest finite value`` (1 for an all-zero weight); the stored weight is
``(W / scale)`` clamped to the type's range and cast (round to nearest even), and ComfyUI dequantizes it as
``weight.to(dtype) * weight_scale``. The scale needs the whole weight before any of it is cast.
"""

from __future__ import annotations

from typing import Mapping

import torch

from .comfy_quant import ComfyQuantization, LayerPart, finite


def fp8_scale(weight: torch.Tensor, fp8_dtype: torch.dtype, name: str = "weight") -> torch.Tensor:
    """The float32 scalar scale of ``weight``: its largest magnitude over the fp8 type's largest finite value."""
    peak = finite(weight.detach(), name).float().abs().max()
    scale = peak / torch.finfo(fp8_dtype).max
    return torch.where(peak > 0, scale, torch.ones_like(scale)).reshape(())


def fp8_cast(weight: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    limit = torch.finfo(fp8_dtype).max
    return (weight.float() / scale).clamp(-limit, limit).to(fp8_dtype)


def _scaled_fp8(name: str, fp8_dtype: torch.dtype, legacy: bool) -> ComfyQuantization:
    kind = str(fp8_dtype).removeprefix("torch.")

    def weight(source: torch.Tensor, tensor: str) -> torch.Tensor:
        return fp8_cast(source, fp8_scale(source, fp8_dtype, tensor), fp8_dtype)

    def dequantize(parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return parts["weight"].float() * parts["weight_scale"].float().reshape(())

    return ComfyQuantization(
        name=name, format=kind, file_tag=f"{kind.removeprefix('float8_')}_scaled",
        summary=f"fp8 {kind.removeprefix('float8_')} with a per-tensor scale", judge="ComfyUI's scaled fp8 cast",
        parts=(LayerPart("weight", fp8_dtype, lambda shape: shape, weight),
               LayerPart("weight_scale", torch.float32, lambda shape: (),
                         lambda source, tensor: fp8_scale(source, fp8_dtype, tensor))),
        dequantize=dequantize, legacy=legacy)


QUANTIZATIONS = (_scaled_fp8("fp8", torch.float8_e4m3fn, legacy=True),
                 _scaled_fp8("fp8_e5m2", torch.float8_e5m2, legacy=False))
