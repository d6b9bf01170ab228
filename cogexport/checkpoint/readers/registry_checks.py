"""What a reader must be to join the registry, checked when it joins (cogexport's own in the tests, another package's
when its entry point is read, ``register_reader``'s when it is called): each problem in one phrase naming the field.
"""

from __future__ import annotations

import re
from dataclasses import is_dataclass
from typing import Sequence

from ..base import ReaderFacts
from .facts import common_fact_names, fact_defaults
from .reader import Reader

_PHRASES = ("name", "format", "what", "looks_for")
_ONE_ONLY = {"any_file": "reads a file of any name", "spans_folders": "reads a checkpoint spread over folders"}


def problem_with(reader: object, known: Sequence[Reader]) -> str:
    """Why ``reader`` cannot join ``known`` readers, or "" when it can."""
    if not isinstance(reader, Reader):
        return f"it is a {type(reader).__name__}, not a cogexport Reader (cogexport.checkpoint.readers.Reader)"
    for check in (_phrases, _callables, _facts, _file_opening, _patterns):
        problem = check(reader)
        if problem:
            return f"reader {reader.name!r}: {problem}"
    problem = _clash(reader, known)
    return f"reader {reader.name!r}: {problem}" if problem else ""


def _phrases(reader: Reader) -> str:
    empty = [name for name in _PHRASES if not isinstance(getattr(reader, name), str) or not getattr(reader, name)]
    return f"{empty[0]} must be a phrase (a string that is not empty)" if empty else ""


def _callables(reader: Reader) -> str:
    for name in ("claims", "describe", "reads_file", "open_file", "open_several"):
        value = getattr(reader, name)
        if not callable(value) and (value is not None or name in ("claims", "describe")):
            return f"{name} must be a function, not {type(value).__name__}"
    return ""


def _facts(reader: Reader) -> str:
    facts = reader.facts
    if not (isinstance(facts, type) and issubclass(facts, ReaderFacts) and is_dataclass(facts)):
        return "facts must be a dataclass subclassing cogexport.checkpoint.base.ReaderFacts"
    common = sorted(set(fact_defaults(facts)) & set(common_fact_names()))
    if common:
        return f"its fact {common[0]!r} is one of the facts every reader has (CheckpointInfo's); name it apart"
    if len(fact_defaults(facts)) != len(facts.__dataclass_fields__):
        return "every field of its facts needs a default (the value when the reader records nothing)"
    return ""


def _file_opening(reader: Reader) -> str:
    if (reader.reads_file is not None or reader.any_file) and reader.open_file is None:
        return "it reads a file given alone (reads_file or any_file) but has no open_file"
    if reader.open_file is not None and reader.reads_file is None and not reader.any_file:
        return "open_file needs reads_file (which files given alone are its)"
    if reader.spans_folders and reader.open_several is None:
        return "spans_folders needs open_several"
    return ""


def _patterns(reader: Reader) -> str:
    if not all(isinstance(pattern, re.Pattern) for pattern in reader.not_weights):
        return "not_weights must be compiled regular expressions (re.compile)"
    if isinstance(reader.supersedes, str) or isinstance(reader.stands_for_folder, str):
        return "supersedes and stands_for_folder are collections of names, not one string"
    return ""


def _clash(reader: Reader, known: Sequence[Reader]) -> str:
    """A name, format or fact that another reader has already, and the roles only one reader may play."""
    for other in known:
        if other.name == reader.name or other.format == reader.format:
            return f"the reader {other.name!r} (format {other.format!r}) has its name or format already"
        theirs, ours = fact_defaults(other.facts), fact_defaults(reader.facts)
        differ = sorted(name for name in set(theirs) & set(ours) if theirs[name] != ours[name])
        if differ:
            return (f"its fact {differ[0]!r} is the reader {other.name!r}'s too, with another default: a report "
                    "key means one thing; name it apart")
        role = next((role for flag, role in _ONE_ONLY.items() if getattr(reader, flag) and getattr(other, flag)), "")
        if role:
            return f"the reader {other.name!r} {role} already; only one reader may"
    unknown = sorted(set(reader.supersedes) - {other.name for other in known})
    return f"it supersedes {unknown[0]!r}, which is no reader's name" if unknown else ""
