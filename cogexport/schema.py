"""The one reader of cogexport's TOML tables (family.toml, key maps, LoRA layouts, quantized.toml): each table kind
declares its fields once, as a frozen dataclass whose fields are made with ``declared`` (a description for the docs,
a default or none when the field is required, the TOML key when it is not the field's name), and ``read`` turns a
parsed TOML table into that dataclass, refusing an unknown field, a missing one or a value of the wrong type with the
dotted place it is at (``unknown field [gguf] keep_f16``). The parsers keep only what a type cannot say (rules that
overlap, placeholders, writer names); ``scripts/table_reference.py`` writes the docs' field tables from the same
declarations, so neither can drift from the other.

Field types: ``str``, ``int``, ``float`` (an integer too), ``bool``, ``Any``, ``dict`` (any table, kept as TOML gave
it), ``dict[str, X]``, ``tuple[X, ...]`` (a TOML array, read as a tuple), another declaration (a table), and unions of
these (``str | None``: optional, no value). This module imports nothing of cogexport's: every package may use it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, Mapping, TypeVar

T = TypeVar("T")
_DOC, _KEY, _REST = "doc", "toml_key", "rest"


class SchemaError(ValueError):
    """A table does not fit its declaration; the message names the place (``[gguf] keep_f16``), the caller the file."""


def declared(doc: str, default: Any = dataclasses.MISSING, *, key: str | None = None, rest: bool = False) -> Any:
    """A field of a declaration: what it means (the docs' field tables print it), its default (none: required), its
    TOML key when that is no Python name (``from``, ``class``). A ``rest`` field, a ``dict[str, X]``, takes every key
    the declaration does not name (family.toml's component sections), each read as X."""
    metadata = {_DOC: doc, _KEY: key, _REST: rest}
    if rest:
        return dataclasses.field(default_factory=dict, metadata=metadata)
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One field of a declaration as the reader and the docs see it."""

    name: str  # the Python name
    key: str  # the TOML key
    hint: Any  # the resolved type
    doc: str
    required: bool
    default: Any
    rest: bool


@cache
def declared_fields(declaration: type) -> tuple[FieldSpec, ...]:
    hints = typing.get_type_hints(declaration)
    found = []
    for spec in dataclasses.fields(declaration):
        required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        found.append(FieldSpec(spec.name, spec.metadata.get(_KEY) or spec.name, hints[spec.name],
                              spec.metadata.get(_DOC, ""), required, None if required else default,
                              bool(spec.metadata.get(_REST))))
    return tuple(found)


def read(declaration: type[T], data: Any, place: tuple[str, ...] = ()) -> T:
    """``data`` (a table of a parsed TOML file) as ``declaration``; ``place`` is the table's keys from the top (an
    array's entry as ``name #n``), for messages."""
    if not isinstance(data, Mapping):
        raise SchemaError(f"{header(place) or 'the file'} must be a table, not {kind_of(data)}")
    fields = declared_fields(declaration)
    rest = next((f for f in fields if f.rest), None)
    known = {f.key for f in fields if not f.rest}
    if rest is None:
        for key in data:
            if key not in known:
                raise unknown_field(place, key, data[key])
    values: dict[str, Any] = {}
    for spec in fields:
        if spec.rest:
            value_hint = typing.get_args(spec.hint)[1]
            values[spec.name] = {key: convert(value, value_hint, place, key)
                                 for key, value in data.items() if key not in known}
        elif spec.key in data:
            values[spec.name] = convert(data[spec.key], spec.hint, place, spec.key)
        elif spec.required:
            raise SchemaError(f"{header(place)} needs {spec.key}" if place else f"[{spec.key}] is missing")
    return declaration(**values)


def unknown_field(place: tuple[str, ...], key: str, value: Any = None) -> SchemaError:
    """The error for a key the declaration does not have (also for a parser's own check of keys it reads itself)."""
    if not place:
        return SchemaError(f"unknown section [{key}]" if isinstance(value, (dict, list)) else f"unknown field {key}")
    return SchemaError(f"unknown field {header(place)} {key}")


def convert(value: Any, hint: Any, place: tuple[str, ...], key: str) -> Any:
    """The value of ``key`` in the table at ``place``, checked against ``hint``: arrays become tuples, tables of a
    declaration its dataclass."""
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return read(hint, value, (*place, key))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for alternative in args:
            if fits(value, alternative):
                return convert(value, alternative, place, key)
    elif origin is tuple and isinstance(value, list):
        return tuple(convert(item, args[0], place, f"{key} #{index + 1}") for index, item in enumerate(value))
    elif origin is dict and isinstance(value, dict):
        return {name: convert(item, args[1], (*place, key), name) for name, item in value.items()}
    elif fits(value, hint):
        return value
    where = f"{header(place)} {key}" if place else key
    raise SchemaError(f"{where} must be {described(hint)}, not {kind_of(value)}")


def fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of ``hint``'s kind (its items are checked when it is converted)."""
    origin = typing.get_origin(hint) or hint
    if hint is Any:
        return True
    if dataclasses.is_dataclass(hint) or origin is dict:
        return isinstance(value, dict)
    if origin is tuple:
        return isinstance(value, list)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, alternative) for alternative in typing.get_args(hint))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def header(place: tuple[str, ...]) -> str:
    """A table's place as TOML writes its header: ``[gguf.roles]``; an array's entry with its number:
    ``[[variant]] #2``."""
    if not place:
        return ""
    *outer, last = place
    if " #" in last:
        name, number = last.rsplit(" #", 1)
        return f"[[{'.'.join((*outer, name))}]] #{number}"
    return f"[{'.'.join(place)}]"


_NAMES = {str: ("a string", "strings"), int: ("an integer", "integers"), float: ("a number", "numbers"),
          bool: ("true or false", "true / false values"), dict: ("a table", "tables")}


def described(hint: Any, plural: bool = False) -> str:
    """A type in words, as the messages and the docs' field tables say it: ``a list of strings``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint) or origin is dict:
        return "tables" if plural else "a table"
    if origin is tuple:
        return "lists" if plural else f"a list of {described(args[0], plural=True)}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(described(a, plural) for a in args if a is not type(None))
    if hint is Any:
        return "values" if plural else "any value"
    return _NAMES[hint][plural]


def kind_of(value: Any) -> str:
    """What a TOML value is, in words, with the value when it is short."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return str(value).lower()
    words = next((words[0] for kind, words in _NAMES.items() if type(value) is kind), type(value).__name__)
    shown = repr(value)
    return f"{words} {shown}" if len(shown) <= 40 else words
