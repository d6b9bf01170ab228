"""A family's LoRA tables: for each layout its adapters come in, the format's key grammar and the key map that names
its modules (the family's original or Diffusers transformer table), plus what the layout says about strength.

A family lists its layouts in family.toml, in the order they are tried, each saying only what differs from its
format's defaults (``LoraFormat.layout``, cogexport/lora/formats.py)::

    [[lora.layout]]
    format = "musubi"                  # the key grammar (cogexport/lora/formats.py)
    modules = "original_transformer"   # names the modules: <module>.weight is matched against its rules
    network_module = "networks.lora_wan"   # kohya metadata: the network module that loads the file

    [[lora.layout]]
    format = "comfyui"
    name = "simpletuner_comfyui_lora"  # the table's name when not the format's (wan/comfyui_lora)
    modules = "diffusers_transformer"
    description = "SimpleTuner ComfyUI-format Wan LoRA"
    source = "SimpleTuner LoRA, lora_format comfyui (diffusion_model. + Diffusers names, lora_A / lora_B, .alpha)"
    writes = false                     # the format's own layout writes it: this one only reads

A table with rules of its own (SAT's LoraMixin) is a file, ``[[lora.layout]] file = "sat_lora"``: a key map with
``[lora]`` settings beside its rules, which translates the whole checkpoint into Diffusers names itself. The fields
of both are declared in cogexport/keymap/table_fields.py (LoraSettings, LoraLayout).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache
from typing import Mapping

from ..keymap.table import KeyMapTable, TableError, load_table, parse_table
from ..keymap.table_fields import LoraLayout, LoraSettings, given
from ..models.family import ModelFamily, families, family_named, table_name
from .formats import FORMATS, LoraFormat
from .recorded_settings import checked_reads


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
    # the recorded settings' values the layout reads, by setting (recorded_settings.py); a setting not here: its
    # absence or false
    reads_settings: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def default_alpha_for(self, rank: int) -> float:
        return float(rank) if self.default_alpha == "rank" else float(self.default_alpha)


def _format(settings: LoraSettings, name: str) -> LoraFormat:
    if settings.format not in FORMATS:
        raise TableError(f"key map {name}: [lora] format must be one of {', '.join(FORMATS)}")
    return FORMATS[settings.format]


def _resolved(settings: LoraSettings, fmt: LoraFormat) -> LoraLayout:
    """The settings over the format's defaults (``given`` drops the fields left out)."""
    return replace(fmt.layout, **{name: value for name, value in given(settings).items()
                                  if name in {spec.name for spec in fields(LoraLayout)}})


def _made(name: str, description: str, source: str, family: ModelFamily, fmt: LoraFormat, layout: LoraLayout,
          keymap: KeyMapTable | None) -> LoraTable:
    made = LoraTable(
        name=name, description=description, source=source, family=family, format=fmt,
        modules=load_table(layout.modules) if layout.modules is not None else None, keymap=keymap,
        default_alpha=_or(layout.default_alpha, "rank"), default_alpha_reason=_or(layout.default_alpha_reason, ""),
        alpha_recorded=bool(layout.alpha_recorded), writes=bool(layout.writes), network_module=layout.network_module,
        write_lora_ab=bool(layout.write_lora_ab), reads_settings=checked_reads(name, family, layout.reads_settings),
    )
    _check_writes(made)
    return made


def _or(value, default):
    return default if value is None else value


def _from_file(table: KeyMapTable, family: ModelFamily) -> LoraTable:
    """A LoRA table file (SAT's, or one given to register_format): its [table] and [lora] say what it is."""
    settings = table.lora or LoraSettings()
    fmt = _format(settings, table.name)
    has_rules = bool(table.rules or table.fallback)
    if has_rules == (settings.modules is not None):
        raise TableError(f"key map {table.name}: a LoRA table either names its modules with [lora] modules or has "
                         "rules")
    return _made(table.name, table.description, table.source, family, fmt, _resolved(settings, fmt),
                 table if has_rules else None)


def _from_layout(layout: LoraLayout, family: ModelFamily) -> LoraTable:
    """A layout of the family's family.toml, over its format's defaults."""
    if layout.file is not None:
        return _from_file(load_table(layout.file), family)
    where = f"{family.key}/{layout.name or layout.format or 'layout'}"
    fmt = _format(layout, where)
    resolved = _resolved(layout, fmt)
    if resolved.name is None:
        raise TableError(f"key map {where}: [[lora.layout]] of format {fmt.name} needs a name (the format has none)")
    return _made(f"{family.key}/{resolved.name}", (resolved.description or "").format(family=family.name),
                 (resolved.source or "").format(family=family.name), family, fmt, resolved, None)


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


def _check_one_writer(tables: list[LoraTable]) -> None:
    """One table per family and format writes it (--lora-format would not know which to take)."""
    seen: dict[tuple[str, str], str] = {}
    for table in tables:
        if table.writes:
            first = seen.setdefault((table.family.key, table.format.name), table.name)
            if first != table.name:
                raise TableError(f"key map {table.name}: {first} writes {table.format.name} files for its family "
                                 "already; give the other layouts writes = false")


@cache
def _family_tables(known: tuple[ModelFamily, ...]) -> tuple[LoraTable, ...]:
    """The LoRA tables the families name (keyed by the families: a key-map root added later brings its own)."""
    made = [_from_layout(layout, family) for family in known for layout in family.lora_layouts]
    _check_one_writer(made)
    return tuple(made)


_REGISTERED: list[LoraTable] = []


def lora_tables() -> tuple[LoraTable, ...]:
    """Every family's LoRA tables, in family order, then those registered with a format (formats.register_format)."""
    return (*_family_tables(families()), *_REGISTERED)


def register_tables(tables: Mapping[str, str | LoraLayout]) -> None:
    """Add tables by the key of the family each is for (checked as the shipped ones are): a layout as family.toml
    gives one (its format's defaults apply), or the TOML text of a LoRA table file ([table] and [lora])."""
    made = []
    for key, table in tables.items():
        family = family_named(key)
        if isinstance(table, LoraLayout):
            modules = table_name(key, table.modules) if table.modules is not None else None
            made.append(_from_layout(replace(table, modules=modules), family))
        else:
            made.append(_from_file(parse_table(table, f"{key}/registered"), family))
    known = {t.name for t in lora_tables()}
    clash = [t.name for t in made if t.name in known]
    if clash:
        raise TableError(f"key map {clash[0]}: a LoRA table of that name exists already")
    _check_one_writer([*lora_tables(), *made])
    _REGISTERED.extend(made)


def output_table(family: ModelFamily, format_name: str) -> LoraTable | None:
    """The table a family's adapters are written with in this format, if the family has one."""
    return next((t for t in lora_tables()
                 if t.family.key == family.key and t.writes and t.format.name == format_name), None)


def unregister_tables(format_name: str) -> None:
    """Take back the registered tables of a format."""
    _REGISTERED[:] = [table for table in _REGISTERED if table.format.name != format_name]
