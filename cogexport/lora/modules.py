"""Adapters renamed module by module with a family's key map, the way the map renames the modules' weights.

``<module>.weight`` is matched against the table's rules. A rename moves the whole adapter. A rule that splits a
fused weight along its output rows (HunyuanVideo's ``img_attn_qkv`` into to_q, to_k, to_v; ``linear1`` into q, k, v
and the MLP; a half swap) splits lora_B, the deltas and the DoRA magnitudes the same way and gives every part the
same lora_A and alpha: (B A)[rows] = B[rows] A. Run backwards, a rule that fuses several layers' weights fuses
their adapters: when they share lora_A (an adapter that was split, kept as one tensor or, as files in split names
store it, as equal copies) B is stacked again; otherwise A is stacked
and B becomes block-diagonal (rank r1 + r2 + ...), exact as long as the layers share one scale. A layer of the
fused group without an adapter gets zero rows of B.

LyCORIS factors split the same way where the product allows it exactly: a LoHa's rows are those of w1_a and w2_a
((w1_a w1_b) * (w2_a w2_b))[rows] = (w1_a[rows] w1_b) * (w2_a[rows] w2_b)); a LoKr's come in blocks of w2's height,
one per row of w1, so a LoKr splits into parts that each take whole rows of w1 (or w1_a) and share w2:
kron(w1, w2)[rows of w1 i..j] = kron(w1[i..j], w2). Fused back, parts that share the other factors and one strength
are stacked again; anything else is refused.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

from ..errors import CogExportError
from ..keymap.plan import match_key
from ..keymap.rules import Drop, Regroup, RuleError
from ..keymap.table import KeyMapTable
from ..lazy import LazyTensor
from . import lycoris
from .adapter import LoraModule
from .parts import HADA_W1_A, HADA_W2_A, LOHA, LOKR_W1, LOKR_W1_A

_WEIGHT = ".weight"


def rule_of(table: KeyMapTable, module: str) -> tuple[Regroup, int, dict[str, str]] | None:
    """The rule that renames this module's weight, which of its sources the module is, and its placeholder values."""
    matches = [m for m in match_key(table, module + _WEIGHT) if not isinstance(m[0], Drop)]
    return matches[0] if len(matches) == 1 else None


def translate_modules(modules: Mapping[str, LoraModule], table: KeyMapTable, where: str, rslora: bool = False,
                      counts: Mapping[str, int] | None = None) -> tuple[dict[str, LoraModule], dict[str, list[str]]]:
    """The adapters renamed by ``table``, and for each new module the modules it came from. ``counts`` are the model's
    (a rule repeated per head needs its head count); None: names and shapes only, every rule's groups taken as one."""
    groups: dict[tuple, dict[int, str]] = {}
    rules: dict[int, Regroup] = {}
    for name in modules:
        found = rule_of(table, name)
        if found is None:
            raise CogExportError(f"{where}: {name} is not a layer that key map {table.name} knows")
        rule, index, values = found
        rules[id(rule)] = rule
        groups.setdefault((id(rule), tuple(sorted(values.items()))), {})[index] = name
    out: dict[str, LoraModule] = {}
    origins: dict[str, list[str]] = {}
    for (rule_id, values), found in groups.items():
        rule = rules[rule_id]
        try:
            if rule.groups is not None:  # None: names and shapes only, the groups' order aside
                rule = rule.laid_out(counts) if counts is not None else rule.in_groups(1)
            target_values = rule.target_values(dict(values), counts or {})
        except RuleError as error:
            raise CogExportError(f"{where}: {error}") from None
        sources = [modules.get(found[j]) if j in found else None for j in range(len(rule.sources))]
        names = [found[j] for j in sorted(found)]
        for k, pattern in enumerate(rule.targets):
            target = pattern.format(target_values)[: -len(_WEIGHT)]
            if target in out:
                raise CogExportError(f"{where}: {', '.join(names)} and {', '.join(origins[target])} both adapt "
                                     f"{target}")
            out[target] = _regrouped(rule, k, sources, names, where, rslora)
            origins[target] = names
    return out, origins


def _regrouped(rule: Regroup, k: int, sources: list[LoraModule | None], names: list[str], where: str,
               rslora: bool) -> LoraModule:
    """Target k of the rule, from the adapters of its sources (None: that layer has no adapter)."""
    picks = _chunk_sources(rule, k)
    if len(picks) == 1 and rule.source_chunks[picks[0][0]] == 1:  # a rename: the adapter as it is
        return sources[picks[0][0]]
    if rule.dim != 0:
        raise CogExportError(f"{where}: {', '.join(names)}: key map rule {rule.describe()} splits along dim "
                             f"{rule.dim}; adapters can only follow splits of the output rows")
    present = {j: module for j, module in enumerate(sources) if module is not None}
    unit = _unit_rows(rule, present, names, where)
    result = _adapter_regrouped(picks, present, unit, rule, names, where, rslora)
    in_features = next((m.down.shape[1] if m.down is not None else m.diff.shape[1] for m in present.values()
                        if m.down is not None or m.diff is not None), None)
    for part, width in (("diff", in_features), ("diff_b", None), ("bias", None), ("magnitude", None)):
        tensors = {j: getattr(m, part) for j, m in present.items() if getattr(m, part) is not None}
        if not tensors:
            continue
        if part == "magnitude" and any(j not in tensors for j, _ in picks):
            raise CogExportError(f"{where}: {', '.join(names)}: DoRA magnitudes of a fused layer need every part "
                                 "adapted with DoRA")
        setattr(result, part, _stacked(picks, tensors, rule, unit, width))
    return result


def _adapter_regrouped(picks: list[tuple[int, int]], present: Mapping[int, LoraModule], unit: int, rule: Regroup,
                       names: list[str], where: str, rslora: bool) -> LoraModule:
    """The target's LoRA or LyCORIS adapter (none, when its parts have none)."""
    result = LoraModule()
    picked = {j for j, _ in picks}
    lora = {j: m for j, m in present.items() if m.down is not None and j in picked}
    factored = {j: m for j, m in present.items() if m.factors and j in picked}
    if lora and factored:
        raise CogExportError(f"{where}: {', '.join(names)}: a LoRA and a LyCORIS adapter cannot become one adapter of "
                             "the fused layer")
    if lora:
        result.down, result.up, result.alpha = _low_rank(picks, lora, unit, rule, names, where, rslora)
    if factored:
        result.factors, result.alpha, result.dim = _factors(picks, factored, rule, names, where)
    return result


def _chunk_sources(rule: Regroup, k: int) -> list[tuple[int, int]]:
    """Target k's chunks, each as (source index, chunk of that source)."""
    owners = [(j, c) for j, count in enumerate(rule.source_chunks) for c in range(count)]
    return [owners[i] for i in rule.target_chunks[k]]


def _rows(module: LoraModule) -> int:
    if module.factors:
        return lycoris.delta_shape(module.factors)[0]
    tensor = next(t for t in (module.up, module.diff, module.diff_b, module.bias, module.magnitude) if t is not None)
    return tensor.shape[0]


def _unit_rows(rule: Regroup, present: Mapping[int, LoraModule], names: list[str], where: str) -> int:
    """The rows of one chunk: the rules split into equal chunks, so every source's rows / its chunk count agree."""
    return _rows_per_chunk(
        {j: _rows(module) for j, module in present.items()}, rule,
        lambda rows, parts: f"{where}: {names[0]} has {rows} output rows, which {rule.describe()} cannot split into "
                            f"{parts} equal parts",
        f"{where}: the adapters of {', '.join(names)} do not fit together ({rule.describe()})")


def _rows_per_chunk(rows: Mapping[int, int], rule: Regroup, uneven: Callable[[int, int], str], misfit: str) -> int:
    """The rows one chunk of the fused layer takes: each source's rows split evenly into its chunks, the same count
    for every source; ``uneven(rows, parts)`` and ``misfit`` say why not."""
    units = set()
    for j, count in rows.items():
        if count % rule.source_chunks[j]:
            raise CogExportError(uneven(count, rule.source_chunks[j]))
        units.add(count // rule.source_chunks[j])
    if len(units) != 1:
        raise CogExportError(misfit)
    return units.pop()


def _piece(tensor: LazyTensor, chunks: int, c: int) -> Callable[[], torch.Tensor]:
    if chunks == 1:
        return tensor.load
    return lambda: torch.chunk(tensor.load(), chunks, dim=0)[c].contiguous()


def _stacked(picks: list[tuple[int, int]], tensors: Mapping[int, LazyTensor], rule: Regroup, unit: int,
             width: int | None) -> LazyTensor:
    """One part (B-like: split along rows) of the target: its chunks in order, zeros where a source lacks it."""
    dtype = _common_dtype(tensors.values())
    tail = () if width is None else (width,)
    loaders = [_piece(tensors[j], rule.source_chunks[j], c) if j in tensors else
               (lambda: torch.zeros((unit, *tail), dtype=dtype)) for j, c in picks]
    shape = torch.Size((unit * len(picks), *tail))
    return LazyTensor(shape, dtype, lambda: torch.cat([load().to(dtype) for load in loaders], dim=0),
                      "LoRA parts regrouped")


def _low_rank(picks, lora: Mapping[int, LoraModule], unit: int, rule: Regroup, names: list[str], where: str,
              rslora: bool) -> tuple[LazyTensor, LazyTensor, float]:
    first = next(iter(lora.values()))
    if _one_adapter(list(lora.values())):  # one adapter that was split: B's rows in order, A and alpha as they are
        up = _stacked(picks, {j: m.up for j, m in lora.items()}, rule, unit, first.rank)
        return first.down, up, first.alpha
    scales = {m.scale(rslora) for m in lora.values()}
    order = sorted(lora)
    total = sum(lora[j].rank for j in order)
    scale = scales.pop() if len(scales) == 1 else None
    alpha = None if scale is None else scale * (total ** 0.5 if rslora else total)
    if alpha is None or alpha / (total ** 0.5 if rslora else total) != scale:
        raise CogExportError(f"{where}: the adapters of {', '.join(names)} have different strengths "
                             f"({', '.join(f'{m.scale(rslora):g}' for m in lora.values())}), which one adapter of the "
                             "fused layer cannot carry exactly")
    offsets = {j: sum(lora[i].rank for i in order[:order.index(j)]) for j in order}
    dtype = _common_dtype([m.up for m in lora.values()] + [m.down for m in lora.values()])
    down = LazyTensor(torch.Size((total, first.down.shape[1])), dtype,
                      lambda: torch.cat([lora[j].down.load().to(dtype) for j in order], dim=0), "LoRA A stacked")

    def up_rows() -> torch.Tensor:
        block = torch.zeros((unit * len(picks), total), dtype=dtype)
        for row, (j, c) in enumerate(picks):
            if j in lora:
                piece = _piece(lora[j].up, rule.source_chunks[j], c)()
                block[row * unit:(row + 1) * unit, offsets[j]:offsets[j] + lora[j].rank] = piece.to(dtype)
        return block

    return down, LazyTensor(torch.Size((unit * len(picks), total)), dtype, up_rows, "LoRA B block-diagonal"), alpha


def _factors(picks: list[tuple[int, int]], modules: Mapping[int, LoraModule], rule: Regroup, names: list[str],
             where: str) -> tuple[dict[str, LazyTensor], float | None, int | None]:
    """The target's LoKr / LoHa factors: the row factors' chunks in order (zeros where a part has no adapter), the
    other factors, the alpha and the divisor shared."""
    first = next(iter(modules.values()))
    kind = first.kind
    rows_parts = (HADA_W1_A, HADA_W2_A) if kind == LOHA else (LOKR_W1 if LOKR_W1 in first.factors else LOKR_W1_A,)
    shared = [part for part in first.factors if part not in rows_parts]
    same = all(m.kind == kind and set(m.factors) == set(first.factors) and (m.alpha, m.dim) == (first.alpha, first.dim)
               for m in modules.values())
    if not same or not all(_equal([m.factors[part] for m in modules.values()]) for part in shared):
        raise CogExportError(f"{where}: the {kind} adapters of {', '.join(names)} differ in "
                             f"{' / '.join(shared)} or strength; one {kind} of the fused layer cannot carry them")
    unit = _factor_rows(modules, rows_parts[0], rule, names, where)
    factors = {part: first.factors[part] for part in shared}
    for part in rows_parts:
        tensors = {j: m.factors[part] for j, m in modules.items()}
        factors[part] = _stacked(picks, tensors, rule, unit, first.factors[part].shape[1])
    return factors, first.alpha, first.dim


def _factor_rows(modules: Mapping[int, LoraModule], part: str, rule: Regroup, names: list[str], where: str) -> int:
    """The rows of ``part`` one chunk of the fused layer takes: its rows split into whole equal parts."""
    return _rows_per_chunk(
        {j: module.factors[part].shape[0] for j, module in modules.items()}, rule,
        lambda rows, parts: f"{where}: {names[0]}'s {part} has {rows} rows, which cannot be split into the {parts} "
                            f"parts of the fused layer ({rule.describe()}) exactly",
        f"{where}: the LyCORIS adapters of {', '.join(names)} do not fit together")


def _equal(tensors: list[LazyTensor]) -> bool:
    """The same tensor, or equal values (a file in split names stores a shared factor once per part)."""
    first = tensors[0]
    if all(t is first for t in tensors):
        return True
    if any(t.shape != first.shape or t.dtype != first.dtype for t in tensors):
        return False
    values = first.load()
    return all(torch.equal(t.load(), values) for t in tensors[1:])


def _one_adapter(modules: list[LoraModule]) -> bool:
    """Whether these adapters are one adapter split along its rows: the same alpha and the same lora_A (the very
    tensor, or equal values, as a file that stores the split parts separately has them: Diffusers' conversion of a
    fused layer copies lora_A to each part)."""
    first = modules[0]
    if any(m.alpha != first.alpha or m.down.shape != first.down.shape or m.down.dtype != first.down.dtype
           for m in modules):
        return False
    if all(m.down is first.down for m in modules):
        return True
    down = first.down.load()  # lora_A is small ([r, in]); comparing reads it once more when written
    return all(torch.equal(m.down.load(), down) for m in modules[1:])


def _common_dtype(tensors) -> torch.dtype:
    dtype = None
    for tensor in tensors:
        dtype = tensor.dtype if dtype is None else torch.promote_types(dtype, tensor.dtype)
    return dtype
