"""Dotted key patterns with named placeholders, e.g. ``transformer.layers.{i}.attention.dense.{p}``.

Each placeholder's kind is declared once per table: ``int`` (digits), ``name`` (one dotted component),
``path`` (one or more components) or a list of literal alternatives. A placeholder used twice in one pattern
must take the same value both times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

KINDS = {"int": r"\d+", "name": r"[^.]+", "path": r".+"}
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class PatternError(ValueError):
    """A pattern or placeholder declaration is malformed (a bug in a key-map table)."""


def placeholder_regex(kind: str | list[str]) -> str:
    if isinstance(kind, list):
        if not kind or not all(isinstance(option, str) and option for option in kind):
            raise PatternError(f"placeholder alternatives must be non-empty strings: {kind!r}")
        return "|".join(re.escape(option) for option in sorted(kind, key=len, reverse=True))
    if kind not in KINDS:
        raise PatternError(f"unknown placeholder kind {kind!r} (use int, name, path or a list of literals)")
    return KINDS[kind]


@dataclass(frozen=True)
class KeyPattern:
    text: str
    kinds: Mapping[str, str | list[str]] = field(compare=False, repr=False)

    def __post_init__(self) -> None:
        names = _PLACEHOLDER.findall(self.text)
        unknown = sorted(set(names) - set(self.kinds))
        if unknown:
            raise PatternError(f"pattern {self.text!r} uses undeclared placeholder(s) {', '.join(unknown)}")
        parts, seen, position = [], set(), 0
        for found in _PLACEHOLDER.finditer(self.text):
            parts.append(re.escape(self.text[position:found.start()]))
            name = found.group(1)
            if name in seen:
                parts.append(f"(?P={name})")
            else:
                parts.append(f"(?P<{name}>{placeholder_regex(self.kinds[name])})")
                seen.add(name)
            position = found.end()
        parts.append(re.escape(self.text[position:]))
        object.__setattr__(self, "_regex", re.compile("".join(parts)))
        object.__setattr__(self, "names", tuple(dict.fromkeys(names)))

    def match(self, key: str) -> dict[str, str] | None:
        found = self._regex.fullmatch(key)
        return found.groupdict() if found else None

    def format(self, values: Mapping[str, str]) -> str:
        return _PLACEHOLDER.sub(lambda found: str(values[found.group(1)]), self.text)

    def example(self) -> str:
        """A key this pattern matches, for spotting overlapping rules when a table is loaded."""
        samples = {}
        for name in self.names:
            kind = self.kinds[name]
            samples[name] = kind[0] if isinstance(kind, list) else {"int": "0", "name": "x", "path": "x.y"}[kind]
        return self.format(samples)
