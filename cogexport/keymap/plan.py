"""Apply a key-map table to a checkpoint's lazy tensors and check the result against the target model.

The plan is made from names and shapes only: every selected source key must match exactly one rule, every
key of the target model must be produced exactly once with the right shape, and anything unknown, missing
or the wrong size is named in the error. Only then does any tensor data get read, through the lazy tensors
the plan hands out, in the target model's state_dict order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from ..errors import CogExportError
from ..lazy import LazyTensor
from .rules import Drop, Regroup, RuleError
from .table import KeyMapTable, are_alternatives


@dataclass
class Plan:
    """The target tensors in the target model's order, and what happened to every source key."""

    tensors: dict[str, LazyTensor]
    dropped: dict[str, str] = field(default_factory=dict)  # source key -> reason
    ignored: list[str] = field(default_factory=list)  # source keys outside the table's prefix
    # dropped tensors a drop rule keeps beside the model: file -> {name in the table's source naming: tensor}
    kept: dict[str, dict[str, LazyTensor]] = field(default_factory=dict)


def _listing(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


def match_key(table: KeyMapTable, name: str) -> list[tuple[Regroup | Drop, int, dict[str, str]]]:
    """Every rule (or drop) of the table, else of its fallback, that matches ``name``: (rule, which of its source
    patterns, placeholder values)."""
    found: list[tuple[Regroup | Drop, int, dict[str, str]]] = []
    for rule in table.rules:
        for index, pattern in enumerate(rule.sources):
            values = pattern.match(name)
            if values is not None:
                found.append((rule, index, values))
    found += [(drop, 0, {}) for drop in table.drops if drop.matches(name)]
    if not found and table.fallback is not None:
        return match_key(table.fallback, name)
    return found


def _the_alternative_the_model_has(matches: list, schema: Mapping[str, torch.Size], counts: Mapping[str, int]) -> list:
    """Of optional rules claiming one key, the one whose targets the target model has (all of them, if several do:
    reported as ambiguous); when none does, the first, which then drops the key for its stated reason."""
    fitting = []
    for match in matches:
        rule, _, values = match
        try:
            target_values = rule.target_values(values, counts)
        except RuleError:
            continue
        if all(pattern.format(target_values) in schema for pattern in rule.targets):
            fitting.append(match)
    return fitting or matches[:1]


def _all_rules(table: KeyMapTable | None) -> list[Regroup]:
    return [] if table is None else [*table.rules, *_all_rules(table.fallback)]


def translate_shapes(table: KeyMapTable, shapes: Mapping[str, torch.Size],
                     counts: Mapping[str, int] | None = None) -> dict[str, torch.Size]:
    """Target names and shapes for these source shapes, without a target model (for detecting the variant).

    Unknown keys are skipped here; the full plan reports them. Re-indexing needs counts, so rules that need a
    count that is not given keep the source index.
    """
    lazy = {name: LazyTensor(torch.Size(shape), torch.float32, _no_data) for name, shape in shapes.items()}
    plan = plan_translation(table, lazy, None, counts or {}, strict=False)
    return {name: tensor.shape for name, tensor in plan.tensors.items()}


def _no_data() -> torch.Tensor:
    raise RuntimeError("shape-only tensor")


def plan_translation(table: KeyMapTable, source: Mapping[str, LazyTensor],
                     schema: Mapping[str, torch.Size] | None, counts: Mapping[str, int], *,
                     strict: bool = True, what: str = "the checkpoint", target: str = "the target model",
                     remedy: str = "") -> Plan:
    """Translate ``source`` with ``table`` into the keys of ``schema`` (the target model's state_dict shapes).
    ``target`` names that model where a message says what it lacks or expects (the model --base's config describes),
    and ``remedy`` is what to do then."""
    selected, ignored = table.select(source)
    plan = Plan(tensors={}, ignored=ignored)
    groups = _group_keys(table, selected, schema, counts, plan, strict, what)
    # every file the table keeps is made, empty when the source had none of its tensors (which then says so)
    plan.kept = {drop.keep: {name: source[selected[name]] for name in plan.kept.get(drop.keep, {})}
                 for drop in table.drops if drop.keep}
    produced = _GroupBuilder(table, source, selected, schema, counts, plan, strict, what, target, remedy).build(groups)
    if schema is None:
        plan.tensors = produced
        return plan
    _check_against_schema(produced, schema, what, target, remedy)
    plan.tensors = {name: produced[name] for name in schema}
    return plan


# A group: the source keys one rule application reads, by the index of the rule's source pattern; keyed by the rule
# and its placeholder values.
_Groups = dict[tuple[int, tuple], dict[int, str]]


def _group_keys(table: KeyMapTable, selected: Mapping[str, str], schema: Mapping[str, torch.Size] | None,
                counts: Mapping[str, int], plan: Plan, strict: bool, what: str) -> _Groups:
    """Each selected key matched to exactly one rule (dropped keys noted in ``plan``), grouped by rule application;
    a key matching no rule or several is an error."""
    groups: _Groups = {}
    unknown, ambiguous = [], []
    for name in selected:
        matches = match_key(table, name)
        alternatives = len(matches) > 1 and are_alternatives([m[0] for m in matches])
        if alternatives and schema is not None:
            matches = _the_alternative_the_model_has(matches, schema, counts)
        if len(matches) > 1 and not alternatives:
            ambiguous.append(f"{name} ({' / '.join(m[0].describe() for m in matches)})")
            continue
        if not matches:
            unknown.append(name)
        for rule, index, values in matches:  # several only for alternatives without a target model: each is named
            if isinstance(rule, Drop):
                plan.dropped[selected[name]] = rule.reason
                if rule.keep:
                    plan.kept.setdefault(rule.keep, {})[name] = name
                continue
            groups.setdefault((id(rule), tuple(sorted(values.items()))), {})[index] = name
    if ambiguous:
        raise CogExportError(f"{what}: keys matching several rules of key map {table.name}: {_listing(ambiguous)}")
    if unknown and strict:
        raise CogExportError(f"{what} has {len(unknown)} key(s) that key map {table.name} does not know: "
                             f"{_listing(unknown)}; is it the right model (or a LoRA/other checkpoint)?")
    return groups


@dataclass
class _GroupBuilder:
    """Applies each group's rule: the target names and lazy tensors, every problem collected and named at once."""

    table: KeyMapTable
    source: Mapping[str, LazyTensor]
    selected: Mapping[str, str]
    schema: Mapping[str, torch.Size] | None
    counts: Mapping[str, int]
    plan: Plan
    strict: bool
    what: str
    target: str
    remedy: str
    produced: dict[str, LazyTensor] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    beyond_target: bool = False  # a source tensor has no place in the target model: its shapes say another model

    def build(self, groups: _Groups) -> dict[str, LazyTensor]:
        rules = {id(rule): rule for rule in _all_rules(self.table)}
        for (rule_id, values), found in groups.items():
            self._apply(rules[rule_id], dict(values), found)
        if self.errors:
            raise CogExportError(f"{self.what} does not fit key map {self.table.name}: {_listing(self.errors, 3)}"
                                 + (f"; {self.remedy}" if self.remedy and self.beyond_target else ""))
        return self.produced

    def _apply(self, rule: Regroup, values: dict[str, str], found: dict[int, str]) -> None:
        missing = [rule.sources[i].format(values) for i in range(len(rule.sources)) if i not in found]
        if missing:
            self.errors.append(f"{found[min(found)]} needs {', '.join(missing)}, which {self.what} lacks")
            return
        names = [found[i] for i in range(len(rule.sources))]
        try:
            rule = rule.laid_out(self.counts)
        except RuleError as error:
            if self.strict:
                self.errors.append(f"{', '.join(names)}: {error}")
                return
            rule = rule.in_groups(1)  # shapes only: one group or many, every target has the same shape
        try:
            target_values = rule.target_values(values, self.counts)
        except RuleError as error:
            if self.strict:
                self.errors.append(str(error))
                return
            target_values = values
        targets = [pattern.format(target_values) for pattern in rule.targets]
        wanted = [index for index, target in enumerate(targets) if self._wanted(rule, target, names)]
        try:
            built = rule.build([self.source[self.selected[n]] for n in names], names, wanted)
        except RuleError as error:
            self.errors.append(str(error))
            return
        for index, tensor in built.items():
            self.produced[targets[index]] = tensor

    def _wanted(self, rule: Regroup, target: str, names: list[str]) -> bool:
        """Whether the target model takes ``target`` (an optional rule's target it lacks drops the sources)."""
        if self.schema is not None and target not in self.schema:
            if rule.optional_reason:
                self.plan.dropped.update({self.selected[n]: rule.optional_reason for n in names})
            else:
                self.errors.append(f"{', '.join(names)} becomes {target}, which {self.target} does not have")
                self.beyond_target = True
            return False
        if target in self.produced:
            self.errors.append(f"{target} is produced twice (again from {', '.join(names)})")
            return False
        return True


def _check_against_schema(produced: Mapping[str, LazyTensor], schema: Mapping[str, torch.Size], what: str,
                          target: str, remedy: str) -> None:
    then = f"; {remedy}" if remedy else ""
    missing = [name for name in schema if name not in produced]
    if missing:
        raise CogExportError(f"{what} lacks {len(missing)} tensor(s) {target} needs: {_listing(missing)}{then}")
    wrong = [f"{name} is {tuple(produced[name].shape)}, the model expects {tuple(shape)}"
             for name, shape in schema.items() if produced[name].shape != torch.Size(shape)]
    if wrong:
        raise CogExportError(f"{what} does not match the shapes of {target}: {_listing(wrong, 3)}{then}")
