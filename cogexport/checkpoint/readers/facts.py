"""A checkpoint's facts as one flat dict: what ``inspect --json`` prints and every result keeps as its ``source``. The
facts every reader has, then each reader's own facts by name (this checkpoint's reader's values, every other
reader's defaults), so one script reads the report of any format alike; and the way back, a reader's facts from a
report, for the text ``inspect`` prints."""

from __future__ import annotations

import copy
from dataclasses import MISSING, fields
from typing import Any, Iterable, Mapping

from ..base import CheckpointInfo, ReaderFacts
from .reader import Reader

# The flat dict's keys in the order inspect --json and the results' "source" have always given them (users' scripts
# and diffs read them); the facts of readers added since follow, in registry order.
KEY_ORDER = ("format", "paths", "tag", "tags", "step", "stage", "training_dtype", "world_size", "weights_source",
             "ds_version", "trainable", "frozen", "tied", "buffers", "client_state", "files", "problems", "notes",
             "metadata", "writer", "contents", "origin", "picked")


def common_fact_names() -> list[str]:
    """The facts every reader has: CheckpointInfo's fields but the reader's own."""
    return [f.name for f in fields(CheckpointInfo) if f.name != "facts"]


def fact_defaults(facts: type[ReaderFacts]) -> dict[str, Any]:
    """Each of a facts class's fields with its value when the reader records nothing."""
    return {f.name: f.default if f.default is not MISSING else f.default_factory()
            for f in fields(facts) if f.default is not MISSING or f.default_factory is not MISSING}


def flatten(info: CheckpointInfo, every: Iterable[Reader]) -> dict[str, Any]:
    """``info`` flattened, with the keys of the facts of ``every`` reader."""
    flat = {name: getattr(info, name) for name in common_fact_names()}
    for reader in every:
        for name, default in fact_defaults(reader.facts).items():
            flat.setdefault(name, default)
    flat.update({f.name: getattr(info.facts, f.name) for f in fields(info.facts)})
    ordered = {key: flat.pop(key) for key in KEY_ORDER if key in flat}
    return copy.deepcopy({**ordered, **flat})


def facts_of_report(reader: Reader, report: Mapping[str, Any]) -> ReaderFacts:
    """The reader's facts as a report (``flatten``) holds them."""
    return reader.facts(**{f.name: report[f.name] for f in fields(reader.facts) if f.init and f.name in report})
