"""llama.cpp's K types (Q6_K, Q5_K, Q4_K) by its reference algorithm (``quantize_row_q*_K_ref``, no importance
matrix: what ``llama-quantize`` runs without ``--imatrix``), vectorised in torch over every block of a chunk.

The reference decides between candidate scales by comparing float32 sums accumulated one value at a time, so the
sums here are accumulated the same way (``index_add_`` onto a zero row: one float32 addition per value of a group,
in order, vectorised across groups; never a pairwise ``sum``) and every expression keeps the C code's order of
operations (only the factors of a product are ever swapped, which is exact). ``nearest_int`` is the reference's
own bit trick; inside the candidate searches ``torch.round`` stands in for it where its argument is known to lie in
the range in which the trick is plain round-half-to-even (one pass instead of three). A search keeps, per group,
only what gives its best candidate's levels (the inverse scale, and the min for Q4_K and Q5_K), and rebuilds the
levels from it only where the stored scale turns out to be 0 (elsewhere every value is quantized again with the
stored scales, as the reference does).

Q6_K's search (make_qx_quants) tries candidates that do not depend on one another, so it sums every candidate first
and chooses afterwards, in numpy: torch's comparisons and ``where`` cost several times its arithmetic, and a choice
that differs from group to group is best made without a branch (an integer mask blends the kept candidate's bits).
Q4_K's and Q5_K's (make_qkx2_quants) carry the kept min into the next candidate, so they choose at every step.

Each function takes float32 super-blocks, shape (blocks, 256), and returns their bytes. Inside, a chunk's groups
are laid out (values of a group, groups): value i of every group in row i, so that each step of a sum is one
contiguous row. The work is a few dozen passes over arrays of the chunk's size per candidate, so the chunk should
stay small enough for them to fit in the CPU's cache (see ``rows.CHUNK_VALUES``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import numpy as np
import torch

from .legacy import divided

QK_K = 256
_EPS = 1e-15  # the reference's GROUP_MAX_EPS: a group whose largest magnitude is below it counts as all zero
# nearest_int's trick (adding 1.5 * 2^23) rounds half to even while |v| <= 2^22 - 1 (the bound the reference
# asserts); past it the C result is whatever the mantissa bits say, which only the trick itself reproduces
_TRICK_LIMIT = 4194303.0


def nearest_int(values: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """ggml's nearest_int: round half to even through the float32 mantissa (int32 result); ``in_place``: in the
    memory of ``values`` (a temporary), which it overwrites."""
    shifted = (values.add_(12582912.0) if in_place else values + 12582912.0).view(torch.int32)
    return shifted.bitwise_and_(0x007FFFFF).sub_(0x00400000)


def sqrt_f32(values: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root (C's sqrtf). torch's vectorised float32 sqrt can be one unit in
    the last place off on some CPUs (seen with AVX-512), which changes the reference's choices; numpy's is exact."""
    return torch.from_numpy(np.sqrt(values.numpy()))


def _f32(value: float) -> np.float32:
    return np.float32(value)


@lru_cache(maxsize=8)
def _first_row(count: int) -> torch.Tensor:
    return torch.zeros(count, dtype=torch.long)


def _row_sums(terms: torch.Tensor, from_zero: bool = True, into: torch.Tensor | None = None) -> torch.Tensor:
    """The sum over dim 0 of ``terms`` in row order, one float32 addition at a time (the reference's loop over the
    values of a group), for every other index at once; ``from_zero``: the C sum starts at 0 (else at row 0);
    ``into``: a (1, ...) tensor to hold it. ``index_add_`` adds the rows onto its target one after another in
    index order: a loop in C++, one call instead of one per row (but slow on a source whose rows are not
    contiguous)."""
    if from_zero:
        total = terms.new_zeros((1,) + terms.shape[1:]) if into is None else into.zero_()
        return total.index_add_(0, _first_row(terms.shape[0]), terms)[0]
    return terms[:1].clone().index_add_(0, _first_row(terms.shape[0] - 1), terms[1:])[0]


def _weighted_error(w: torch.Tensor, scale: torch.Tensor, levels: torch.Tensor, low: torch.Tensor,
                    x: torch.Tensor, work: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
    """The sum over a group of w * (scale * level + min - x)^2, in the reference's order (``work``: scratch;
    ``into``: as for _row_sums)."""
    diff = torch.mul(levels, scale, out=work).add_(low).sub_(x)
    return _row_sums(diff.mul_(diff).mul_(w), into=into)


class _Qkx2Search:
    """make_qkx2_quants's search for every group at once: what no candidate changes, scratch buffers allocated once
    (not per candidate), and the steps of the search. ``x`` and ``w`` are (n, groups). The running choice is one
    (5, groups) tensor, updated in one ``where`` per candidate: its rows are the error, the scale, the min, and
    the inverse scale and min whose levels are the choice's."""

    def __init__(self, x: torch.Tensor, w: torch.Tensor, nmax: int, factors: list[float]):
        self.x, self.w, self.nmax = x, w, nmax
        self.data_low, high = x.amin(0), x.amax(0)
        self.zeros = torch.zeros_like(high)
        self.low = torch.where(self.data_low > 0, self.zeros, self.data_low)
        # a group whose max equals its (clipped) min returns at once in the reference (levels 0, scale 0); here
        # it searches a harmless span of 1 instead (no infinities): its levels stay 0 and no candidate wins
        self.flat = high == self.low
        self.high = torch.where(self.flat, self.low + 1, high)
        self.sum_w, self.sum_x = _row_sums(w, from_zero=False), _row_sums(w * x, from_zero=False)
        # each candidate's numerator of its inverse scale, one row per candidate (a true float32 division by span)
        self.factors = torch.tensor(factors, dtype=torch.float32)[:, None].repeat(1, x.shape[1]).unbind(0)
        self.trial = torch.empty_like(x)
        self.products = x.new_empty((3,) + x.shape)  # w*l, w*l*l, w*l*x: each (n, groups) contiguous
        self.moments = x.new_empty((3, 1, x.shape[1]))  # their sums over a group
        self.proposal = x.new_empty((5, x.shape[1]))  # a candidate, row for row like the choice
        # the rows of these as views, taken once (each indexing is a call of its own, in every step)
        self.product_rows, self.moment_rows = self.products.unbind(0), self.moments[:, 0].unbind(0)
        self.proposal_rows, self.error_row = self.proposal.unbind(0), self.proposal[:1]
        self.work = self.product_rows[0]  # free again once the products are summed

    def levels(self, iscale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        """clamp(nearest_int(iscale * (x - low)), 0, nmax) as floats, in ``self.trial``. iscale * (x - low) is
        monotonic in x, so its extremes are at the group's min and max; at the max it is about the candidate's
        factor (iscale = factor / (max - low)) when iscale is finite. So when it is within the trick's range at
        every group's min (neither too large, nor NaN as with an infinite iscale), one ``round`` does the same."""
        reach = torch.sub(self.data_low, low).mul_(iscale).abs_().max().item()
        scaled = torch.sub(self.x, low, out=self.trial).mul_(iscale)
        if reach <= _TRICK_LIMIT:
            scaled.round_()
        else:
            scaled.copy_(nearest_int(scaled))
        return scaled.clamp_(0, self.nmax)

    def fit(self, levels: torch.Tensor, scale_into: torch.Tensor, min_into: torch.Tensor) -> torch.Tensor:
        """The least-squares scale and min for ``levels``, written into ``scale_into`` and ``min_into`` (the min
        clipped at 0, as the reference does); returns the determinant, which says whether the fit exists."""
        wl = torch.mul(self.w, levels, out=self.product_rows[0])
        torch.mul(wl, levels, out=self.product_rows[1])
        torch.mul(wl, self.x, out=self.product_rows[2])
        self.moments.zero_().index_add_(1, _first_row(levels.shape[0]), self.products)
        sum_l, sum_l2, sum_xl = self.moment_rows
        det = self.sum_w * sum_l2 - sum_l * sum_l
        scale = (self.sum_w * sum_xl - self.sum_x * sum_l) / det
        low = (sum_l2 * self.sum_x - sum_l * sum_xl) / det
        clipped = low > self.zeros
        torch.where(clipped, sum_xl / sum_l2, scale, out=scale_into)
        torch.where(clipped, self.zeros, low, out=min_into)
        return det

    def start(self) -> torch.Tensor:
        """The choice before any candidate: the reference's first guess, inverse scale nmax / (max - min)."""
        iscale = divided(self.nmax, self.high - self.low)
        scale = torch.ones_like(iscale) / iscale
        error = _weighted_error(self.w, scale, self.levels(iscale, self.low), self.low, self.x, self.work)
        return torch.stack([error, scale, self.low, iscale, self.low])

    def step(self, choice: torch.Tensor, step: int) -> torch.Tensor:
        """The choice after candidate ``step``: inverse scale (rmin + rdelta * step + nmax) / (max - min)."""
        low, (_, scale, this_min, iscale, tried_low) = choice[2], self.proposal_rows
        torch.div(self.factors[step], self.high - low, out=iscale)
        trial = self.levels(iscale, low)
        det = self.fit(trial, scale, this_min)
        error = _weighted_error(self.w, scale, trial, this_min, self.x, self.work, into=self.error_row)
        tried_low.copy_(low)
        better = (det > self.zeros) & (error < choice[0])
        return torch.where(better, self.proposal, choice)


def make_qkx2_quants(x: torch.Tensor, w: torch.Tensor, nmax: int, rmin: float, rdelta: float, nstep: int):
    """The reference's make_qkx2_quants (squared error, use_mad false) for every group at once: the scale and the
    min to subtract (groups), and a function that rebuilds the chosen levels (n, groups)."""
    factors = [float(_f32(rmin) + _f32(rdelta) * _f32(step) + _f32(nmax)) for step in range(nstep + 1)]
    search = _Qkx2Search(x, w, nmax, factors)
    choice = search.start()
    for step in range(nstep + 1):
        choice = search.step(choice, step)
    _, scale, low, chosen_iscale, chosen_low = choice
    scale = torch.where(search.flat, search.zeros, scale)
    return scale, -low, lambda: nearest_int((x - chosen_low).mul_(chosen_iscale), in_place=True).clamp_(0, nmax)


def _positive_max(values: torch.Tensor) -> torch.Tensor:
    """Over rows: the reference's running "if (v > best) best = v" from 0, i.e. the max, or +0 if none is > 0."""
    highest = values.amax(0)
    return torch.where(highest > 0, highest, torch.zeros_like(highest))


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


def _requantized(levels: torch.Tensor, d: torch.Tensor, search_levels: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The reference skips re-quantizing a group whose stored scale ``d`` is 0 and keeps its search's levels."""
    skipped = d == 0
    if bool(skipped.any()):
        return torch.where(skipped, search_levels(), levels)
    return levels


def _k_levels(blocks: torch.Tensor, nmax: int, rmin: float, rdelta: float, nstep: int):
    """The part Q4_K and Q5_K share: per 32-value group the weighted scale/min search, the 6-bit scales and mins
    of each super-block, then every value re-quantized with the rounded scales. Returns (levels (32, groups) int32,
    d and dmin bytes (blocks, 2 each), packed scales (blocks, 12))."""
    count = blocks.shape[0]
    groups = blocks.reshape(count * 8, 32).T.contiguous()  # (32, groups): value i of every group in row i
    average = sqrt_f32(_row_sums(groups * groups) / 32)
    weights = groups.abs().add_(average)
    scales, mins, search_levels = make_qkx2_quants(groups, weights, nmax, rmin, rdelta, nstep)
    scales, mins = scales.reshape(count, 8).T, mins.reshape(count, 8).T
    max_scale, max_min = _positive_max(scales), _positive_max(mins)
    inv_scale = torch.where(max_scale > 0, divided(63.0, max_scale), torch.zeros_like(max_scale))
    inv_min = torch.where(max_min > 0, divided(63.0, max_min), torch.zeros_like(max_min))
    ls = _byte(nearest_int(inv_scale * scales)).clamp(max=63).T
    lm = _byte(nearest_int(inv_min * mins)).clamp(max=63).T
    d16 = (max_scale / 63).to(torch.float16)
    dmin16 = (max_min / 63).to(torch.float16)
    d = (d16.float()[:, None] * ls.float()).reshape(-1)  # (groups,) in group order
    dm = (dmin16.float()[:, None] * lm.float()).reshape(-1)
    levels = _requantized(nearest_int((groups + dm).div_(d), in_place=True).clamp_(0, nmax), d, search_levels)
    half = torch.stack([d16, dmin16], dim=1)[:, :, None].view(torch.uint8).reshape(count, 4)
    return levels, half, _pack_scales_mins(ls, lm)


def _k_planes(levels: torch.Tensor) -> torch.Tensor:
    """(32, groups) levels of Q4_K / Q5_K -> uint8 (2, blocks, 4, 32): [h, b, n, l] is value l of half h of the
    64-value chunk n of block b, so that each half is one contiguous plane in the order of the stored bytes."""
    return levels.to(torch.uint8).reshape(32, -1, 4, 2).permute(3, 1, 2, 0).contiguous()


def quantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    levels, half, scales = _k_levels(blocks, 15, -1.0, 0.1, 20)
    first, second = _k_planes(levels)  # each chunk: values 0-31 in low nibbles, 32-63 in high nibbles
    qs = (first | (second << 4)).reshape(-1, 128)
    return torch.cat([half, scales, qs], dim=1)


def quantize_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    levels, half, scales = _k_levels(blocks, 31, -0.5, 0.1, 15)
    planes = _k_planes(levels)
    qs = ((planes[0] & 0xF) | ((planes[1] & 0xF) << 4)).reshape(-1, 128)
    high = planes >> 4  # bit 4 of value l of half h of chunk n goes to bit 2n + h of qh[l]
    qh = high[0, :, 0].clone()
    for bit in range(1, 8):
        qh |= high[bit % 2, :, bit // 2] << bit
    return torch.cat([half, scales, qh, qs], dim=1)


def _signed_peak(x: torch.Tensor) -> torch.Tensor:
    """Over rows of (n, groups): the first value of largest magnitude (the reference's running "if (ax > amax)").
    From the column's max and min (fast reductions; argmax along rows is an order slower): the sign of max + min
    (exact: a float sum is 0 only for opposite values) says which is larger in magnitude, which avoids torch's
    comparisons and ``where`` (several times slower than its arithmetic). Where they tie in magnitude with
    opposite signs, the few columns go through argmax (the first maximal index)."""
    highest, lowest = x.amax(0), x.amin(0)
    balance = highest + lowest
    peak = torch.maximum(highest, lowest.neg()).copysign_(balance)
    tied = torch.from_numpy(np.flatnonzero((balance.numpy() == 0) & (highest.numpy() > 0)))
    if tied.numel():
        columns = x[:, tied]
        peak[tied] = columns.gather(0, columns.abs().argmax(dim=0, keepdim=True))[0]
    return peak


@lru_cache(maxsize=4)
def _qx_factors(nmax: int) -> torch.Tensor:
    """The numerators of make_qx_quants's inverse scales, in the order it tries them: -nmax first, then
    -(nmax + 0.1 * step) for step -9..-1 and 1..9, each computed in float32 as the C code does."""
    steps = [0] + [step for step in range(-9, 10) if step != 0]
    return torch.tensor([-(_f32(nmax) + _f32(0.1) * _f32(step)) for step in steps], dtype=torch.float32)


# Groups whose candidates one pass of _qx_sums tries: its few arrays (some 1.3 MB at 4096) then stay in a core's
# L2 cache while each candidate makes seven passes over them; per value, 4096 took 0.65x the time of 8192 and 2048
# the same as 4096 (measured on one core of a busy 2-core machine, CPU time)
_QX_SLICE_GROUPS = 4096


def _qx_sums(x: torch.Tensor, iscales: torch.Tensor, nmax: int) -> torch.Tensor:
    """For every candidate inverse scale (a row of ``iscales``, (candidates, groups)) and group: the reference's
    sum of w*x*l and sum of w*l*l (weights w = x^2) over the levels l = clamp(nearest_int(iscale * x), -nmax,
    nmax - 1), as (2, candidates, groups). The search's bulk: seven operations per candidate on a slice of the
    groups, none of them a comparison (torch's comparisons and ``where`` are several times slower than its
    arithmetic)."""
    weights = x * x
    factors = torch.stack([weights * x, weights])  # w*x*l multiplies w*x first, as the reference's expression
    sums = x.new_zeros((2, iscales.shape[0], 1, x.shape[1]))  # each candidate's sums a row of its own
    width = min(x.shape[1], _QX_SLICE_GROUPS)
    products = factors.new_empty((2, x.shape[0], width))
    for start in range(0, x.shape[1], width):
        end = min(start + width, x.shape[1])
        _qx_slice_sums(x[:, start:end], factors[..., start:end], iscales[:, start:end], sums[..., start:end],
                       products[..., :end - start], nmax)
    return sums[:, :, 0]


def _qx_slice_sums(x, factors, iscales, sums, products, nmax: int) -> None:
    """_qx_sums on one slice of the groups, into ``sums`` (2, candidates, 1, groups); ``products`` is scratch of
    the shape of ``factors``. The levels are made in the first product's place and multiplied there by w*x once
    w*l*l is made from them (one array fewer in the cache: 4-7% faster than a scratch array of their own)."""
    # every view the loop uses made once: each indexing is a Python call, as costly as an operation on the slice
    (weighted_x, weights), (first, second), first_row = factors.unbind(0), products.unbind(0), _first_row(x.shape[0])
    for iscale, into in zip(iscales.unbind(0), sums.unbind(1)):
        levels = torch.mul(x, iscale, out=first).round_().clamp_(-nmax, nmax - 1)
        torch.mul(weights, levels, out=second).mul_(levels)
        levels.mul_(weighted_x)  # l * (w*x): the same float32 product as (w*x) * l
        into.index_add_(1, first_row, products)


def _qx_choice(sum_lx: np.ndarray, sum_l2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidate make_qx_quants keeps for each group, and its scale, from every candidate's sum_lx and sum_l2
    (candidates, groups): the first one tried (scale sum_lx / sum_l2, or 0 if sum_l2 is 0), then each later one
    whose sum_l2 > 0 and sum_lx^2 > best * sum_l2 (scale sum_lx / sum_l2), best being the kept one's scale *
    sum_lx. In numpy, whose comparisons are fast, one candidate at a time on arrays small enough to stay in cache,
    and without a branch on the data (a random choice per group is what a CPU's branch predictor does worst): the
    kept candidate's best and index are blended in bit for bit through an integer mask."""
    count, groups = sum_lx.shape
    kept, offer, change = (np.empty((2, groups), dtype=np.int32) for _ in range(3))  # rows: best's bits, index
    square, product, better, mask = np.empty(groups, np.float32), np.empty(groups, np.float32), \
        np.empty(groups, bool), np.empty(groups, np.int32)
    best, offered_best = kept[0].view(np.float32), offer[0].view(np.float32)
    with np.errstate(all="ignore"):  # groups all below GROUP_MAX_EPS have NaN sums; they are overwritten later
        first = _qx_scale(sum_lx[0], sum_l2[0])
        np.multiply(first, sum_lx[0], out=best)
        kept[1] = 0
        for candidate in range(1, count):
            np.divide(sum_lx[candidate], sum_l2[candidate], out=offered_best)
            np.multiply(offered_best, sum_lx[candidate], out=offered_best)
            offer[1] = candidate
            np.multiply(sum_lx[candidate], sum_lx[candidate], out=square)
            np.multiply(best, sum_l2[candidate], out=product)
            np.logical_and(np.greater(square, product, out=better), sum_l2[candidate] > 0, out=better)
            np.negative(better.view(np.int8), dtype=np.int32, out=mask)
            np.bitwise_and(np.bitwise_xor(kept, offer, out=change), mask, out=change)
            kept ^= change
        chosen, columns = kept[1], np.arange(groups)
        return chosen, _qx_scale(sum_lx[chosen, columns], sum_l2[chosen, columns])


def _qx_scale(sum_lx: np.ndarray, sum_l2: np.ndarray) -> np.ndarray:
    """The reference's scale: sum_lx / sum_l2, or 0 where sum_l2 is 0."""
    scale = sum_lx / sum_l2
    scale[sum_l2 == 0] = 0
    return scale


def make_qx_quants(x: torch.Tensor, nmax: int):
    """The reference's make_qx_quants with rmse_type 1 and no importance weights (weights x^2), for every group at
    once; ``x`` is (n, groups). Returns the scale (groups) and a function that rebuilds the chosen levels, signed
    levels + nmax (n, groups).

    Every |x| is at most the group's peak magnitude, so |iscale * x| stays within about nmax + 1 and ``round`` is
    the reference's nearest_int here, except in groups below GROUP_MAX_EPS (even 0 or subnormal), which the
    reference skips and which are overwritten at the end."""
    peak = _signed_peak(x)
    iscales = _qx_factors(nmax)[:, None] / peak  # each a true float32 division, as the reference's
    sum_lx, sum_l2 = _qx_sums(x, iscales, nmax).numpy()
    chosen, scale = _qx_choice(sum_lx, sum_l2)
    zero = np.flatnonzero(np.abs(peak.numpy()) < _EPS)
    scale[zero] = 0

    def levels():
        chosen_iscale = iscales.numpy()[chosen, np.arange(chosen.size)]
        chosen_levels = nearest_int(x * torch.from_numpy(chosen_iscale), in_place=True).clamp_(-nmax, nmax - 1)
        chosen_levels[:, zero] = -nmax  # a zero group stores 0
        return chosen_levels + nmax

    return torch.from_numpy(scale), levels


def quantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    count = blocks.shape[0]
    groups = blocks.reshape(count * 16, 16).T.contiguous()  # (16, groups)
    scales, search_levels = make_qx_quants(groups, 32)
    scales = scales.reshape(count, 16).T  # (16, blocks)
    max_scale = _signed_peak(scales)
    iscale = divided(-128.0, max_scale)
    d16 = (torch.ones_like(iscale) / iscale).to(torch.float16)
    small = nearest_int(iscale * scales).clamp(max=127)
    small = ((small + 128) & 0xFF) - 128  # the int8 the reference stores
    d = (d16.float()[None, :] * small.float()).T  # (blocks, 16 groups)
    # every value again with the stored scales, in the blocks' own order (value 16 j + i of a block is value i of
    # its group j): nearest_int(x / d) clamped to [-32, 31], plus 32, as the trick's bits less (its offset - 32)
    shifted = (blocks.reshape(count, 16, 16) / d[:, :, None]).add_(12582912.0).view(torch.int32).bitwise_and_(0x7FFFFF)
    levels = shifted.sub_(0x00400000 - 32).clamp_(0, 63).view(count, 16, 16)
    skipped = torch.from_numpy(np.flatnonzero(d.reshape(-1).numpy() == 0))
    if skipped.numel():  # the reference keeps the search's levels where the stored scale is 0
        levels.view(-1, 16)[skipped] = search_levels()[:, skipped].T
    # value 128 h + 32 q + l (half h, quarter q) goes to the low nibble of ql[64 h + 32 (q % 2) + l] (the high one
    # for q >= 2) and to bits 2q, 2q + 1 of qh[32 h + l]
    quarters = levels.to(torch.uint8).view(count, 2, 4, 32)
    low, high = quarters & 0xF, quarters >> 4
    ql = (low[:, :, 0:2] | (low[:, :, 2:4] << 4)).reshape(count, 128)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(count, 64)
    out = torch.cat([ql, qh, small.T.to(torch.int8).view(torch.uint8), d16[:, None].view(torch.uint8)], dim=1)
    zero = np.flatnonzero(np.abs(max_scale.numpy()) < _EPS)
    if zero.size:  # blocks all below GROUP_MAX_EPS store zeros
        out[torch.from_numpy(zero)] = 0
    return out
