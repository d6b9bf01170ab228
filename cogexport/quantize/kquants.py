"""llama.cpp's K types (Q6_K, Q5_K, Q4_K) by its reference algorithm (``quantize_row_q*_K_ref``, no importance
matrix: what ``llama-quantize`` runs without ``--imatrix``), vectorised in torch over every block of a chunk.

The reference decides between candidate scales by comparing float32 sums accumulated one value at a time, so the
sums here are accumulated the same way (a loop over the values of a block, vectorised across blocks; never a
pairwise ``sum``) and every expression keeps the C code's order of operations. ``nearest_int`` is the reference's
own bit trick. Each function takes float32 super-blocks, shape (blocks, 256), and returns their bytes.
"""

from __future__ import annotations

import numpy as np
import torch

from .legacy import divided

QK_K = 256
_EPS = 1e-15  # the reference's GROUP_MAX_EPS: a group whose largest magnitude is below it counts as all zero


def nearest_int(values: torch.Tensor) -> torch.Tensor:
    """ggml's nearest_int: round half to even through the float32 mantissa (int32 result)."""
    shifted = (values + 12582912.0).view(torch.int32)
    return (shifted & 0x007FFFFF) - 0x00400000


def sqrt_f32(values: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root (C's sqrtf). torch's vectorised float32 sqrt can be one unit in
    the last place off on some CPUs (seen with AVX-512), which changes the reference's choices; numpy's is exact."""
    return torch.from_numpy(np.sqrt(values.numpy()))


def _f32(value: float) -> np.float32:
    return np.float32(value)


def _row_sums(terms: torch.Tensor, from_zero: bool = True) -> torch.Tensor:
    """The sum over dim 0 of ``terms`` in row order, one float32 addition at a time (the reference's loop over the
    values of a group), for every other index at once; ``from_zero``: the C sum starts at 0 (else at row 0)."""
    total = terms[0] + 0.0 if from_zero else terms[0].clone()
    for i in range(1, terms.shape[0]):
        total.add_(terms[i])
    return total


def _weighted_error(w: torch.Tensor, scale: torch.Tensor, levels: torch.Tensor, low: torch.Tensor,
                    x: torch.Tensor) -> torch.Tensor:
    """The sum over a group of w * (scale * level + min - x)^2, in the reference's order."""
    diff = scale * levels + low - x
    return _row_sums(w * (diff * diff))


def _scale_search_start(x: torch.Tensor, w: torch.Tensor, nmax: int):
    """make_qkx2_quants up to its search: the range, the weighted sums and the first guess and its error.
    ``x`` and ``w`` are (n, groups): value i of every group in row i."""
    low, high = x.amin(0), x.amax(0)
    sum_w = _row_sums(w, from_zero=False)
    sum_x = _row_sums(w * x, from_zero=False)
    low = torch.where(low > 0, torch.zeros_like(low), low)
    iscale = divided(nmax, high - low)
    scale = torch.ones_like(iscale) / iscale
    levels = nearest_int(iscale * (x - low)).clamp(0, nmax)
    return low, high, sum_w, sum_x, levels, scale, _weighted_error(w, scale, levels, low, x)


def make_qkx2_quants(x: torch.Tensor, w: torch.Tensor, nmax: int, rmin: float, rdelta: float, nstep: int):
    """The reference's make_qkx2_quants (squared error, use_mad false) for every group at once: levels (n, groups),
    scale and the min to subtract (groups)."""
    low, high, sum_w, sum_x, levels, scale, best = _scale_search_start(x, w, nmax)
    clipped_low = low
    for step in range(nstep + 1):
        factor = _f32(rmin) + _f32(rdelta) * _f32(step) + _f32(nmax)
        iscale = divided(float(factor), high - low)
        trial = nearest_int(iscale * (x - low)).clamp(0, nmax)
        wl = w * trial
        sum_l, sum_l2, sum_xl = _row_sums(torch.stack([wl, wl * trial, wl * x], dim=1))
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        clipped = this_min > 0
        this_min = torch.where(clipped, torch.zeros_like(this_min), this_min)
        this_scale = torch.where(clipped, sum_xl / sum_l2, this_scale)
        error = _weighted_error(w, this_scale, trial, this_min, x)
        better = (det > 0) & (error < best)
        levels = torch.where(better, trial, levels)
        best = torch.where(better, error, best)
        scale = torch.where(better, this_scale, scale)
        low = torch.where(better, this_min, low)
    # a group whose max equals its (clipped) min returns at once in the reference: levels 0, scale 0
    flat = high == clipped_low
    levels = torch.where(flat, torch.zeros_like(levels), levels)
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    return levels, scale, -torch.where(flat, clipped_low, low)


def _first_max(values: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Over rows of (n, groups): the running "if (key > best) take it" of the reference, starting from 0."""
    best_key = torch.zeros_like(key[0])
    best_value = torch.zeros_like(values[0])
    for i in range(key.shape[0]):
        take = key[i] > best_key
        best_key = torch.where(take, key[i], best_key)
        best_value = torch.where(take, values[i], best_value)
    return best_value, best_key


def _byte(values: torch.Tensor) -> torch.Tensor:
    """An int converted to uint8 as C does (modulo 256)."""
    return values & 0xFF


def _pack_scales_mins(ls: torch.Tensor, lm: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and eight 6-bit mins (blocks, 8) -> the 12 bytes of block_q4_K / block_q5_K."""
    packed = torch.zeros(ls.shape[0], 12, dtype=torch.int32)
    packed[:, 0:4] = ls[:, 0:4]
    packed[:, 4:8] = lm[:, 0:4]
    packed[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    packed[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    packed[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    return packed.to(torch.uint8)


def _k_levels(blocks: torch.Tensor, nmax: int, rmin: float, rdelta: float, nstep: int):
    """The part Q4_K and Q5_K share: per 32-value group the weighted scale/min search, the 6-bit scales and mins
    of each super-block, then every value re-quantized with the rounded scales. Returns (levels (blocks, 256),
    d and dmin bytes (blocks, 2 each), packed scales (blocks, 12))."""
    count = blocks.shape[0]
    groups = blocks.reshape(count * 8, 32).T.contiguous()  # (32, groups): value i of every group in row i
    average = sqrt_f32(_row_sums(groups * groups) / 32)
    weights = average + groups.abs()
    levels, scales, mins = make_qkx2_quants(groups, weights, nmax, rmin, rdelta, nstep)
    scales, mins = scales.reshape(count, 8).T, mins.reshape(count, 8).T
    max_scale = _first_max(scales, scales)[0]
    max_min = _first_max(mins, mins)[0]
    inv_scale = torch.where(max_scale > 0, divided(63.0, max_scale), torch.zeros_like(max_scale))
    inv_min = torch.where(max_min > 0, divided(63.0, max_min), torch.zeros_like(max_min))
    ls = _byte(nearest_int(inv_scale * scales)).clamp(max=63).T
    lm = _byte(nearest_int(inv_min * mins)).clamp(max=63).T
    d16 = (max_scale / 63).to(torch.float16)
    dmin16 = (max_min / 63).to(torch.float16)
    d = (d16.float()[:, None] * ls.float()).reshape(-1)  # (groups,) in group order
    dm = (dmin16.float()[:, None] * lm.float()).reshape(-1)
    requantized = nearest_int((groups + dm) / d).clamp(0, nmax)
    levels = torch.where(d != 0, requantized, levels)
    half = torch.stack([d16, dmin16], dim=1)[:, :, None].view(torch.uint8).reshape(count, 4)
    return levels.T.reshape(count, QK_K), half, _pack_scales_mins(ls, lm)


def quantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    levels, half, scales = _k_levels(blocks, 15, -1.0, 0.1, 20)
    chunks = levels.reshape(-1, 4, 2, 32)  # four 64-value chunks: values 0-31 low nibbles, 32-63 high nibbles
    qs = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(-1, 128).to(torch.uint8)
    return torch.cat([half, scales, qs], dim=1)


def quantize_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    levels, half, scales = _k_levels(blocks, 31, -0.5, 0.1, 15)
    chunks = levels.reshape(-1, 4, 2, 32)
    qs = ((chunks[:, :, 0] & 0xF) | ((chunks[:, :, 1] & 0xF) << 4)).reshape(-1, 128).to(torch.uint8)
    # bit 4 of value j of chunk n goes to bit 2n of qh[j]; of value j + 32, to bit 2n + 1
    shifts = torch.arange(4, dtype=torch.int32).reshape(1, 4, 1, 1) * 2 + torch.tensor([0, 1]).reshape(1, 1, 2, 1)
    qh = (((chunks >> 4) & 1) << shifts).sum(dim=(1, 2)).to(torch.uint8)
    return torch.cat([half, scales, qh, qs], dim=1)


def make_qx_quants(x: torch.Tensor, nmax: int):
    """The reference's make_qx_quants with rmse_type 1 and no importance weights (weights x^2), for every group at
    once; ``x`` is (n, groups). Returns signed levels + nmax (n, groups) and the scale (groups)."""
    peak = x.gather(0, x.abs().argmax(dim=0, keepdim=True))[0]  # the first value of largest magnitude
    weights = x * x

    def fit(iscale):
        levels = nearest_int(iscale * x).clamp(-nmax, nmax - 1)
        sum_lx, sum_l2 = _row_sums(torch.stack([weights * x * levels, weights * levels * levels], dim=1))
        return levels, sum_lx, sum_l2

    levels, sum_lx, sum_l2 = fit(divided(-nmax, peak))
    scale = torch.where(sum_l2 != 0, sum_lx / sum_l2, torch.zeros_like(sum_l2))
    best = scale * sum_lx
    for step in [s for s in range(-9, 10) if s != 0]:
        factor = -(_f32(nmax) + _f32(0.1) * _f32(step))
        trial, sum_lx, sum_l2 = fit(divided(float(factor), peak))
        better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
        levels = torch.where(better, trial, levels)
        scale = torch.where(better, sum_lx / sum_l2, scale)
        best = torch.where(better, scale * sum_lx, best)
    zero = x.abs().amax(0) < _EPS
    levels = torch.where(zero, torch.full_like(levels, -nmax), levels)  # stored as 0 once nmax is added
    scale = torch.where(zero, torch.zeros_like(scale), scale)
    return levels + nmax, scale


def quantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    count = blocks.shape[0]
    groups = blocks.reshape(count * 16, 16).T.contiguous()  # (16, groups)
    levels, scales = make_qx_quants(groups, 32)
    scales = scales.reshape(count, 16).T  # (16, blocks)
    max_scale, max_abs = _first_max(scales, scales.abs())
    iscale = divided(-128.0, max_scale)
    d16 = (torch.ones_like(iscale) / iscale).to(torch.float16)
    small = nearest_int(iscale * scales).clamp(max=127)
    small = ((small + 128) & 0xFF) - 128  # the int8 the reference stores
    d = (d16.float()[None, :] * small.float()).T.reshape(-1)  # (groups,)
    requantized = nearest_int(groups / d).clamp(-32, 31) + 32
    levels = torch.where(d != 0, requantized, levels).T.reshape(count, 2, 4, 32)  # two halves of four 32-runs
    ql = ((levels[:, :, 0:2] & 0xF) | ((levels[:, :, 2:4] & 0xF) << 4)).reshape(count, 128)
    qh = ((levels >> 4) << (torch.arange(4, dtype=torch.int32).reshape(1, 1, 4, 1) * 2)).sum(dim=2)
    out = torch.cat([ql.to(torch.uint8), qh.reshape(count, 64).to(torch.uint8),
                     small.T.to(torch.int8).view(torch.uint8), d16[:, None].view(torch.uint8)], dim=1)
    zero_block = (max_abs < _EPS)[:, None]
    return torch.where(zero_block, torch.zeros_like(out), out)
