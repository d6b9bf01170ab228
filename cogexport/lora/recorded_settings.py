"""Settings a trainer records beside an adapter that change what its matrices mean (SimpleTuner's swiglu_gate_first:
which half of a SwiGLU layer's lora_B rows is the gate), which the keys alone cannot tell.

A family declares them (``[lora] recorded_settings``, each with what it means); each of its layouts says which
recorded values it is the reading of (``reads_settings``: ``"unset"``, ``"true"``, ``"false"``; by default the
setting's absence or false). A file is read only by the layouts that read what it records: a value that none of the
layouts its keys fit reads is refused in one line, never read as if the setting were absent (that would fuse a
silently wrong model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from ..errors import CogExportError
from ..keymap.table import TableError
from ..models.family import ModelFamily

if TYPE_CHECKING:  # strength.py imports the adapter, which imports the tables, which import this
    from .strength import Recorded

UNSET, TRUE, FALSE = "unset", "true", "false"
VALUES = (UNSET, TRUE, FALSE)
READ_BY_DEFAULT = (UNSET, FALSE)  # what a layout that names no setting reads: files made without it


def recorded_value(config: Mapping[str, object], setting: str) -> str | None:
    """The setting as the run recorded it: ``UNSET``, ``TRUE`` or ``FALSE`` (a JSON boolean, 0 / 1, or the words, as
    SimpleTuner's own loader accepts them); None for anything else."""
    if setting not in config:
        return UNSET
    value = config[setting]
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return TRUE if value else FALSE
    if isinstance(value, str) and value.strip().lower() in (TRUE, FALSE):
        return value.strip().lower()
    return None


def reads(family: ModelFamily, layout_reads: Mapping[str, tuple[str, ...]], recorded: Recorded) -> bool:
    """Whether a layout of ``family`` that reads ``layout_reads`` is the reading of what the run recorded."""
    return all(recorded_value(recorded.config, setting) in layout_reads.get(setting, READ_BY_DEFAULT)
               for setting in family.lora_recorded_settings)


def refusal(family: ModelFamily, recorded: Recorded, where: str,
            layouts: Mapping[str, Mapping[str, tuple[str, ...]]]) -> CogExportError:
    """The one line for a file whose keys fit ``layouts`` of the family (name -> what it reads), none of which reads
    what the file records: the first setting the first of them does not read."""
    name, layout_reads = next(iter(layouts.items()))
    for setting, meaning in family.lora_recorded_settings.items():
        value = recorded_value(recorded.config, setting)
        if value in layout_reads.get(setting, READ_BY_DEFAULT):
            continue
        given = f"no {setting}" if value == UNSET else f"{setting} = {recorded.config[setting]!r} ({recorded.where})"
        if value is None:
            return CogExportError(f"{where} records {given}, which is neither true nor false: {meaning}")
        return CogExportError(f"{where} records {given}, which cogexport does not read for {family.name} in the "
                              f"layout its keys are in ({', '.join(layouts)}): {meaning}")
    raise AssertionError(f"{name} reads what the file records")  # the caller found that no layout does


def checked_reads(name: str, family: ModelFamily,
                  layout_reads: Mapping[str, tuple[str, ...]] | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A layout's ``reads_settings``, checked when the tables load: settings of the family's, values of ``VALUES``."""
    for setting, values in (layout_reads or {}).items():
        if setting not in family.lora_recorded_settings:
            raise TableError(f"key map {name}: reads_settings names {setting}, which is not one of {family.name}'s "
                             f"[lora] recorded_settings ({', '.join(family.lora_recorded_settings) or 'none'})")
        if not values or any(value not in VALUES for value in values):
            raise TableError(f"key map {name}: reads_settings {setting} must be a list of {', '.join(VALUES)}")
    return tuple((setting, tuple(values)) for setting, values in (layout_reads or {}).items())
