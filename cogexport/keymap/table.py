"""Read ``key_maps/<family>/*.toml`` into validated tables of rules.

A table is data: which source keys it applies to (a prefix to select, prefixes to strip, signature globs),
placeholder kinds and rules (rename, chunk, regroup, reindex, drop).
Mistakes in a table (unknown fields, undeclared placeholders, two rules that match the same key) are errors
when it is loaded, never a silent first-match-wins.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..errors import ExtensionError
from ..kept_beside import KEPT_BESIDE_MODELS
from ..schema import SchemaError, header, read
from .pattern import KeyPattern, PatternError
from .roots import find_key_map_file
from .rules import Drop, Regroup
from .table_fields import RULES, DropRule, LoraSettings, RegroupRule, ReshapeRule, TableFile, TableHeader, ToldApart

class TableError(ExtensionError):
    """A key-map table is malformed (a bug in the table, not in the user's input)."""

    kind = "key maps"


@dataclass(frozen=True)
class KeyMapTable:
    name: str
    description: str = ""
    source: str = ""
    target: str = ""
    # globs of the keys this table reads, by their full names (a model whose keys sit under several prefixes of a
    # release file, LTX-2's text connectors); the other keys are another model's, ignored
    select_keys: tuple[str, ...] = ()
    select_prefix: str | None = None
    strip_prefixes: tuple[str, ...] = ()
    signature: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()  # globs that must each match some key (what tells look-alike layouts apart)
    excludes: tuple[str, ...] = ()  # globs that no key may match (a look-alike layout's own keys)
    judge: str | None = None  # Diffusers' own converter for this layout (in diffusers.loaders.single_file_utils)
    judge_args: dict = field(default_factory=dict, compare=False)  # its keyword arguments ("target": the config)
    # source keys and the shapes ("*" for any size) the judge's hard-coded constants assume: it is asked only then
    judge_when: dict = field(default_factory=dict, compare=False)
    no_judge: str = ""  # when there is no judge: why, and what checks the table instead
    # what beside the tensors says the input is this layout, when another has the same names and shapes
    told_apart: ToldApart | None = field(default=None, compare=False)
    rules: tuple[Regroup, ...] = ()
    drops: tuple[Drop, ...] = ()
    placeholders: dict = field(default_factory=dict, compare=False)
    fallback: "KeyMapTable | None" = None  # names the keys no rule here matches (e.g. plain Diffusers names)
    lora: LoraSettings | None = field(default=None, compare=False)  # a LoRA table's [lora] (cogexport/lora/tables.py)

    def recognises(self, keys: Iterable[str]) -> bool:
        """Whether these (selected) keys look like this table's source format."""
        keys = list(keys)
        return any(fnmatch.fnmatchcase(key, glob) for key in keys for glob in self.signature) and all(
            any(fnmatch.fnmatchcase(key, glob) for key in keys) for glob in self.requires) and not any(
            fnmatch.fnmatchcase(key, glob) for key in keys for glob in self.excludes)

    @property
    def renames_nothing(self) -> bool:
        """The names are already the target's: the table only selects keys and strips wrapper prefixes."""
        return bool(self.rules) and all(len(rule.sources) == len(rule.targets) == 1 and
                                        rule.sources[0].text == rule.targets[0].text and not rule.value_maps
                                        for rule in self.rules) and self.fallback is None

    def select(self, keys: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        """Keys this table applies to, as {name without prefixes: original name}, and the keys it ignores.

        With ``select_keys``, only the keys those globs match are read (under their full names). With ``select_prefix``,
        keys outside it (a SAT engine's T5 and VAE) are ignored, never renamed; a file with no key under the prefix is
        taken as already unprefixed. ``strip_prefixes`` go when every key has them.
        """
        keys = list(keys)
        ignored: list[str] = []
        if self.select_keys:
            chosen = [any(fnmatch.fnmatchcase(key, glob) for glob in self.select_keys) for key in keys]
            ignored = [key for key, taken in zip(keys, chosen) if not taken]
            keys = [key for key, taken in zip(keys, chosen) if taken]
        selected = {key: key for key in keys}
        prefix = self.select_prefix
        if prefix and any(key.startswith(prefix) for key in keys):
            selected = {key[len(prefix):]: key for key in keys if key.startswith(prefix)}
            ignored += [key for key in keys if not key.startswith(prefix)]
        for strip in self.strip_prefixes:
            if selected and all(name.startswith(strip) for name in selected):
                selected = {name[len(strip):]: original for name, original in selected.items()}
        return selected, ignored

    def inverted(self) -> "KeyMapTable":
        """The same table run backwards (e.g. Diffusers to SAT); drops produce nothing in this direction."""
        return replace(self, name=f"{self.name} (inverted)", select_keys=(), select_prefix=None, strip_prefixes=(),
                       signature=(), requires=(), excludes=(), judge=None, rules=tuple(rule.inverse() for rule in self.rules), drops=(),
                       fallback=self.fallback.inverted() if self.fallback else None)


def _require(condition: bool, table: str, message: str) -> None:
    if not condition:
        raise TableError(f"key map {table}: {message}")


def _side(kinds: dict, side: int) -> dict:
    """Placeholder kinds as one side of a rule sees them: a mapped placeholder matches its table's source values
    (side 0) or target values (side 1)."""
    return {name: [pair[side] for pair in kind["map"].items()] if isinstance(kind, dict) else kind
            for name, kind in kinds.items()}


def _value_maps(kinds: dict, patterns: list[KeyPattern]) -> tuple:
    used = {name for pattern in patterns for name in pattern.names}
    return tuple((name, tuple(kind["map"].items())) for name, kind in kinds.items()
                 if isinstance(kind, dict) and name in used)


def _check_kinds(kinds: dict, table: str) -> None:
    for name, kind in kinds.items():
        if isinstance(kind, dict):
            pairs = kind.get("map")
            _require(set(kind) == {"map"} and isinstance(pairs, dict) and pairs and
                     all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in pairs.items()), table,
                     f"mapped placeholder {name} must be {{ map = {{ source = \"target\", ... }} }} of strings")
            _require(len(set(pairs.values())) == len(pairs), table,
                     f"mapped placeholder {name} maps two values to one: it could not run backwards")


def _patterns(value: Any, kinds: dict, table: str, what: str) -> list[KeyPattern]:
    items = value if isinstance(value, tuple) else (value,)
    _require(bool(items), table, f"{what} must be a key pattern or a list of them")
    try:
        return [KeyPattern(text, kinds) for text in items]
    except PatternError as error:
        raise TableError(f"key map {table}: {error}") from None


def _drop(spec: DropRule, kinds: dict, table: str, where: str) -> Drop:
    _require(bool(spec.reason), table, f"{where} needs a reason")
    _require((spec.source is None) != (spec.glob is None), table, f"{where} needs exactly one of from / glob")
    pattern = _patterns(spec.source, kinds, table, "from")[0] if spec.source is not None else None
    keep = spec.keep
    _require(keep is None or keep in KEPT_BESIDE_MODELS, table,
             f"{where}: keep names a file cogexport keeps beside a model folder "
             f"({', '.join(sorted(KEPT_BESIDE_MODELS))}; a new one is added to cogexport/kept_beside.py, so that "
             "readers of model folders know it)")
    return Drop(spec.reason, pattern, spec.glob, keep)


def _rule(kind: str, spec: Any, all_kinds: dict, table: str, where: str) -> Regroup | Drop:
    """One rule of the table (``where``: its place, ``[[chunk]] #2``) as the operation it compiles to."""
    kinds, target_kinds = _side(all_kinds, 0), _side(all_kinds, 1)
    if kind == "drop":
        return _drop(spec, kinds, table, where)
    source = _patterns(spec.source, kinds, table, "from")
    _require(len(source) == 1, table, f"{kind} rule {spec.source} must have one source pattern")
    if isinstance(spec, RegroupRule):
        targets = [_patterns(entry.key, target_kinds, table, "to")[0] for entry in spec.to]
        chunks, groups = (spec.chunks,), tuple(entry.chunks for entry in spec.to)
    else:
        targets = _patterns(spec.to, target_kinds, table, "to")
        chunks, groups = (len(targets),), tuple((i,) for i in range(len(targets)))
        _require(kind == "chunk" or len(targets) == 1, table, f"{kind} rule {spec.source} must have one target")
    reverse = getattr(spec, "reverse", {})
    _require(kind != "reindex" or bool(reverse), table,
             f"reindex {spec.source} needs reverse = {{placeholder = \"count name\"}}")
    views = _views(spec, table) if isinstance(spec, ReshapeRule) else None
    try:
        return Regroup(kind, tuple(source), chunks, tuple(targets), groups, getattr(spec, "dim", 0),
                       tuple(reverse.items()), getattr(spec, "optional", None), _value_maps(all_kinds, source), views,
                       getattr(spec, "groups", None))
    except ValueError as error:
        raise TableError(f"key map {table}: {error}") from None


def _views(spec: ReshapeRule, table: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    views = spec.from_shape, spec.to_shape
    _require(all(view and all(size > 0 or size == -1 for size in view) for view in views), table,
             f"reshape {spec.source} needs from_shape and to_shape, lists of sizes (-1 for the one the element "
             "count decides)")
    return views[0], views[1]


def _read(text: str, name: str) -> TableFile:
    try:
        return read(TableFile, tomllib.loads(text))
    except tomllib.TOMLDecodeError as error:
        raise TableError(f"key map {name}: not valid TOML ({error})") from None
    except SchemaError as error:
        raise TableError(f"key map {name}: {error}") from None


def _placeholders(data: TableFile, included: KeyMapTable, name: str) -> dict:
    """The table's placeholder kinds: the included table's and its own, which may not declare one differently."""
    kinds = dict(included.placeholders)
    for placeholder, kind in data.placeholders.items():
        _require(kinds.get(placeholder, kind) == kind, name,
                 f"placeholder {placeholder} is declared differently in {data.table.include}")
        kinds[placeholder] = kind
    _check_kinds(kinds, name)
    return kinds


def _inherited(head: TableHeader, included: KeyMapTable) -> dict:
    """The header's fields, each the included table's where this one leaves it out."""
    def own(field: str):
        value = getattr(head, field)
        return value if value is not None else getattr(included, field)

    # a table that says why it has no judge does not inherit the judge of the table it includes
    judge = head.judge if head.judge is not None or head.no_judge is not None else included.judge
    return dict(description=own("description"), source=own("source"), target=own("target"),
                select_keys=own("select_keys"), select_prefix=own("select_prefix"),
                strip_prefixes=own("strip_prefixes"), signature=own("signature"), requires=own("requires"),
                excludes=own("excludes"), judge=judge, judge_args=dict(own("judge_args") or {}),
                judge_when=dict(own("judge_when")), no_judge=own("no_judge"),
                told_apart=own("told_apart"))


def parse_table(text: str, name: str) -> KeyMapTable:
    data = _read(text, name)
    head = data.table
    # An included table's rules become this table's own (and are checked with them for overlaps).
    included = load_table(head.include) if head.include is not None else KeyMapTable(name="")
    kinds = _placeholders(data, included, name)
    rules: list[Regroup] = list(included.rules)
    drops: list[Drop] = list(included.drops)
    for kind in RULES:
        for index, spec in enumerate(getattr(data, kind)):
            made = _rule(kind, spec, kinds, name, header((f"{kind} #{index + 1}",)))
            (drops if isinstance(made, Drop) else rules).append(made)
    table = KeyMapTable(
        name=head.name if head.name is not None else name, **_inherited(head, included),
        rules=tuple(rules), drops=tuple(drops), placeholders=kinds,
        fallback=load_table(head.fallback) if head.fallback is not None else None, lora=data.lora,
    )
    _check_no_overlaps(table)
    _check_no_overlaps(table.inverted())
    return table


def _check_no_overlaps(table: KeyMapTable) -> None:
    """Each rule's example keys must match that rule alone: two rules for one key is a table bug, except for optional
    rules, which may share a key when each names a different target: the target model has one of them, and that
    decides (Mochi's last block keeps its context modulation under another name)."""
    patterns = [(rule, p) for rule in table.rules for p in rule.sources]
    matchers = patterns + [(drop, drop) for drop in table.drops]
    for _, pattern in patterns:
        example = pattern.example()
        claims = {id(who): who for who, other in matchers
                  if (other.matches(example) if isinstance(other, Drop) else other.match(example) is not None)}
        if len(claims) > 1 and not are_alternatives(list(claims.values())):
            owners = ", ".join(sorted(who.describe() for who in claims.values()))
            raise TableError(f"key map {table.name}: key {example!r} matches several rules: {owners}")


def are_alternatives(rules: list) -> bool:
    """Rules that may claim the same source key: all optional, with different targets (the model holds one)."""
    if not all(isinstance(rule, Regroup) and rule.optional_reason for rule in rules):
        return False
    targets = [tuple(pattern.text for pattern in rule.targets) for rule in rules]
    return len(set(targets)) == len(targets)


@cache
def load_table(name: str) -> KeyMapTable:
    """A table of a key-map root (cogexport's key_maps/ or another, see roots.py), named by its family folder and
    file (e.g. 'cogvideox/sat_transformer')."""
    path = find_key_map_file(f"{name}.toml")
    if path is None:
        raise TableError(f"no key map {name!r} in key_maps/")
    return parse_table(path.read_text(encoding="utf-8"), name)
