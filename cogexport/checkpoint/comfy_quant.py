"""ComfyUI's quantized safetensors read back as the weights they stand for, in any of ComfyUI's formats
(quantize/comfy_quant.py) and any of the ways a file marks its quantized layers: per-layer ``comfy_quant`` tensors,
the header's ``_quantization_metadata``, the legacy ``scaled_fp8`` marker (``scale_weight`` scales, every layer
float8_e4m3fn), or none at all for an fp8 weight beside its scale. Each quantized layer's weight is dequantized as
ComfyUI dequantizes it (the format's own rule); its scales and markers are left out. For ``inspect`` and ``verify``.
"""

from __future__ import annotations

import json
from typing import Mapping

import torch

from ..errors import CogExportError, quoted
from ..lazy import LazyTensor
from ..quantize.comfy_quant import ComfyQuantization, by_format, comfy_quantization, comfy_quantizations

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
LEGACY_MARKER = "scaled_fp8"
SCALE_NAMES = ("weight_scale", "scale_weight")  # a layer's scale, and its legacy name
_IGNORED = (".comfy_quant", ".input_scale", ".scale_input")  # what a quantized layer stores that no weight reads


def quantized_layers(tensors: Mapping[str, LazyTensor], metadata: Mapping[str, str]) -> dict[str, ComfyQuantization]:
    """layer -> its format, as the file marks it (empty for a file that is not ComfyUI's quantized safetensors)."""
    if "_quantization_metadata" in metadata:
        return {layer: _format(config, layer) for layer, config in _metadata_layers(metadata).items()}
    layers = {name[: -len(".comfy_quant")]: _format(_marker(tensor, name), name)
              for name, tensor in tensors.items() if name.endswith(".comfy_quant")}
    for name, tensor in tensors.items():  # the legacy layout, and fp8 weights beside their scales with no marker
        layer = name[: -len(".weight")]
        if name.endswith(".weight") and tensor.dtype in FP8_DTYPES and layer not in layers and _scale_of(layer, tensors):
            layers[layer] = comfy_quantization("fp8" if tensor.dtype == torch.float8_e4m3fn else "fp8_e5m2")
    return layers


def is_comfy_quantized(tensors: Mapping[str, LazyTensor], metadata: Mapping[str, str]) -> bool:
    return bool(quantized_layers(tensors, metadata))


def dequantized(tensors: Mapping[str, LazyTensor], metadata: Mapping[str, str]) -> dict[str, LazyTensor]:
    """Names -> each quantized layer's weight dequantized (float32), every other tensor as stored."""
    layers = quantized_layers(tensors, metadata)
    layer_of = {f"{layer}.{_stored_name(layer, part.name, tensors)}": layer
                for layer, quantization in layers.items() for part in quantization.parts}
    out: dict[str, LazyTensor] = {}
    for name, tensor in tensors.items():
        layer = layer_of.get(name)
        if layer is not None and name == f"{layer}.weight":
            out[name] = _dequantized_weight(layer, layers[layer], tensors)
        elif layer is None and name != LEGACY_MARKER and not name.endswith(_IGNORED):
            out[name] = tensor
    return out


def layer_parts(layer: str, quantization: ComfyQuantization, tensors: Mapping[str, LazyTensor]
                ) -> dict[str, LazyTensor]:
    """The tensors a quantized layer stores, by their part's name (``weight_scale`` for a legacy ``scale_weight``)."""
    return {part.name: tensors[f"{layer}.{_stored_name(layer, part.name, tensors)}"] for part in quantization.parts}


def _dequantized_weight(layer: str, quantization: ComfyQuantization, tensors: Mapping[str, LazyTensor]) -> LazyTensor:
    parts = layer_parts(layer, quantization, tensors)

    def load() -> torch.Tensor:
        return quantization.dequantize({name: tensor.load() for name, tensor in parts.items()})

    stored = tuple(parts["weight"].shape)
    shape = (*stored[:-1], stored[-1] * quantization.packing) if stored else stored
    return LazyTensor(torch.Size(shape), torch.float32, load,
                      f"{parts['weight'].origin} dequantized ({quantization.name})")


def _stored_name(layer: str, part: str, tensors: Mapping[str, LazyTensor]) -> str:
    """A part's name in the file: the scale may go by its legacy name; a missing part is refused in one line."""
    for name in (SCALE_NAMES if part == "weight_scale" else (part,)):
        if f"{layer}.{name}" in tensors:
            return name
    raise CogExportError(f"the quantized layer {quoted(layer)} has no {layer}.{part}: the file is not ComfyUI's "
                         "quantized layout")


def _scale_of(layer: str, tensors: Mapping[str, LazyTensor]) -> bool:
    return any(f"{layer}.{name}" in tensors for name in SCALE_NAMES)


def _marker(tensor: LazyTensor, name: str) -> dict:
    try:
        return json.loads(bytes(tensor.load().to(torch.uint8).tolist()).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise CogExportError(f"{quoted(name)} is not a JSON config: the file is not ComfyUI's quantized layout") \
            from None


def _metadata_layers(metadata: Mapping[str, str]) -> dict[str, dict]:
    try:
        layers = json.loads(metadata["_quantization_metadata"])["layers"]
    except (ValueError, KeyError, TypeError):
        layers = None
    if not isinstance(layers, dict):
        raise CogExportError("the header's _quantization_metadata names no layers: the file is not ComfyUI's "
                             "quantized layout")
    return layers


def _format(config: object, where: str) -> ComfyQuantization:
    found = by_format(config.get("format")) if isinstance(config, dict) else None
    if found is None:
        known = ", ".join(quantization.format for quantization in comfy_quantizations())
        raise CogExportError(f"{quoted(where)} is quantized as {quoted(config)}, which cogexport does not read (it "
                             f"reads {known})")
    return found
