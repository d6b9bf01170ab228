"""LyCORIS's two adapters that are not LoRA, as LyCORIS (lycoris/modules/lokr.py, loha.py), PEFT (tuners/lokr,
tuners/loha), ComfyUI (comfy/weight_adapter/lokr.py, loha.py), musubi-tuner (networks/lokr.py, loha.py) and
ai-toolkit (toolkit/models/lokr.py) compute them, for a linear layer's weight [out, in]:

- LoKr: delta = kron(w1, w2) * scale, each factor whole (w1, w2) or a low-rank product (w1_a @ w1_b, w2_a @ w2_b);
  w1 is [a, c] and w2 [b, d] with out = a * b, in = c * d.
- LoHa: delta = ((w1_a @ w1_b) * (w2_a @ w2_b)) * scale, the two products elementwise; w?_a [out, r], w?_b [r, in].

Every one of them builds the factor products first, multiplies by the scale last and then adds the delta to the
weight, in float32 here as in their merges; so does cogexport. The scale is alpha over the rank of a low-rank
factor (LoKr: w2_b's, else w1_b's; LoHa: w1_b's). A LoKr whose factors are both whole has no such rank: LyCORIS,
ComfyUI and ai-toolkit then ignore alpha (scale 1; ai-toolkit's full-rank LoKr records alpha 9999999999 there),
musubi-tuner divides alpha by the larger side of w2, PEFT by its config's r. Tucker cores (lokr_t2, hada_t1/t2)
exist only for convolutions, which cogexport's LoRA support does not adapt.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from ..errors import CogExportError
from ..lazy import LazyTensor
from .parts import (HADA_T1, HADA_T2, HADA_W1_A, HADA_W1_B, HADA_W2_A, HADA_W2_B, LOHA, LOKR, LOKR_PARTS, LOKR_T2,
                    LOKR_W1, LOKR_W1_A, LOKR_W1_B, LOKR_W2, LOKR_W2_A, LOKR_W2_B)

Factors = Mapping[str, LazyTensor]


def kind_of(factors: Factors) -> str | None:
    kinds = {LOKR if part in LOKR_PARTS else LOHA for part in factors}
    if len(kinds) > 1:
        raise ValueError("LoKr and LoHa factors in one module")
    return kinds.pop() if kinds else None


def _half(factors: Factors, whole: str, a: str, b: str) -> tuple[int, int] | None:
    """The [rows, columns] of one LoKr factor, whole or as a product."""
    if whole in factors:
        return tuple(factors[whole].shape)
    if a in factors and b in factors:
        return factors[a].shape[0], factors[b].shape[1]
    return None


def lokr_halves(factors: Factors) -> tuple[tuple[int, int], tuple[int, int]]:
    return _half(factors, LOKR_W1, LOKR_W1_A, LOKR_W1_B), _half(factors, LOKR_W2, LOKR_W2_A, LOKR_W2_B)


def factor_rank(factors: Factors) -> int | None:
    """The rank alpha is divided by: that of the low-rank factor (None for a LoKr whose factors are both whole)."""
    if HADA_W1_B in factors:
        return factors[HADA_W1_B].shape[0]
    for b in (LOKR_W2_B, LOKR_W1_B):
        if b in factors:
            return factors[b].shape[0]
    return None


def delta_shape(factors: Factors) -> tuple[int, int]:
    """The [out, in] of the weight the factors change."""
    if kind_of(factors) == LOHA:
        return factors[HADA_W1_A].shape[0], factors[HADA_W1_B].shape[1]
    (a, c), (b, d) = lokr_halves(factors)
    return a * b, c * d


def check_factors(factors: Factors, name: str, where: str) -> None:
    """Complete, of matching shapes, and for a linear layer; one line naming what is wrong otherwise."""
    kind = kind_of(factors)
    tucker = [part for part in (LOKR_T2, HADA_T1, HADA_T2) if part in factors]
    if tucker or any(len(t.shape) != 2 for t in factors.values()):
        what = tucker[0] if tucker else "kernel dimensions"
        raise CogExportError(f"{where}: {name} is a {kind} adapter of a convolution ({what}): not read; cogexport "
                             "reads LoKr / LoHa adapters of linear layers")
    if kind == LOHA:
        _check_loha(factors, name, where)
    else:
        _check_lokr(factors, name, where)


def _check_loha(factors: Factors, name: str, where: str) -> None:
    missing = [part for part in (HADA_W1_A, HADA_W1_B, HADA_W2_A, HADA_W2_B) if part not in factors]
    if missing:
        raise CogExportError(f"{where}: the LoHa adapter of {name} has no {', '.join(missing)}")
    w1a, w1b, w2a, w2b = (factors[p].shape for p in (HADA_W1_A, HADA_W1_B, HADA_W2_A, HADA_W2_B))
    if w1a[1] != w1b[0] or w2a[1] != w2b[0] or w1a[0] != w2a[0] or w1b[1] != w2b[1] or w1b[0] != w2b[0]:
        raise CogExportError(f"{where}: the LoHa factors of {name} do not fit together: hada_w1_a {tuple(w1a)}, "
                             f"hada_w1_b {tuple(w1b)}, hada_w2_a {tuple(w2a)}, hada_w2_b {tuple(w2b)}")


def _check_lokr(factors: Factors, name: str, where: str) -> None:
    for number, (whole, a, b) in enumerate(((LOKR_W1, LOKR_W1_A, LOKR_W1_B), (LOKR_W2, LOKR_W2_A, LOKR_W2_B)), 1):
        present = [part for part in (whole, a, b) if part in factors]
        if present not in ([whole], [a, b]):
            raise CogExportError(f"{where}: the LoKr adapter of {name} has {', '.join(present) or 'nothing'} for its "
                                 f"factor {number}; it needs lokr_w{number}, or lokr_w{number}_a and lokr_w{number}_b")
        if a in factors and factors[a].shape[1] != factors[b].shape[0]:
            raise CogExportError(f"{where}: the ranks of {name}'s {a} {tuple(factors[a].shape)} and {b} "
                                 f"{tuple(factors[b].shape)} differ")


def delta(factors: Factors, scale: float) -> torch.Tensor:
    """The weight's change in float32, in the operation order of the trainers' own merges."""
    loaded = {part: tensor.load().float() for part, tensor in factors.items()}
    if kind_of(factors) == LOHA:
        product = (loaded[HADA_W1_A] @ loaded[HADA_W1_B]) * (loaded[HADA_W2_A] @ loaded[HADA_W2_B])
        return product * scale
    w1 = loaded[LOKR_W1] if LOKR_W1 in loaded else loaded[LOKR_W1_A] @ loaded[LOKR_W1_B]
    w2 = loaded[LOKR_W2] if LOKR_W2 in loaded else loaded[LOKR_W2_A] @ loaded[LOKR_W2_B]
    return torch.kron(w1, w2) * scale


# -- the factorisation LyCORIS and PEFT shape LoKr factors by -------------------------------------------------------
def factorization(dimension: int, factor: int = -1, smaller_first: bool = False) -> tuple[int, int]:
    """The two factors LyCORIS and PEFT split a dimension into: ``factor`` and its cofactor when ``factor`` divides it
    (PEFT keeps them in that order, LyCORIS puts the smaller first: ``smaller_first``), else the most balanced pair
    whose smaller side is at most ``factor`` (any, for -1), smaller first."""
    if factor > 0 and dimension % factor == 0:
        pair = (factor, dimension // factor)
        return tuple(sorted(pair)) if smaller_first else pair
    limit = dimension if factor == -1 else factor
    best = (1, dimension)
    for small in range(2, math.isqrt(dimension) + 1):
        if small > limit:
            break
        if dimension % small == 0:
            best = (small, dimension // small)
    return best


def fits_factorization(out: int, inp: int, halves: tuple[tuple[int, int], tuple[int, int]], factor: int) -> bool:
    """Whether PEFT, given this decompose factor, makes w1 and w2 of these shapes."""
    (a, c), (b, d) = halves
    return factorization(out, factor) == (a, b) and factorization(inp, factor) == (c, d)
