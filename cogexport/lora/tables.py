"""A family's LoRA tables: for each file format a trainer writes, the format's key grammar and the key map that names
its modules (the family's original or Diffusers transformer table), plus what the format says about strength.

``key_maps/<family>/<format>_lora.toml``::

    [table]
    name = "wan/musubi_lora"
    description = ...
    source = ...                       # what the file is, for inspect

    [lora]
    format = "musubi"                  # the key grammar (cogexport/lora/formats.py)
    modules = "wan/original_transformer"   # names the modules: <module>.weight is matched against its rules
    writes = true                      # --lora-format musubi writes this family's adapters with this table
    default_alpha = "rank"             # when nothing records alpha: a number, or "rank" (scale 1)
    default_alpha_reason = "..."
    alpha_recorded = true              # whether that default is what the format means (no warning) or a guess
    network_module = "networks.lora_wan"   # kohya metadata: the network module that loads the file
    write_lora_ab = true               # write lora_A / lora_B where the format's own names are lora_down / lora_up
                                       # (ComfyUI reads both; some other loader of the family only the former)

A table with rules of its own (SAT's LoraMixin) translates the whole checkpoint into Diffusers names itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Mapping

from ..keymap.table import KeyMapTable, TableError, load_table, parse_table
from ..keymap.table_fields import LoraSettings
from ..models.family import ModelFamily, families, family_named
from .formats import FORMATS, LoraFormat


@dataclass(frozen=True)
class LoraTable:
    name: str
    description: str
    source: str
    family: ModelFamily
    format: LoraFormat
    modules: KeyMapTable | None  # names the modules in the file's naming; None: ``keymap`` yields Diffusers names
    keymap: KeyMapTable | None  # a whole-checkpoint translation (SAT), else None
    default_alpha: float | str  # a number, or "rank"
    default_alpha_reason: str
    alpha_recorded: bool
    writes: bool
    network_module: str | None
    write_lora_ab: bool = False

    def default_alpha_for(self, rank: int) -> float:
        return float(rank) if self.default_alpha == "rank" else float(self.default_alpha)


def _load(name: str, family: ModelFamily, table: KeyMapTable | None = None) -> LoraTable:
    table = table or load_table(name)
    spec = table.lora or LoraSettings()
    if spec.format not in FORMATS:
        raise TableError(f"key map {name}: [lora] format must be one of {', '.join(FORMATS)}")
    has_rules = bool(table.rules or table.fallback)
    if has_rules == (spec.modules is not None):
        raise TableError(f"key map {name}: a LoRA table either names its modules with [lora] modules or has rules")
    made = LoraTable(
        name=table.name, description=table.description, source=table.source, family=family,
        format=FORMATS[spec.format],
        modules=load_table(spec.modules) if spec.modules is not None else None,
        keymap=table if has_rules else None,
        default_alpha=_given(spec.default_alpha, "rank"), default_alpha_reason=_given(spec.default_alpha_reason, ""),
        alpha_recorded=bool(spec.alpha_recorded), writes=bool(spec.writes),
        network_module=spec.network_module, write_lora_ab=bool(spec.write_lora_ab),
    )
    _check_writes(made)
    return made


def _given(value, default):
    return default if value is None else value


def _check_writes(table: LoraTable) -> None:
    """A table that writes its format has what writing it needs (found when the tables load, not mid-export)."""
    if not table.writes:
        return
    fmt = table.format
    if not fmt.writable:
        raise TableError(f"key map {table.name}: [lora] writes = true, but cogexport writes no {fmt.title} files")
    if table.modules is None:
        raise TableError(f"key map {table.name}: a table that writes names its modules with [lora] modules")
    if fmt.kohya_metadata and not table.network_module:
        raise TableError(f"key map {table.name}: --lora-format {fmt.name} writes ss_network_module; give [lora] "
                         "network_module")


@cache
def _family_tables(known: tuple[ModelFamily, ...]) -> tuple[LoraTable, ...]:
    """The LoRA tables the families name (keyed by the families: a key-map root added later brings its own)."""
    return tuple(_load(name, family) for family in known for name in family.lora_tables)


_REGISTERED: list[LoraTable] = []


def lora_tables() -> tuple[LoraTable, ...]:
    """Every family's LoRA tables, in family order, then those registered with a format (formats.register_format)."""
    return (*_family_tables(families()), *_REGISTERED)


def register_tables(tables: Mapping[str, str]) -> None:
    """Add tables given as TOML text, by the key of the family each is for (checked as the shipped ones are)."""
    made = []
    for key, text in tables.items():
        table = parse_table(text, f"{key}/registered")
        made.append(_load(table.name, family_named(key), table))
    known = {t.name for t in lora_tables()}
    clash = [t.name for t in made if t.name in known]
    if clash:
        raise TableError(f"key map {clash[0]}: a LoRA table of that name exists already")
    _REGISTERED.extend(made)


def output_table(family: ModelFamily, format_name: str) -> LoraTable | None:
    """The table a family's adapters are written with in this format, if the family has one."""
    return next((t for t in lora_tables()
                 if t.family.key == family.key and t.writes and t.format.name == format_name), None)


def unregister_tables(format_name: str) -> None:
    """Take back the registered tables of a format."""
    _REGISTERED[:] = [table for table in _REGISTERED if table.format.name != format_name]
