"""The command line's ``--json`` face: exactly one JSON object on stdout per run, on success and on failure, each with
``ok``; the long lists of names a checkpoint's facts hold given as their count and first few unless ``--verbose``.

Scripts read either stream: a failure is also the one ``cogexport: error:`` line on stderr, and the exit code is the
same with or without ``--json``."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import click

# A checkpoint's facts (checkpoint.readers.info_dict: inspect's report, every result's "source") whose values name
# every tensor or file: a 14B model's run lists thousands. Each is given as {"count": N, "first": [...]}.
SUMMARISED = ("trainable", "frozen", "tied", "buffers", "files")
FIRST_NAMES = 5


def summarised_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """``facts`` with each list (or alias -> source mapping) of ``SUMMARISED`` as its count and first names."""
    summary = dict(facts)
    for key in SUMMARISED:
        value = facts.get(key)
        if isinstance(value, list):
            summary[key] = {"count": len(value), "first": value[:FIRST_NAMES]}
        elif isinstance(value, dict):
            summary[key] = {"count": len(value), "first": dict(list(value.items())[:FIRST_NAMES])}
    return summary


def summarised_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """An export's, consolidation's or universal checkpoint's result with its ``source`` summarised."""
    return {**result, "source": summarised_facts(result.get("source") or {})}


def summarised_inspection(report: Mapping[str, Any]) -> dict[str, Any]:
    """inspect's report of a checkpoint (each expert's, for a release of several) summarised; a report of an exported
    folder holds no such lists and is given as it is."""
    if "experts" in report:
        return {**report, "experts": {name: summarised_inspection(expert)
                                      for name, expert in report["experts"].items()}}
    if "output_format" in report:
        return dict(report)
    return summarised_facts(report)


def print_object(ok: bool, body: Mapping[str, Any]) -> None:
    """The run's one JSON object, ``ok`` first."""
    click.echo(json.dumps({"ok": ok, **{k: v for k, v in body.items() if k != "ok"}}, indent=2))


def print_failure(message: str, exit_code: int) -> None:
    """The object of a run that failed (its one-line error already on stderr). Under torchrun only rank 0 prints it,
    as only rank 0 prints a report: a script reads one object whatever the number of processes."""
    if _first_process():
        print_object(False, {"error": message, "exit_code": exit_code})


def _first_process() -> bool:
    """Whether this is the process that speaks for the job: rank 0 of a torchrun job (whose launcher sets RANK), or a
    process alone. Read from the environment, as a failure may come before or after the process joined its job."""
    return (os.environ.get("RANK") or "0") == "0"
