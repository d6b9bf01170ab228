"""ComfyUI's ``mxfp8`` (``--quant mxfp8``): a layer's weight in float8 e4m3fn with a power-of-two scale per block of
32 values of a row (an E8M0 exponent byte: 2^(code - 127)), as comfy-kitchen's eager ``quantize_mxfp8`` makes them
for ComfyUI's TensorCoreMXFP8Layout:

- ``weight_scale``: per block, ``code = ceil(log2(max(max|block| / 448, 2^-127))) + 127`` clamped to [0, 254], with
  the logarithm taken in float32 as torch computes it (so a ratio just past a power of two may keep that power, and
  the values over 448 it leaves are clamped); 0 for an all-zero block; stored as bytes in the tiled order of
  scale_tiles.py;
- ``weight``: each value divided by its block's scale (float32), clamped to [-448, 448] and cast to float8 e4m3fn
  (round to nearest even); 0 in an all-zero block.

ComfyUI reads code 0 as a scale of 0, so a block of code 0 dequantizes to zeros; comfy-kitchen divides such a block
(one whose largest magnitude is at most 448 * 2^-127) by that 0 and stores 448s and NaNs, which dequantize to 0 and
NaN. Here such a block is stored as zeros, what ComfyUI makes of it.
"""

from __future__ import annotations

from typing import Mapping

import torch

from .comfy_quant import ComfyQuantization, LayerPart, finite, row_chunks
from .scale_tiles import from_tiles, tiled_shape, to_tiles

BLOCK = 32
E4M3_MAX = 448.0
EXPONENT_BIAS, LARGEST_CODE = 127, 254


def _block_codes(rows: torch.Tensor) -> torch.Tensor:
    """The E8M0 codes of the blocks of ``rows`` (rows x blocks, int32); 0 for an all-zero block."""
    peaks = rows.reshape(rows.shape[0], -1, BLOCK).abs().amax(-1).float()
    needed = (peaks / E4M3_MAX).clamp(min=2.0 ** -EXPONENT_BIAS)
    codes = (torch.ceil(torch.log2(needed)).to(torch.int32) + EXPONENT_BIAS).clamp(0, LARGEST_CODE)
    return torch.where(peaks == 0, 0, codes)


def scale_of_codes(codes: torch.Tensor) -> torch.Tensor:
    """The float32 scales E8M0 codes stand for, code 0 as 0 (as ComfyUI reads them)."""
    return (codes.to(torch.int32) << 23).view(torch.float32)


def block_scales(weight: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """``weight_scale``: the blocks' E8M0 codes (uint8) in the tiled order."""
    finite(weight, name)
    return to_tiles(torch.cat([_block_codes(rows) for _, rows in row_chunks(weight)]).to(torch.uint8))


def scaled_values(weight: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """``weight``: every value over its block's scale, in float8 e4m3fn."""
    finite(weight, name)
    out = torch.empty(weight.shape, dtype=torch.float8_e4m3fn)
    for start, rows in row_chunks(weight):
        scales = scale_of_codes(_block_codes(rows))[..., None]
        blocks = rows.reshape(rows.shape[0], -1, BLOCK).float()
        scaled = torch.where(scales == 0, 0.0, blocks / scales.where(scales != 0, 1.0))
        out[start:start + rows.shape[0]] = scaled.clamp_(-E4M3_MAX, E4M3_MAX).reshape(rows.shape)
    return out


def dequantize(parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The float32 weight: each value times its block's power of two."""
    values = parts["weight"].float()
    rows, columns = values.shape
    codes = from_tiles(parts["weight_scale"].view(torch.uint8), rows, columns // BLOCK)
    return (values.reshape(rows, -1, BLOCK) * scale_of_codes(codes)[..., None]).reshape(rows, columns)


QUANTIZATIONS = (ComfyQuantization(
    name="mxfp8", format="mxfp8", file_tag="mxfp8",
    summary="MXFP8: fp8 e4m3fn values with a power-of-two scale per 32",
    judge="the rule of comfy-kitchen's quantize_mxfp8 (cogexport's quantizer)",
    parts=(LayerPart("weight", torch.float8_e4m3fn, lambda shape: shape, scaled_values),
           LayerPart("weight_scale", torch.uint8, lambda shape: tiled_shape(shape[0], shape[1] // BLOCK),
                     block_scales)),
    dequantize=dequantize, block=BLOCK),)
