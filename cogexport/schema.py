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
from typing import Any, Callable, TypeVar

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
    # a declaration module without ``from __future__ import annotations`` holds its types as objects, which spares
    # evaluating their text each time a process first loads its tables
    strings = any(isinstance(spec.type, str) for spec in dataclasses.fields(declaration))
    hints = typing.get_type_hints(declaration) if strings else {spec.name: spec.type
                                                                 for spec in dataclasses.fields(declaration)}
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
    if not isinstance(data, dict):
        raise SchemaError(f"{header(place) or 'the file'} must be a table, not {kind_of(data)}")
    by_key, required, rest = _layout(declaration)
    values: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, value in data.items():  # a table gives few of its declaration's fields: walk what it gives
        spec = by_key.get(key)
        if spec is not None:
            values[spec.name] = _converter(spec.hint)(value, place, key)
        elif rest is None:
            raise unknown_field(place, key, value)
        else:
            others[key] = value
    for spec in required:
        if spec.name not in values:
            raise SchemaError(f"{header(place)} needs {spec.key}" if place else f"[{spec.key}] is missing")
    if rest is not None:
        convert_one = _converter(typing.get_args(rest.hint)[1])
        values[rest.name] = {key: convert_one(value, place, key) for key, value in others.items()}
    return declaration(**values)


@cache
def _layout(declaration: type) -> tuple[dict[str, FieldSpec], tuple[FieldSpec, ...], FieldSpec | None]:
    """A declaration's named fields by their TOML keys, the required ones, and its ``rest`` field if it has one."""
    named = {spec.key: spec for spec in declared_fields(declaration) if not spec.rest}
    rest = next((spec for spec in declared_fields(declaration) if spec.rest), None)
    return named, tuple(spec for spec in named.values() if spec.required), rest


def unknown_field(place: tuple[str, ...], key: str, value: Any = None) -> SchemaError:
    """The error for a key the declaration does not have (also for a parser's own check of keys it reads itself)."""
    if not place:
        return SchemaError(f"unknown section [{key}]" if isinstance(value, (dict, list)) else f"unknown field {key}")
    return SchemaError(f"unknown field {header(place)} {key}")


def convert(value: Any, hint: Any, place: tuple[str, ...], key: str) -> Any:
    """The value of ``key`` in the table at ``place``, checked against ``hint``: arrays become tuples, tables of a
    declaration its dataclass."""
    return _converter(hint)(value, place, key)


Converter = Callable[[Any, tuple, str], Any]


@cache
def _converter(hint: Any) -> Converter:
    """The function that checks and converts a value of ``hint`` (made once per type: tables load per export)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return lambda value, place, key: value
    if dataclasses.is_dataclass(hint):
        return _checked(hint, lambda value, place, key: read(hint, value, (*place, key)))
    if origin in (typing.Union, types.UnionType):
        alternatives = [(_fitter(alternative), _converter(alternative)) for alternative in args]

        def one_of(value: Any, place: tuple, key: str) -> Any:
            for fit, convert_to in alternatives:
                if fit(value):
                    return convert_to(value, place, key)
            raise _wrong(hint, value, place, key)
        return one_of
    if origin is tuple:
        item = _converter(args[0])
        if args[0] in _NAMES:  # arrays of plain values (most are of strings) need no converting: one pass checks them
            fit = _fitter(args[0])
            return _checked(hint, lambda value, place, key: tuple(value) if all(map(fit, value)) else tuple(
                item(entry, place, f"{key} #{index + 1}") for index, entry in enumerate(value)))
        return _checked(hint, lambda value, place, key: tuple(item(entry, place, f"{key} #{index + 1}")
                                                              for index, entry in enumerate(value)))
    if origin is dict:
        item = _converter(args[1])
        return _checked(hint, lambda value, place, key: {name: item(entry, (*place, key), name)
                                                         for name, entry in value.items()})
    return _checked(hint, lambda value, place, key: value)


def _checked(hint: Any, convert_checked: Converter) -> Converter:
    fit = _fitter(hint)

    def checked(value: Any, place: tuple, key: str) -> Any:
        if not fit(value):
            raise _wrong(hint, value, place, key)
        return convert_checked(value, place, key)
    return checked


def _wrong(hint: Any, value: Any, place: tuple[str, ...], key: str) -> SchemaError:
    where = f"{header(place)} {key}" if place else key
    return SchemaError(f"{where} must be {described(hint)}, not {kind_of(value)}")


@cache
def _fitter(hint: Any) -> Callable[[Any], bool]:
    """Whether a value is of ``hint``'s kind (its items are checked when it is converted)."""
    origin = typing.get_origin(hint) or hint
    if hint is Any:
        return lambda value: True
    if hint in (int, float):
        kinds = (int, float) if hint is float else int
        return lambda value: isinstance(value, kinds) and not isinstance(value, bool)
    if origin in (typing.Union, types.UnionType):
        alternatives = [_fitter(alternative) for alternative in typing.get_args(hint)]
        return lambda value: any(fit(value) for fit in alternatives)
    kind = dict if dataclasses.is_dataclass(hint) else list if origin is tuple else origin
    return lambda value: isinstance(value, kind)


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
