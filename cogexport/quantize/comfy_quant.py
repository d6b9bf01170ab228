"""ComfyUI's quantized weight formats (``--to comfyui --quant``), as a registry: one ``ComfyQuantization`` per
``--quant`` choice, declared in the module of its quantizer (fp8.py, nvfp4.py, mxfp8.py, int8.py) and listed in
``BUILT_IN``. The writer (write/comfy_quant_file.py), the reader (checkpoint/comfy_quant.py) and verify's check
(check.py) read the declaration and never name a format.

A quantized layer ``L`` stores its weight as ``L.weight`` in the format's storage type beside the format's scales
(``L.weight_scale``, ...), and is marked by a ``comfy_quant`` config naming the format, as ComfyUI's loader reads it
(comfy/ops.py ``_load_quantized_module``, comfy/quant_ops.py ``QUANT_ALGOS``). The bytes of each format are those
of comfy-kitchen's eager (CPU) quantizers, which ComfyUI calls: cogexport's own quantizers, compared with
comfy-kitchen's bit for bit by the tests.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Callable, Iterator, Mapping

import torch

from ..errors import CogExportError, quoted
from ..finite_values import NonfiniteValuesError, count_nonfinite

# The modules declaring the formats (each its QUANTIZATIONS), in --quant's order.
BUILT_IN = ("cogexport.quantize.fp8", "cogexport.quantize.nvfp4", "cogexport.quantize.mxfp8",
            "cogexport.quantize.int8")
# Values quantized at once: bounds a quantizer's float32 temporaries to a few MB whatever the weight's size.
CHUNK_VALUES = 1 << 17


@dataclass(frozen=True)
class LayerPart:
    """One tensor a quantized layer stores: ``weight`` itself or one of its scales."""

    name: str  # after the layer's name: "weight", "weight_scale", "weight_scale_2"
    dtype: torch.dtype
    shape: Callable[[tuple[int, ...]], tuple[int, ...]]  # its shape, from the weight's
    make: Callable[[torch.Tensor, str], torch.Tensor]  # its values, from the source weight (and its name, for errors)


@dataclass(frozen=True)
class ComfyQuantization:
    """One ``--quant`` choice of ``--to comfyui``: what ``comfy_quant`` calls it, the tensors a layer stores, and how
    ComfyUI turns them back into the weight."""

    name: str  # the --quant value
    format: str  # comfy_quant's "format" (a key of ComfyUI's QUANT_ALGOS)
    file_tag: str  # what the file name says: <model>_<file_tag>.safetensors
    summary: str  # what a quantized layer holds, for the model card and inspect
    judge: str  # whose rule the bytes follow, for verify's report
    parts: tuple[LayerPart, ...]
    dequantize: Callable[[Mapping[str, torch.Tensor]], torch.Tensor]  # the parts by name -> the float32 weight
    block: int = 1  # a weight's rows and columns are multiples of this (a 2-D weight only, when over 1)
    packing: int = 1  # values one element of the stored weight holds (two 4-bit codes a byte: 2)
    legacy: bool = False  # ComfyUI's older scaled_fp8 layout can mark it (float8_e4m3fn only)

    def unfit(self, shape: tuple[int, ...]) -> str | None:
        """Why a weight of ``shape`` is not stored in this format (None when it is): ComfyUI's quantizers would pad
        it, and the file would not say the shape it had."""
        if self.block == 1:
            return None
        if len(shape) != 2:
            return f"{len(shape)}-D: {self.name} stores 2-D weights"
        if shape[0] % self.block or shape[1] % self.block:
            return f"{shape[0]} x {shape[1]} is not a multiple of {self.block} both ways, as {self.name} blocks are"
        return None


def finite(weight: torch.Tensor, name: str) -> torch.Tensor:
    """``weight``, refused when it holds a NaN or an infinity, counted (``NonfiniteValuesError``): a format's scale
    is made from the weight's values, so none of them can store those, --allow-nonfinite or not."""
    count = count_nonfinite(weight)
    if count:
        raise NonfiniteValuesError(name, count, why_not="a quantized weight's scale is made from its values, so it "
                                   "cannot hold them")
    return weight


def row_chunks(weight: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, rows) of ``weight`` in chunks of about CHUNK_VALUES values: what a quantizer works on at once."""
    step = max(1, CHUNK_VALUES // max(1, weight.shape[-1]))
    for start in range(0, weight.shape[0], step):
        yield start, weight[start:start + step]


@cache
def comfy_quantizations() -> tuple[ComfyQuantization, ...]:
    """Every format, in --quant's order."""
    return tuple(q for module in BUILT_IN for q in importlib.import_module(module).QUANTIZATIONS)


def comfy_quantization(name: str) -> ComfyQuantization:
    """The format ``--quant name`` chooses."""
    for quantization in comfy_quantizations():
        if quantization.name == name.lower():
            return quantization
    raise CogExportError(f"--quant {quoted(name)} is not one of {', '.join(q.name for q in comfy_quantizations())}")


def by_format(format_name: str) -> ComfyQuantization | None:
    """The format a ``comfy_quant`` config names (None for one cogexport does not read)."""
    return next((q for q in comfy_quantizations() if q.format == format_name), None)
