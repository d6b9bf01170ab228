"""The float types and llama.cpp's 32-value block types (Q8_0, Q5_1, Q5_0, Q4_1, Q4_0), in torch.

Each function takes float32 blocks, shape (blocks, 32) (any row count for the float types), and returns the stored
bytes, shape (blocks, bytes per block). The arithmetic is the reference's, operation for operation in float32 (the
``gguf`` package's numpy quantizers, which match ggml's ``quantize_row_*_ref``), so the bytes are identical: a
division stays a division (never a multiplication by a reciprocal), and roundings are the reference's own
(truncation after adding one half, or half away from zero for Q8_0).
"""

from __future__ import annotations

import torch


def inverse(d: torch.Tensor) -> torch.Tensor:
    """1/d where d is not zero, else 0 (the reference's ``id``), as a true float32 division."""
    return torch.where(d == 0, torch.zeros_like(d), torch.ones_like(d) / d)


def divided(numerator: float, denominator: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` elementwise as one float32 division (a Python scalar on the left would become
    a reciprocal and a multiplication: two roundings)."""
    return torch.full_like(denominator, numerator) / denominator


def half_bytes(values: torch.Tensor) -> torch.Tensor:
    """float32 (blocks, 1) -> their float16 bytes (blocks, 2), little-endian, rounded to nearest even."""
    return values.to(torch.float16).view(torch.uint8)


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """(blocks, 32) values < 16 -> 16 bytes: value j in the low half of byte j, value j + 16 in the high half."""
    return q[:, :16] | (q[:, 16:] << 4)


def _high_bits(q: torch.Tensor) -> torch.Tensor:
    """Bit 4 of each of 32 values, packed little-endian into 4 bytes (value j -> bit j)."""
    bits = ((q >> 4) & 1).reshape(-1, 4, 8).to(torch.int32)
    weights = torch.tensor([1 << b for b in range(8)], dtype=torch.int32)
    return (bits * weights).sum(-1).to(torch.uint8)


def _absmax_signed(blocks: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude in each block, sign kept (the first one on a tie)."""
    return blocks.gather(1, blocks.abs().argmax(dim=1, keepdim=True))


def _truncated(values: torch.Tensor, top: int) -> torch.Tensor:
    return torch.trunc(values).to(torch.uint8).clamp(0, top)


def quantize_f32(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float32).contiguous().view(torch.uint8)


def quantize_f16(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float16).contiguous().view(torch.uint8)


def quantize_bf16(values: torch.Tensor) -> torch.Tensor:
    # torch rounds to nearest even like ggml's fp32 -> bf16; NaN never reaches here (the rows are checked first)
    return values.to(torch.bfloat16).contiguous().view(torch.uint8)


# The float32 just below one half. For every |v| < 256, v + copysign(it, v) truncated toward zero is C's roundf(v)
# (half away from zero; checked for every such float32): adding 0.5 itself would round 0.49999997 + 0.5 up to 1.
# Q8_0's scaled values lie within about 127. Two passes and the cast, where the gguf package's floor(2 * fraction)
# way takes eight.
_BELOW_HALF = torch.tensor(0.5 - 2.0 ** -25, dtype=torch.float32)


def quantize_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    scaled = blocks * inverse(d)
    scaled.add_(torch.copysign(_BELOW_HALF, scaled))
    out = torch.empty(blocks.shape[0], 34, dtype=torch.uint8)
    out[:, :2] = half_bytes(d)
    out[:, 2:].view(torch.int8).copy_(scaled)  # a float's cast to an integer truncates toward zero
    return out


def quantize_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _absmax_signed(blocks) / -8
    q = _truncated(blocks * inverse(d) + 8.5, 15)
    return torch.cat([half_bytes(d), _nibbles(q)], dim=1)


def quantize_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    low = blocks.amin(dim=1, keepdim=True)
    d = (blocks.amax(dim=1, keepdim=True) - low) / 15
    q = _truncated((blocks - low) * inverse(d) + 0.5, 15)
    return torch.cat([half_bytes(d), half_bytes(low), _nibbles(q)], dim=1)


def quantize_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _absmax_signed(blocks) / -16
    q = _truncated(blocks * inverse(d) + 16.5, 31)
    return torch.cat([half_bytes(d), _high_bits(q), _nibbles(q & 0x0F)], dim=1)


def quantize_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    low = blocks.amin(dim=1, keepdim=True)
    d = (blocks.amax(dim=1, keepdim=True) - low) / 31
    q = _truncated((blocks - low) * inverse(d) + 0.5, 31)
    return torch.cat([half_bytes(d), half_bytes(low), _high_bits(q), _nibbles(q & 0x0F)], dim=1)
