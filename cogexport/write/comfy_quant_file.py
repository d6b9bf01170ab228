"""ComfyUI's quantized safetensors (``--to comfyui``): the family's quantized Linear weights (``[fp8] quantize`` of
key_maps/<family>/quantized.toml) stored in one of ComfyUI's formats (quantize/comfy_quant.py: scaled fp8, nvfp4,
mxfp8, int8), every other tensor as given, streamed through the safetensors writer.

How the file marks a quantized layer ``L`` (as ComfyUI's loader reads it today: comfy/ops.py, comfy/utils.py
``convert_old_quants``, comfy/quant_ops.py ``QUANT_ALGOS``):
- ``comfy_quant`` layout (default): ``L.comfy_quant``, a uint8 tensor holding the JSON ``{"format": ...}``;
- ``metadata`` layout: no marker tensors; the header's ``__metadata__`` carries ``_quantization_metadata`` =
  ``{"format_version": "1.0", "layers": {L: {"format": ...}}}`` instead;
- ``legacy`` layout (scaled fp8 e4m3fn only): ``L.scale_weight`` instead of ``L.weight_scale`` and an empty
  ``scaled_fp8`` marker tensor; ComfyUI reads every legacy layer as float8_e4m3fn.

Each tensor of a quantized layer (its weight and each scale) is computed from the source weight when it is written,
so a weight is read once for each tensor its layer stores: the file keeps tensors in dtype order, a layer's scales far
from its weight, and memory still holds one tensor at a time. A weight the format cannot store as it is (a shape its
blocks do not tile, which ComfyUI's quantizers would pad) stays as given, and the plan says so in a note.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Mapping

import torch

from ..errors import CogExportError, quoted
from ..lazy import LazyTensor
from ..quantize.comfy_quant import ComfyQuantization, LayerPart
from ..quantize.policy import QuantizationPolicy
from .safetensors_file import write_safetensors

LAYOUTS = ("comfy_quant", "metadata", "legacy")
LEGACY_MARKER = "scaled_fp8"
LEGACY_NAMES = {"weight_scale": "scale_weight"}  # a part's name in the legacy layout, where it differs


@dataclass(frozen=True)
class ComfyQuantPlan:
    """The tensors of the file (names -> lazy tensors), its header metadata, which layers are quantized, and the
    weights the family quantizes that stay as given (why, in a note each)."""

    tensors: Mapping[str, LazyTensor]
    metadata: Mapping[str, str]
    layers: tuple[str, ...]
    notes: tuple[str, ...] = ()


def check_layout(quantization: ComfyQuantization, layout: str) -> None:
    if layout not in LAYOUTS:
        raise CogExportError(f"unknown --fp8-layout {quoted(layout)}; one of {', '.join(LAYOUTS)}")
    if layout == "legacy" and not quantization.legacy:
        raise CogExportError(f"the legacy scaled_fp8 layout is read as float8_e4m3fn only; use the comfy_quant layout "
                             f"for --quant {quantization.name}")


def plan_comfy_quant(tensors: Mapping[str, LazyTensor], policy: QuantizationPolicy,
                     quantization: ComfyQuantization, *, layout: str = "comfy_quant",
                     sources: Mapping[str, LazyTensor] | None = None,
                     keep_dtype: torch.dtype | None = None) -> ComfyQuantPlan:
    """The file for ``tensors`` (original release names): the weights the family's ``[fp8] quantize`` globs name
    quantized from ``sources`` (the weights as read; ``tensors`` by default), the others as given (cast to
    ``keep_dtype`` when one is given)."""
    check_layout(quantization, layout)
    sources = tensors if sources is None else sources
    out: dict[str, LazyTensor] = {}
    layers, notes, named = [], [], False
    for name, tensor in tensors.items():
        quantized = name.endswith(".weight") and policy.fp8_quantizes(name, tuple(tensor.shape))
        named |= quantized
        unfit = quantization.unfit(tuple(tensor.shape)) if quantized else None
        if quantized and unfit is None:
            layers.append(name[: -len(".weight")])
            out.update(_layer(layers[-1], sources[name], quantization, layout))
            continue
        out[name] = tensor.to(keep_dtype) if keep_dtype is not None and tensor.dtype.is_floating_point else tensor
        if unfit:
            notes.append(f"{name}: {unfit}; kept in {str(out[name].dtype).removeprefix('torch.')}")
    if not layers:
        raise CogExportError(f"no tensor matches the {policy.family} family's quantized weights; are these the "
                             "original release names?" if not named else
                             f"none of the {policy.family} family's quantized weights can be stored as "
                             f"{quantization.name} ({notes[0]})")
    return ComfyQuantPlan(out, _header(layers, quantization, layout), tuple(layers), tuple(notes))


def _layer(layer: str, source: LazyTensor, quantization: ComfyQuantization, layout: str) -> dict[str, LazyTensor]:
    """The tensors of one quantized layer, each computed from the source weight when it is loaded."""
    out = {}
    for part in quantization.parts:
        suffix = LEGACY_NAMES.get(part.name, part.name) if layout == "legacy" else part.name
        out[f"{layer}.{suffix}"] = LazyTensor(torch.Size(part.shape(tuple(source.shape))), part.dtype,
                                              partial(_made, part, source, f"{layer}.weight"),
                                              f"{source.origin} as {quantization.name} ({part.name})")
    if layout == "comfy_quant":
        marker = comfy_quant_tensor(quantization.format)
        out[f"{layer}.comfy_quant"] = LazyTensor(marker.shape, torch.uint8, marker.clone, "comfy_quant")
    if layout == "legacy":
        out[LEGACY_MARKER] = LazyTensor(torch.Size([0]), torch.float8_e4m3fn,
                                        lambda: torch.empty(0, dtype=torch.float8_e4m3fn), "marker")
    return out


def _made(part: LayerPart, source: LazyTensor, name: str) -> torch.Tensor:
    return part.make(source.load(), name)


def comfy_quant_tensor(format_name: str) -> torch.Tensor:
    """The per-layer marker: the layer's config as UTF-8 JSON in a uint8 tensor (as ComfyUI encodes it)."""
    return torch.tensor(list(json.dumps({"format": format_name}).encode("utf-8")), dtype=torch.uint8)


def _header(layers: list[str], quantization: ComfyQuantization, layout: str) -> dict[str, str]:
    if layout != "metadata":
        return {}
    config = {"format_version": "1.0", "layers": {layer: {"format": quantization.format} for layer in layers}}
    return {"_quantization_metadata": json.dumps(config)}


def write_comfy_quant(path: Path, plan: ComfyQuantPlan, on_tensor: Callable[[str, int], None] | None = None) -> int:
    """Stream the plan into one safetensors file; returns the bytes of tensor data written. On any error (a bad
    value names its tensor: a ``CogExportError``) the partial file is removed and the error raised."""
    path = Path(path)
    try:
        return write_safetensors(path, plan.tensors, plan.metadata or None, on_tensor)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
