"""An adapter as cogexport holds it between reading and writing: one entry per adapted module of the family's
Diffusers transformer, whatever file it came from.

A LoRA module has lora_A [r, in] and lora_B [out, r] applied at scale alpha / r (alpha / sqrt(r) for rank-stabilised
LoRA); a LoKr or LoHa module (LyCORIS) has its factors instead (lycoris.py), applied at alpha / dim, dim being the
rank its trainer divides alpha by (None: alpha is not applied, scale 1). Modules may carry deltas some formats hold:
a LoRA bias (PEFT's lora_B.bias, scaled like B A), full-weight and bias deltas added as they are (ComfyUI's .diff /
.diff_b, on layers with or without an adapter), DoRA magnitudes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

import torch

from ..keymap.plan import translate_shapes
from ..keymap.table import KeyMapTable
from ..lazy import LazyTensor
from ..models.family import ModelFamily
from . import lycoris
from .parts import BIAS, DIFF, DIFF_B, DOWN, FACTOR_PARTS, KIND_TITLES, LORA, MAGNITUDE, PART_NAMES, UP
from .tables import LoraTable


# Each canonical part and the LoraModule field that holds it (LyCORIS factors are in ``factors``).
PART_ATTRIBUTES = {DOWN: "down", UP: "up", BIAS: "bias", DIFF: "diff", DIFF_B: "diff_b", MAGNITUDE: "magnitude"}


@dataclass
class LoraModule:
    """One module's adapter; parts it does not have are None."""

    down: LazyTensor | None = None  # lora_A [r, in]
    up: LazyTensor | None = None  # lora_B [out, r]
    alpha: float | None = None
    bias: LazyTensor | None = None  # lora_B.bias [out]: the bias gains bias * scale
    diff: LazyTensor | None = None  # [out, in]: the weight gains it as is
    diff_b: LazyTensor | None = None  # [out]: the bias gains it as is
    magnitude: LazyTensor | None = None  # DoRA [out]
    factors: dict[str, LazyTensor] = field(default_factory=dict)  # LoKr / LoHa factors, by part name
    dim: int | None = None  # LoKr / LoHa: what alpha is divided by (None: alpha is not applied)

    @property
    def kind(self) -> str | None:
        """LoRA, LoKr or LoHa; None for a module with deltas alone."""
        if self.down is not None:
            return LORA
        return lycoris.kind_of(self.factors)

    @property
    def rank(self) -> int | None:
        """A LoRA's rank; a LoKr's or LoHa's factor rank (None for a LoKr of two whole factors)."""
        if self.down is not None:
            return self.down.shape[0]
        return lycoris.factor_rank(self.factors)

    @property
    def parts(self) -> dict[str, LazyTensor]:
        """The tensors, by canonical part name."""
        named = {part: getattr(self, attribute) for part, attribute in PART_ATTRIBUTES.items()}
        return {**{part: tensor for part, tensor in named.items() if tensor is not None}, **self.factors}

    def with_parts(self, parts: Mapping[str, LazyTensor]) -> "LoraModule":
        """The same module with these parts (by canonical name) replaced."""
        factors = {part: tensor for part, tensor in parts.items() if part in FACTOR_PARTS}
        return replace(self, **{PART_ATTRIBUTES[part]: tensor for part, tensor in parts.items() if part not in factors},
                       factors={**self.factors, **factors})

    def scale(self, rslora: bool) -> float:
        if self.down is None:  # LyCORIS stores rank-stabilised alphas already divided (alpha * sqrt(r) / r)
            return 1.0 if self.dim is None else self.alpha / self.dim
        return self.alpha / (math.sqrt(self.rank) if rslora else self.rank)


@dataclass
class LoraAdapter:
    """What a LoRA file or run holds, in Diffusers module names of its family's transformer."""

    family: ModelFamily
    table: LoraTable  # the layout it was read with
    modules: dict[str, LoraModule]
    names: Mapping[str, torch.Size]  # every tensor of a model of the family large enough for the adapter (for names)
    alpha_source: str
    alpha_recorded: bool  # False: the file recorded no alpha and a default is assumed
    # The model's own weights when the run saved them (SAT's .original, PEFT's base_layer): the source tensors and
    # the key map that names them (it may name the adapters too, given their shapes).
    base_source: dict[str, LazyTensor] = field(default_factory=dict)
    base_table: KeyMapTable | None = None
    use_rslora: bool = False
    warnings: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # the model's sizes its layers were split by (head count)
    # the pipeline component the file says it adapts (its keys' or adapter config's prefix: transformer_ref for
    # MiniMax-H3's Ref2VA); None when it says none
    component: str | None = None

    # -- the adapted modules ------------------------------------------------------------------------------------
    @property
    def adapted(self) -> set[str]:
        """The modules with a LoRA, LoKr or LoHa (not only deltas)."""
        return {name for name, module in self.modules.items() if module.kind is not None}

    @property
    def kinds(self) -> Counter:
        return Counter(module.kind for module in self.modules.values() if module.kind is not None)

    @property
    def type_name(self) -> str:
        """LoRA, DoRA, LoKr, LoHa, or the kinds of a mixed adapter (most modules first)."""
        names = [kind for kind, _ in self.kinds.most_common()] or [LORA]
        if MAGNITUDE in self.carried():
            names = ["DoRA" if kind == LORA else kind for kind in names]
        return " + ".join(names)

    def _lora(self) -> dict[str, LoraModule]:
        return {name: module for name, module in self.modules.items() if module.kind == LORA}

    @property
    def ranks(self) -> dict[str, int]:
        return {name: module.rank for name, module in self.modules.items() if module.rank is not None}

    @property
    def rank(self) -> int:
        return _most_common(self.ranks.values(), 0)

    @property
    def alpha(self) -> float:
        """The usual alpha (LoRA modules with another one are in ``alpha_pattern``), of the modules it applies to."""
        applied = (m.alpha for m in self.modules.values() if m.kind == LORA or m.kind and m.dim is not None)
        return _most_common(applied, 0.0)

    @property
    def alpha_pattern(self) -> dict[str, float]:
        usual = _most_common((m.alpha for m in self._lora().values()), 0.0)
        return {name: m.alpha for name, m in self._lora().items() if m.alpha != usual}

    @property
    def rank_pattern(self) -> dict[str, int]:
        usual = _most_common((m.rank for m in self._lora().values()), 0)
        return {name: m.rank for name, m in self._lora().items() if m.rank != usual}

    def scale(self, module: str | None = None) -> float:
        """The strength the adapter is applied at: one module's; with no module, that of the usual rank and alpha
        (the most common module strength, for LoKr / LoHa)."""
        if module is not None:
            return self.modules[module].scale(self.use_rslora)
        if self.kinds.keys() - {LORA}:
            return _most_common((self.modules[name].scale(self.use_rslora) for name in self.adapted), 0.0)
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank) if self.rank else 0.0

    @property
    def whole_lokr(self) -> int:
        """How many LoKr modules have both factors whole (no rank)."""
        return sum(1 for m in self.modules.values() if m.kind is not None and m.kind != LORA and m.rank is None)

    @property
    def has_base_weights(self) -> bool:
        return bool(self.base_source)

    def base_shapes(self) -> dict[str, torch.Size]:
        """The base weights' Diffusers names and shapes (for reading the model's facts off them)."""
        shapes = translate_shapes(self.base_table, {name: t.shape for name, t in self.base_source.items()})
        return {name: shape for name, shape in shapes.items() if name not in self.adapter_schema()}

    def adapter_schema(self) -> dict[str, torch.Size]:
        """Every adapter tensor under its Diffusers name (<module>.lora_A.weight, ...)."""
        return {f"{name}.{part}": tensor.shape for name, module in self.modules.items()
                for part, tensor in module.parts.items()}

    def carried(self) -> dict[str, list[str]]:
        """The parts beyond the adapters themselves the adapter has, each with the modules that have it."""
        found: dict[str, list[str]] = {}
        for name, module in self.modules.items():
            for part in module.parts:
                if part in PART_NAMES:
                    found.setdefault(part, []).append(name)
        return found

    # -- naming ------------------------------------------------------------------------------------------------
    @property
    def layers(self) -> int:
        """How many blocks carry an adapter (a block: the module path up to its first index)."""
        return len({_block(name) for name in self.modules if _block(name)})

    @property
    def target_modules(self) -> list[str] | str:
        return target_modules(self.adapted, self.names)

    def _rank_text(self) -> str:
        ranks = sorted(set(self.ranks.values()))
        if not ranks:
            return "whole factors"
        text = ("factor rank " if self.kinds.keys() - {LORA} else "rank ") + str(self.rank)
        others = [str(r) for r in ranks if r != self.rank] + (["whole factors"] if self.whole_lokr else [])
        return text + (f" (others {', '.join(others)})" if others else "")

    def describe(self) -> str:
        extras = (", per-module alphas" if self.alpha_pattern else "") + \
            (", rank-stabilised" if self.use_rslora else "") + \
            "".join(f", {PART_NAMES[part]} on {len(names)} modules" for part, names in self.carried().items())
        targets = self.target_modules
        kind = "" if set(self.kinds) <= {LORA} else f"{' + '.join(KIND_TITLES[k] for k in self.kinds)}, "
        alpha = f"lora_alpha {self.alpha:g}" if set(self.kinds) <= {LORA} else f"alpha {self.alpha:g}"
        return (f"{kind}{self._rank_text()}, {alpha} ({self.alpha_source}), scale {self.scale():g}{extras}, "
                f"{len(self.adapted)} modules ({', '.join(targets) if isinstance(targets, list) else targets}) in "
                f"{self.layers} layers")

    def summary(self) -> dict:
        """What reports (export's result, inspect) say about the adapter."""
        return {"family": self.family.name, "type": self.type_name, "kinds": dict(self.kinds),
                "format": self.table.format.name, "format_title": self.table.format.title, "layout": self.table.name,
                "description": self.table.source, "rank": self.rank, "ranks": sorted(set(self.ranks.values())),
                "whole_factors": self.whole_lokr,
                "alpha": self.alpha, "alpha_source": self.alpha_source, "alpha_recorded": self.alpha_recorded,
                "scale": self.scale(), "per_module_alphas": bool(self.alpha_pattern), "use_rslora": self.use_rslora,
                "target_modules": _as_list(self.target_modules), "modules": len(self.adapted), "layers": self.layers,
                "deltas": {part: len(names) for part, names in self.carried().items()},
                "base_weights": self.has_base_weights}

    # -- the adapter config loaders read -----------------------------------------------------------------------
    def lora_config(self, model_schema: Mapping[str, torch.Size]) -> dict:
        """PEFT LoraConfig arguments that make its loader apply exactly each LoRA module's alpha / r."""
        lora = self._lora()
        config: dict = {"r": _most_common((m.rank for m in lora.values()), 0),
                        "lora_alpha": _most_common((m.alpha for m in lora.values()), 0.0),
                        "target_modules": target_modules(set(lora), model_schema)}
        adapted = set(lora)
        if self.rank_pattern:
            config["rank_pattern"] = anchored(self.rank_pattern, adapted)
        if self.alpha_pattern:
            config["alpha_pattern"] = anchored(self.alpha_pattern, adapted)
        if self.use_rslora:
            config["use_rslora"] = True
        carried = self.carried()
        if BIAS in carried:
            config["lora_bias"] = True
        if MAGNITUDE in carried:
            config["use_dora"] = True
        return config


def anchored(pattern: dict[str, object], adapted: set[str]) -> dict[str, object]:
    """PEFT gives a module the value of the first pattern key that is its name or a dotted suffix of it: a module
    name that is also the end of another adapted module's (proj_out and single_transformer_blocks.0.proj_out,
    time_text_embed... inside context_embedder.time_text_embed...) would reach that one too, so it is anchored
    with ^ (as Diffusers' loader writes its own patterns) and names its module alone."""
    return {("^" + name if any(other.endswith("." + name) for other in adapted) else name): value
            for name, value in pattern.items()}


def _as_list(targets: list[str] | str) -> list[str]:
    return targets if isinstance(targets, list) else [targets]


def _most_common(values: Iterable, empty):
    counted = Counter(values).most_common()
    if not counted:
        return empty
    best = counted[0][1]
    return min(value for value, count in counted if count == best)  # ties: the smallest, so it is deterministic


def _block(module: str) -> str:
    parts = module.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    return ".".join(parts[: index + 1]) if index is not None else ""


def _picks(target: str, module: str) -> bool:
    return module == target or module.endswith("." + target)


def target_modules(adapted: set[str], schema: Mapping[str, torch.Size]) -> list[str] | str:
    """PEFT's target_modules for exactly the adapted modules of a model with this schema: short names (to_q,
    to_out.0, ffn.net.2) where they pick out no other module, longer suffixes where they would, full paths for
    the rest; a regular expression of the full paths when even those would pick out another module."""
    modules = {name.rsplit(".", 1)[0] for name in schema if "." in name}
    if not adapted:
        return []

    def suffixes(module: str) -> list[str]:  # shortest first, never starting at an index
        parts = module.split(".")
        return [".".join(parts[i:]) for i in range(len(parts) - 1, -1, -1) if not parts[i].isdigit()] or [module]

    chosen = {module: 0 for module in adapted}
    while True:
        names = {suffixes(module)[chosen[module]] for module in adapted}
        extra = {module for module in modules - adapted if any(_picks(name, module) for name in names)}
        if not extra:
            return sorted(names)
        too_wide = {name for name in names if any(_picks(name, module) for module in extra)}
        longer = False
        for module in adapted:
            options = suffixes(module)
            if options[chosen[module]] in too_wide and chosen[module] < len(options) - 1:
                chosen[module] += 1
                longer = True
        if not longer:
            return "^(" + "|".join(re.escape(module) for module in sorted(adapted)) + ")$"
