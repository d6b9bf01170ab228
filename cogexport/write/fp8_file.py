"""ComfyUI's scaled fp8 safetensors: the family's quantized Linear weights in float8 with a per-tensor scale, every
other tensor as given, streamed through the safetensors writer.

Per quantized layer ``L`` (its weight ``L.weight``), as ComfyUI's loader reads it today (comfy/ops.py, comfy/utils.py
``convert_old_quants``, comfy/quant_ops.py ``QUANT_ALGOS``):
- ``comfy_quant`` layout (default): ``L.weight`` in float8, ``L.weight_scale`` (float32 scalar) and ``L.comfy_quant``,
  a uint8 tensor holding the JSON ``{"format": "float8_e4m3fn"}`` (or ``float8_e5m2``);
- ``metadata`` layout: the same tensors without ``L.comfy_quant``; the header's ``__metadata__`` carries
  ``_quantization_metadata`` = ``{"format_version": "1.0", "layers": {L: {"format": ...}}}`` instead;
- ``legacy`` layout: ``L.scale_weight`` instead of ``L.weight_scale`` and an empty ``scaled_fp8`` marker tensor (float8
  e4m3fn only: ComfyUI reads every legacy layer as e4m3fn).
The scale is ComfyUI's per-tensor absmax scale, ``max|W| / finfo(fp8).max`` in float32 (1 for an all-zero weight),
and the stored weight ``(W / scale).clamp(-max, max)`` cast to float8 (round to nearest even); ComfyUI dequantizes
``weight.to(dtype) * weight_scale``. The scale needs the whole weight before any of it is cast, so each quantized
weight is read twice (once for its scale, once for its values): memory still holds one tensor at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch

from ..errors import CogExportError, quoted
from ..finite_values import NonfiniteValuesError, count_nonfinite
from ..lazy import LazyTensor
from ..quantize.policy import QuantizationPolicy
from .safetensors_file import write_safetensors

FP8_FORMATS = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
LAYOUTS = ("comfy_quant", "metadata", "legacy")
LEGACY_MARKER = "scaled_fp8"


@dataclass(frozen=True)
class Fp8Plan:
    """The tensors of the file (names -> lazy tensors), its header metadata, and which layers are in fp8."""

    tensors: Mapping[str, LazyTensor]
    metadata: Mapping[str, str]
    layers: tuple[str, ...]


def fp8_scale(weight: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """The float32 scalar scale of ``weight``: its largest magnitude over the fp8 type's largest finite value (of its
    finite values, where it holds NaN or infinities: the weight itself is refused, ``fp8_weight``)."""
    peak = _peak(weight)
    if not torch.isfinite(peak):
        peak = _peak(torch.nan_to_num(weight.detach().float(), nan=0.0, posinf=0.0, neginf=0.0))
    return _scale(peak, fp8_dtype)


def fp8_weight(weight: torch.Tensor, fp8_dtype: torch.dtype, name: str) -> torch.Tensor:
    """``weight`` scaled into fp8 (``fp8_cast`` by ``fp8_scale``). NaN or infinite values are refused even when
    asked for (``NonfiniteValuesError``): the scale is the largest magnitude, which they have none of."""
    peak = _peak(weight)
    if not torch.isfinite(peak):
        raise NonfiniteValuesError(name, count_nonfinite(weight), why_not="an fp8 weight's scale is made from its "
                                   "largest value, so it cannot hold them")
    return fp8_cast(weight, _scale(peak, fp8_dtype), fp8_dtype)


def _peak(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().float().abs().max()


def _scale(peak: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    scale = peak / torch.finfo(fp8_dtype).max
    return torch.where(peak > 0, scale, torch.ones_like(scale)).reshape(())


def fp8_cast(weight: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    limit = torch.finfo(fp8_dtype).max
    return (weight.float() / scale).clamp(-limit, limit).to(fp8_dtype)


def plan_fp8(tensors: Mapping[str, LazyTensor], policy: QuantizationPolicy, *,
             fp8_dtype: torch.dtype = torch.float8_e4m3fn, layout: str = "comfy_quant",
             keep_dtype: torch.dtype | None = None) -> Fp8Plan:
    """The scaled-fp8 file for ``tensors`` (original release names). Weights the family's ``[fp8] quantize`` globs
    name are stored in ``fp8_dtype``; the others as given (cast to ``keep_dtype`` when one is given)."""
    if fp8_dtype not in FP8_FORMATS:
        raise CogExportError(f"fp8 files hold float8_e4m3fn or float8_e5m2, not {fp8_dtype}")
    if layout not in LAYOUTS:
        raise CogExportError(f"unknown fp8 layout {quoted(layout)}; one of {', '.join(LAYOUTS)}")
    if layout == "legacy" and fp8_dtype != torch.float8_e4m3fn:
        raise CogExportError("the legacy scaled_fp8 layout is read as float8_e4m3fn only; use the comfy_quant layout "
                             "for float8_e5m2")
    out: dict[str, LazyTensor] = {}
    layers = []
    for name, source in tensors.items():
        if name.endswith(".weight") and policy.fp8_quantizes(name, tuple(source.shape)):
            layer = name[: -len(".weight")]
            layers.append(layer)
            out.update(_quantized_layer(layer, source, fp8_dtype, layout))
        else:
            out[name] = source.to(keep_dtype) if keep_dtype is not None and source.dtype.is_floating_point else source
    if not layers:
        raise CogExportError(f"no tensor matches the {policy.family} family's fp8 weights; are these the original "
                             "release names?")
    return Fp8Plan(out, _header(layers, fp8_dtype, layout), tuple(layers))


def _quantized_layer(layer: str, source: LazyTensor, fp8_dtype: torch.dtype, layout: str) -> dict[str, LazyTensor]:
    def scale() -> torch.Tensor:
        return fp8_scale(source.load(), fp8_dtype)

    def weight() -> torch.Tensor:
        return fp8_weight(source.load(), fp8_dtype, f"{layer}.weight")

    scale_name = f"{layer}.scale_weight" if layout == "legacy" else f"{layer}.weight_scale"
    out = {f"{layer}.weight": LazyTensor(source.shape, fp8_dtype, weight, f"{source.origin} as fp8"),
           scale_name: LazyTensor(torch.Size([]), torch.float32, scale, f"{source.origin}'s fp8 scale")}
    if layout == "comfy_quant":
        marker = comfy_quant_tensor(fp8_dtype)
        out[f"{layer}.comfy_quant"] = LazyTensor(marker.shape, torch.uint8, lambda: marker.clone(), "comfy_quant")
    if layout == "legacy":
        out[LEGACY_MARKER] = LazyTensor(torch.Size([0]), fp8_dtype, lambda: torch.empty(0, dtype=fp8_dtype), "marker")
    return out


def comfy_quant_tensor(fp8_dtype: torch.dtype) -> torch.Tensor:
    """The per-layer marker: the layer's config as UTF-8 JSON in a uint8 tensor (as ComfyUI encodes it)."""
    return torch.tensor(list(json.dumps({"format": FP8_FORMATS[fp8_dtype]}).encode("utf-8")), dtype=torch.uint8)


def _header(layers: list[str], fp8_dtype: torch.dtype, layout: str) -> dict[str, str]:
    if layout != "metadata":
        return {}
    config = {"format_version": "1.0", "layers": {layer: {"format": FP8_FORMATS[fp8_dtype]} for layer in layers}}
    return {"_quantization_metadata": json.dumps(config)}


def write_fp8(path: Path, plan: Fp8Plan, on_tensor: Callable[[str, int], None] | None = None) -> int:
    """Stream the plan into one safetensors file; returns the bytes of tensor data written."""
    return write_safetensors(Path(path), plan.tensors, plan.metadata or None, on_tensor)
