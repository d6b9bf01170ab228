"""What PEFT's and LyCORIS's loaders make of LoKr / LoHa factors: both rebuild a module's factors from a few
settings (a rank, a decompose factor, whether both halves are low-rank) before they copy the file's tensors in, so a
module is written for them only when those settings give back exactly its shapes and its strength.

PEFT (tuners/lokr/layer.py update_layer, tuners/loha): w1 is low-rank when decompose_both and r < max(w1) / 2, w2
when r < max(w2) / 2, the shapes from factorization(dim, decompose_factor); the scale is alpha / r for every module.
LyCORIS (modules/lokr.py make_module_from_state_dict): the rank is w1_a's or w2_a's, the factor read back from w1's
shape, w2 low-rank when rank < max(w2) / 2 (w1 only when both are); a module of two whole factors is scaled by 1.
"""

from __future__ import annotations

import math
from typing import Mapping

from ..errors import CogExportError
from . import lycoris
from .adapter import LoraModule, anchored, target_modules
from .parts import LOHA, LOKR, LOKR_W1, LOKR_W1_A, LOKR_W2, LOKR_W2_A


def _exact_alpha(scale: float, rank: int) -> float | None:
    """An alpha that a loader dividing by ``rank`` turns back into exactly ``scale``, if there is one."""
    alpha = scale * rank
    return alpha if alpha / rank == scale else None


# -- PEFT ----------------------------------------------------------------------------------------------------------
def peft_config(modules: Mapping[str, LoraModule], schema: Mapping, where: str) -> dict:
    """PEFT LoKrConfig / LoHaConfig arguments that rebuild exactly these modules at exactly their strengths."""
    kinds = {module.kind for module in modules.values()}
    if len(kinds) != 1:
        raise CogExportError(f"{where}: PEFT adapters have one kind; this one mixes {', '.join(sorted(kinds))}; write "
                             "--lora-format comfyui or lycoris")
    kind = kinds.pop()
    config: dict = {}
    if kind == LOKR:
        factor = _decompose_factor(modules, where)
        both = any(LOKR_W1_A in m.factors for m in modules.values())
        config.update(decompose_factor=factor, decompose_both=both)
        settings = {name: _lokr_rank(name, m, both, where) for name, m in modules.items()}
    else:
        settings = {name: m.rank for name, m in modules.items()}
    ranks = {name: rank for name, rank in settings.items()}
    alphas = {}
    for name, rank in ranks.items():
        alpha = _exact_alpha(modules[name].scale(False), rank)
        if alpha is None:
            raise CogExportError(f"{where}: the strength of {name} ({modules[name].scale(False)!r}) is no alpha / r "
                                 "PEFT can apply exactly")
        alphas[name] = alpha
    r, alpha = _usual(ranks.values()), _usual(alphas.values())
    config.update(peft_type=kind.upper(), r=r, alpha=alpha, target_modules=target_modules(set(modules), schema),
                  rank_pattern=anchored({n: v for n, v in ranks.items() if v != r}, set(modules)),
                  alpha_pattern=anchored({n: v for n, v in alphas.items() if v != alpha}, set(modules)))
    return config


def _usual(values) -> object:
    values = list(values)
    return max(sorted(set(values)), key=values.count)


def _decompose_factor(modules: Mapping[str, LoraModule], where: str) -> int:
    """The one decompose_factor that makes PEFT shape every module's w1 and w2 as they are."""
    shapes = {name: (lycoris.delta_shape(m.factors), lycoris.lokr_halves(m.factors)) for name, m in modules.items()}
    candidates = [-1, *sorted({side for _, halves in shapes.values() for half in halves for side in half})]
    for factor in candidates:
        if all(lycoris.fits_factorization(out, inp, halves, factor) for (out, inp), halves in shapes.values()):
            return factor
    raise CogExportError(f"{where}: no one PEFT decompose_factor gives every LoKr module its w1 / w2 shapes (a "
                         "trainer that splits the dimensions its own way, such as musubi-tuner); write "
                         "--lora-format comfyui")


def _lokr_rank(name: str, module: LoraModule, both: bool, where: str) -> int:
    """The r PEFT needs to make this module's halves whole or low-rank as they are."""
    (a, c), (b, d) = lycoris.lokr_halves(module.factors)
    rank = module.rank
    w1_low, w2_low = LOKR_W1_A in module.factors, LOKR_W2_A in module.factors
    if rank is None:  # both whole: any r large enough that PEFT makes no half low-rank
        rank = max(math.ceil(max(b, d) / 2), math.ceil(max(a, c) / 2) if both else 1, 1)
    fits = (w2_low == (rank < max(b, d) / 2)) and (w1_low == (both and rank < max(a, c) / 2))
    if w1_low and w2_low and module.factors[LOKR_W1_A].shape[1] != module.factors[LOKR_W2_A].shape[1]:
        fits = False
    if not fits:
        raise CogExportError(f"{where}: PEFT's LoKr rebuilds {name}'s factors with other shapes than these (w1 "
                             f"{a}x{c}{' low-rank' if w1_low else ''}, w2 {b}x{d}{' low-rank' if w2_low else ''}, rank "
                             f"{module.rank}); write --lora-format comfyui")
    return rank


# -- LyCORIS -------------------------------------------------------------------------------------------------------
def lycoris_problem(name: str, module: LoraModule) -> str | None:
    """Why LyCORIS's loader would not rebuild this module's factors and strength as they are (None: it would)."""
    if module.kind == LOHA:
        return None
    out, inp = lycoris.delta_shape(module.factors)
    (a, c), (b, d) = lycoris.lokr_halves(module.factors)
    w1_low, w2_low = LOKR_W1_A in module.factors, LOKR_W2_A in module.factors
    rank = module.rank
    factor = _lycoris_factor(out, inp, (a, c), (b, d))
    (l_, k), (m, n) = lycoris.factorization(out, factor, True), lycoris.factorization(inp, factor, True)
    both = w1_low and w2_low
    if both and module.factors[LOKR_W1_A].shape[1] != module.factors[LOKR_W2_A].shape[1]:
        return f"{name}'s LoKr halves have different ranks; LyCORIS's loader gives both one"
    rebuilt_w1_low = both and rank is not None and rank < max(l_, m) / 2
    rebuilt_w2_low = rank is not None and rank < max(k, n) / 2
    if (l_, m, k, n) != (a, c, b, d) or (rebuilt_w1_low, rebuilt_w2_low) != (w1_low, w2_low):
        return (f"LyCORIS's loader rebuilds {name}'s LoKr factors with other shapes than these (w1 {a}x{c}, w2 "
                f"{b}x{d}, rank {rank})")
    if rank is None and module.scale(False) != 1.0:
        return (f"{name} is a LoKr of two whole factors at scale {module.scale(False):g}, which LyCORIS's and "
                "ComfyUI's loaders apply at 1")
    return None


def _lycoris_factor(out: int, inp: int, w1: tuple[int, int], w2: tuple[int, int]) -> int:
    """The decompose factor LyCORIS's loader reads back from w1's and w2's shapes."""
    if w1 == (lycoris.factorization(out)[0], lycoris.factorization(inp)[0]):
        return -1
    for candidate in (max(w1), max(w2)):
        if out % candidate == 0 and inp % candidate == 0 and candidate in (w1[0], w2[0]) and \
                candidate in (w1[1], w2[1]):
            return candidate
    return min(max(w1), max(w2))


def whole_at_one(name: str, module: LoraModule, title: str, where: str) -> None:
    """A LoKr of two whole factors is applied at scale 1 by LyCORIS and ComfyUI: refuse another strength."""
    if module.kind == LOKR and module.rank is None and module.scale(False) != 1.0 and LOKR_W1 in module.factors \
            and LOKR_W2 in module.factors:
        raise CogExportError(f"{where}: {name} is a LoKr of two whole factors at scale {module.scale(False):g}; "
                             f"{title} loaders apply such a module at 1; write --lora-format peft")
