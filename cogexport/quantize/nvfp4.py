"""ComfyUI's ``nvfp4`` (``--quant nvfp4``): a layer's weight as 4-bit floats (E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
their negatives), a float8 e4m3fn scale per block of 16 values of a row and one float32 scale for the tensor, as
comfy-kitchen's eager ``quantize_nvfp4`` makes them for ComfyUI's TensorCoreNVFP4Layout:

- ``weight_scale_2`` (the tensor's scale): ``max|W| / (448 * 6)`` computed in the weight's own dtype, then float32;
- ``weight_scale`` (the block scales): ``max|block| / 6 / weight_scale_2`` (float32, in that order), clamped to 448
  and cast to float8 e4m3fn, stored in the tiled order of scale_tiles.py;
- ``weight``: each value divided by its block's ``weight_scale_2 * block scale`` (0 in a block whose scale is 0),
  clamped to [-6, 6] and rounded to the nearest E2M1 value (ties to the even code, the sign kept, -0 included), two
  codes a byte, the even-indexed value in the high half.

ComfyUI dequantizes each value as ``code value * (weight_scale_2 * block scale)``. Where comfy-kitchen's tensor scale
would be 0 (an all-zero weight, or one too small for the weight's dtype), it divides by that 0 and stores block scales
of 448 or NaN, which dequantize to zeros or NaN; here the tensor scale is 1 instead, so such a weight is stored as
zeros.
"""

from __future__ import annotations

from typing import Mapping

import torch

from .comfy_quant import ComfyQuantization, LayerPart, finite, row_chunks
from .scale_tiles import from_tiles, tiled_shape, to_tiles

BLOCK = 16
E2M1_MAX, E4M3_MAX = 6.0, 448.0
# The E2M1 magnitudes by code (the sign is the code's fourth bit), and the midpoints between neighbours: a midpoint
# goes to its even neighbour, which is the lower one at the even-indexed midpoints and the upper one at the others.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = torch.tensor([(a + b) / 2 for a, b in zip(E2M1_VALUES, E2M1_VALUES[1:])])
_TIES_UP = _MIDPOINTS[1::2]


def tensor_scale(weight: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """``weight_scale_2``: the float32 scale of the whole tensor (1 where comfy-kitchen's would be 0)."""
    scale = (finite(weight, name).abs().amax() / (E4M3_MAX * E2M1_MAX)).float().reshape(())
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _block_scales(rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float8 scales of the blocks of ``rows`` (rows x blocks), untiled."""
    peaks = rows.reshape(rows.shape[0], -1, BLOCK).abs().amax(-1).float()
    return (peaks / E2M1_MAX / scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def block_scales(weight: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """``weight_scale``: the block scales in the tiled order."""
    scale = tensor_scale(weight, name)
    return to_tiles(torch.cat([_block_scales(rows, scale) for _, rows in row_chunks(weight)]))


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """Float32 ``values`` within [-6, 6] as E2M1 codes (uint8, 0 to 15), rounded to nearest, ties to even."""
    magnitude = values.abs()
    codes = torch.bucketize(magnitude, _MIDPOINTS)  # how many midpoints lie below: the lower neighbour at a tie
    codes += torch.isin(magnitude, _TIES_UP)
    return (codes | (torch.signbit(values).to(torch.int64) << 3)).to(torch.uint8)


def packed_codes(weight: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """``weight``: the E2M1 codes of every value, two a byte (rows x columns / 2, uint8)."""
    scale = tensor_scale(weight, name)
    out = torch.empty(weight.shape[0], weight.shape[1] // 2, dtype=torch.uint8)
    for start, rows in row_chunks(weight):
        total = scale * _block_scales(rows, scale).float()
        blocks = rows.reshape(rows.shape[0], -1, BLOCK).float()
        scaled = torch.where(total[..., None] == 0, 0.0, blocks / total.where(total != 0, 1.0)[..., None])
        codes = e2m1_codes(scaled.clamp_(-E2M1_MAX, E2M1_MAX)).reshape(rows.shape[0], -1, 2)
        out[start:start + rows.shape[0]] = (codes[..., 0] << 4) | codes[..., 1]
    return out


def dequantize(parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The float32 weight: each code's value times its block's ``weight_scale_2 * block scale``."""
    packed = parts["weight"]
    rows, columns = packed.shape[0], packed.shape[1] * 2
    codes = torch.stack([packed >> 4, packed & 0x0F], dim=-1).reshape(rows, columns // BLOCK, BLOCK)
    values = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))[codes.long()]
    scales = from_tiles(parts["weight_scale"].view(torch.float8_e4m3fn), rows, columns // BLOCK).float()
    return (values * (parts["weight_scale_2"].float() * scales)[..., None]).reshape(rows, columns)


QUANTIZATIONS = (ComfyQuantization(
    name="nvfp4", format="nvfp4", file_tag="nvfp4",
    summary="NVFP4: 4-bit E2M1 values, a float8 scale per 16 and a float32 scale per tensor",
    judge="the rule of comfy-kitchen's quantize_nvfp4 (cogexport's quantizer)",
    parts=(LayerPart("weight", torch.uint8, lambda shape: (shape[0], shape[1] // 2), packed_codes),
           LayerPart("weight_scale", torch.float8_e4m3fn, lambda shape: tiled_shape(shape[0], shape[1] // BLOCK),
                     block_scales),
           LayerPart("weight_scale_2", torch.float32, lambda shape: (), tensor_scale)),
    dequantize=dequantize, block=BLOCK, packing=2),)
