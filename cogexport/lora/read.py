"""Reading an adapter: which family and layout a LoRA file or run is, from its names alone (every key must fit the
layout's grammar and every module must be a layer of the family's transformer), then its modules under Diffusers
names, each with its alpha.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Iterable, Mapping

import torch

from ..errors import CogExportError
from ..keymap.plan import match_key, plan_translation, translate_shapes
from ..lazy import LazyTensor
from ..models.family import ModelFamily, family_named
from ..models.target import build_target
from . import lycoris
from .adapter import LoraAdapter, LoraModule
from .fuse import misfits
from .modules import rule_of, translate_modules
from .names import blocks_needed, decode_kohya, names_counts, names_schema
from .parts import ALPHA, BASE_BIAS, BASE_WEIGHT
from .recorded_settings import reads, refusal
from .strength import DIFFUSERS_METADATA, Recorded, Strength, recorded_config, set_strengths, whole_w2_rule
from .tables import LoraTable, lora_tables
from .unread import unread_adapter

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _listing(names: list[str], limit: int = 3) -> str:
    return ", ".join(names[:limit]) + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


@dataclass
class _Layout:
    """A file's keys as one table reads them."""

    table: LoraTable
    tensors: Mapping[str, LazyTensor]  # by key (a key map's output names, for a table with rules)
    modules: dict[str, dict[str, str]]  # module, in the file's naming -> part -> key
    plain: dict[str, str]  # base weight name, in the file's naming -> key
    unknown: list[str]
    component: str | None = None  # the pipeline component the keys name (a format with component_prefix)
    source: dict[str, LoraModule] = field(default_factory=dict)  # built: modules in the table's module naming
    alpha_keys: dict[str, str] = field(default_factory=dict)
    modules_out: dict[str, LoraModule] = field(default_factory=dict)  # built: Diffusers names
    origins: dict[str, list[str]] = field(default_factory=dict)
    # How far building got, and how many of the file's modules are the family's layers: when no layout fits, the
    # one that got furthest says best what is wrong with the file (a Wan file's mismatched ranks, rather than its
    # names being no HunyuanVideo layer's).
    stage: int = 0
    known: int = 0


def _layouts(source: Mapping[str, LazyTensor],
             where: str) -> tuple[list[_Layout], list[tuple[tuple[int, int], CogExportError]]]:
    """Every table whose grammar the keys fit, and why a table that recognised them could not read them (with how far
    that got: as far as keys that all fit a layout)."""
    keys = list(source)
    found, problems = [], []
    for table in lora_tables():
        tensors = source
        if table.keymap is not None:
            if not table.keymap.recognises(table.keymap.select(keys)[0]):
                continue
            try:
                tensors = plan_translation(table.keymap, source, None, {}, what=where).tensors
            except CogExportError as error:
                problems.append(((1, 0), error, table.family.key))
                continue
        component = table.format.component_in(tensors, table.family.transformer_folders, where)
        split = table.format.split(tensors, component)
        if split is None:
            continue
        parsed, unknown = split
        modules: dict[str, dict[str, str]] = {}
        plain: dict[str, str] = {}
        for key, (module, part) in parsed.items():
            if part is None:
                plain[module] = key
            elif part in (BASE_WEIGHT, BASE_BIAS):
                plain[f"{module}.{part.rsplit('.', 1)[1]}"] = key
            else:
                modules.setdefault(module, {})[part] = key
        found.append(_Layout(table, tensors, modules, plain, unknown, component))
    return found, problems


def _build(layout: _Layout, where: str) -> None:
    """The layout's modules under Diffusers names, checked against the family's layers (no alphas yet)."""
    table, family = layout.table, layout.table.family
    if layout.unknown:
        raise CogExportError(f"{where}: {len(layout.unknown)} key(s) are not part of a {table.format.title} LoRA: "
                             f"{_listing(layout.unknown)}")
    layout.stage = 1
    names = list(layout.modules)
    decoded = decode_kohya(table, names) if table.format.encoded else {name: name for name in names}
    unknown = [name for name, module in decoded.items() if module is None or not _names_a_layer(table, module)]
    layout.known = len(names) - len(unknown)
    if unknown:
        raise CogExportError(f"{where}: {table.format.prefix}{unknown[0]} names no layer of a {family.name} "
                             "transformer")
    layout.stage = 2
    for name, parts in layout.modules.items():
        module = LoraModule().with_parts({part: layout.tensors[key] for part, key in parts.items() if part != ALPHA})
        _check_module(module, table.format.prefix + name, where)
        layout.source[decoded[name]] = module
        if ALPHA in parts:
            layout.alpha_keys[decoded[name]] = parts[ALPHA]
    layout.stage = 3
    if table.modules is not None:
        layout.modules_out, layout.origins = translate_modules(layout.source, table.modules, where)
    else:
        layout.modules_out, layout.origins = dict(layout.source), {name: [name] for name in layout.source}
    layout.stage = 4
    schema = names_schema(family, blocks_needed(layout.modules_out))
    for target, module in layout.modules_out.items():
        weight = schema.get(f"{target}.weight")
        if module.kind is not None and (weight is None or len(weight) != 2):
            raise CogExportError(f"{where}: the adapter of {layout.origins[target][0]} is not on a linear layer of a "
                                 f"{family.name} transformer")
        if module.kind is None and f"{target}.weight" not in schema and f"{target}.bias" not in schema:
            raise CogExportError(f"{where}: {layout.origins[target][0]} is not a layer of a {family.name} transformer")
    foreign = _foreign_weights(layout, schema)
    if foreign:
        raise CogExportError(f"{where}: the model's own weights beside the adapter are not a {family.name} "
                             f"transformer's: {_listing(foreign)}")


def _names_a_layer(table: LoraTable, module: str) -> bool:
    """Whether the table's key map names this module: by a rule of its own, or for a table that only keeps the
    names (Diffusers names), by the module being one of the family's layers; so too a name a table leaves to a
    fallback that keeps names (a table of one half swap, Diffusers' names for the rest), which would
    otherwise claim every name."""
    if table.modules is None:
        return True
    found = rule_of(table.modules, module)
    if found is None:
        return False
    fallback = table.modules.fallback
    left_to_fallback = not any(rule is found[0] for rule in table.modules.rules)
    if not (table.modules.renames_nothing or left_to_fallback and fallback is not None and fallback.renames_nothing):
        return True
    schema = names_schema(table.family, blocks_needed([module]))
    return f"{module}.weight" in schema or f"{module}.bias" in schema


def _foreign_weights(layout: _Layout, schema: Mapping[str, torch.Size]) -> list[str]:
    """The base weights a wrapped model saved beside its adapters that are no tensor of the family's transformer
    (compared by name with block indices left out: the adapter does not say how many blocks the model has)."""
    table = layout.table
    if not layout.plain or table.modules is None:  # a whole-run key map (SAT) checks the base weights itself
        return []
    shapes = {name: layout.tensors[key].shape for name, key in layout.plain.items()}
    unknown = [name for name in shapes if not match_key(table.modules, name)]
    known = {_INDEX.sub("#", name) for name in schema}
    translated = translate_shapes(table.modules, {n: s for n, s in shapes.items() if n not in unknown})
    return unknown + [name for name in translated if _INDEX.sub("#", name) not in known]


def _check_module(module: LoraModule, name: str, where: str) -> None:
    """A module's parts make one adapter, complete and of matching shapes."""
    if module.factors:
        if module.down is not None or module.up is not None:
            raise CogExportError(f"{where}: {name} has both LoRA matrices and LyCORIS factors; one module has one "
                                 "adapter")
        try:
            lycoris.kind_of(module.factors)
        except ValueError:
            raise CogExportError(f"{where}: {name} has both LoKr and LoHa factors; one module has one "
                                 "adapter") from None
        lycoris.check_factors(module.factors, name, where)
        if module.bias is not None or module.magnitude is not None:
            raise CogExportError(f"{where}: {name} has LoRA bias or DoRA tensors beside LyCORIS factors")
        return
    _check_pair(module, name, where)


def _check_pair(module: LoraModule, name: str, where: str) -> None:
    if (module.down is None) != (module.up is None):
        has, lacks = ("lora_A", "lora_B") if module.up is None else ("lora_B", "lora_A")
        raise CogExportError(f"{where}: {name} has a {has} but no {lacks}")
    if module.down is None:
        if module.bias is not None or module.magnitude is not None:
            raise CogExportError(f"{where}: {name} has LoRA bias or DoRA tensors but no lora_A / lora_B")
        return
    down, up = module.down.shape, module.up.shape
    if len(down) != 2 or len(up) != 2 or down[0] != up[1]:
        raise CogExportError(f"{where}: the ranks of {name} differ between its matrices: lora_A (down) "
                             f"{tuple(down)}, lora_B (up) {tuple(up)} (expected [r, in] and [out, r])")


def _choose(source: Mapping[str, LazyTensor], where: str, family: ModelFamily | None,
            recorded: Recorded) -> _Layout:
    unread = unread_adapter(list(source))
    if unread:
        raise CogExportError(f"{where} is {unread}")
    layouts, problems = _layouts(source, where)
    fitting = []
    for layout in layouts:
        try:
            _build(layout, where)
        except CogExportError as error:
            problems.append(((layout.stage, layout.known), error, layout.table.family.key))
        else:
            fitting.append(layout)
    if family is not None and len({f.table.family.key for f in fitting}) > 1:
        # the base's own layouts, else those of the families its model extends (a HunyuanVideo LoRA, whose names
        # HunyuanVideo 1.5's share, on a FramePack base)
        fitting = [f for f in fitting if f.table.family.key == family.key] or \
            [f for f in fitting if f.table.family.key in family.extends]
    if len({f.table.family.key for f in fitting}) > 1:
        # names several families share (CogVideoX's and LTX-Video's transformer_blocks.0.attn1.to_q): the layer
        # sizes of the published models tell them apart
        released = [f for f in fitting if _fits_a_release(f)]
        if len({f.table.family.key for f in released}) == 1:
            fitting = released
    fitting = _reading_what_it_records(fitting, recorded, where)
    if len(fitting) > 1 and len({_reading(f) for f in fitting}) == 1:
        fitting = fitting[:1]  # several layouts read the file alike (names two namings share): any of them will do
    if len(fitting) == 1:
        return fitting[0]
    if len({f.table.family.key for f in fitting}) > 1:
        names = sorted({f.table.family.name for f in fitting})
        raise CogExportError(f"{where} adapts layers that {', '.join(names[:-1])} and {names[-1]} models all have; "
                             "pass --base with the model it adapts")
    if fitting:
        raise CogExportError(f"{where} fits several LoRA layouts ({', '.join(f.table.name for f in fitting)}); "
                             "its keys are mixed")
    raise _why_none_fits(source, where, family, problems)


def _reading_what_it_records(fitting: list[_Layout], recorded: Recorded, where: str) -> list[_Layout]:
    """The layouts that read the settings the run recorded (SimpleTuner's swiglu_gate_first: which half of the
    SwiGLU rows is the gate); when the keys fit only layouts that read other values, the file is refused."""
    readers = [f for f in fitting if reads(f.table.family, dict(f.table.reads_settings), recorded)]
    if fitting and not readers:
        family = fitting[0].table.family
        raise refusal(family, recorded, where, {f.table.name: dict(f.table.reads_settings) for f in fitting
                                                if f.table.family is family})
    return readers


def _why_none_fits(source: Mapping[str, LazyTensor], where: str, family: ModelFamily | None,
                   problems: list) -> CogExportError:
    """The error of the layout that got furthest with the file, among the base's family's layouts when the base is
    known (a Wan file's unknown module, rather than its names being no HunyuanVideo layer's)."""
    own = [p for p in problems if family is not None and p[2] == family.key]
    if own or problems:
        return max(own or problems, key=lambda problem: problem[0])[1]  # the first of those that got furthest
    sample = ", ".join(list(source)[:3]) or "no tensors at all"
    titles = ", ".join(dict.fromkeys(t.format.title for t in lora_tables()))
    return CogExportError(f"{where} is no LoRA layout cogexport knows ({titles}); its first keys are {sample}")


def _fits_a_release(layout: _Layout) -> bool:
    """Whether every adapted layer has the shape it has in one of the family's published models."""
    return any(not misfits(layout.modules_out, schema) for schema in _release_schemas(layout.table.family.key))


@cache
def _release_schemas(key: str) -> tuple[dict[str, torch.Size], ...]:
    family = family_named(key)
    configs = {repr(config): config for config in (family.transformer_config(v) for v in family.variants)}
    return tuple(build_target(family.transformer.class_name, config).schema for config in configs.values())


def _reading(layout: _Layout) -> tuple:
    """How a layout reads the file: each Diffusers module, the file's modules it comes from and how their rows are
    split (a rename, a chunk, a half swap), and the base weights."""
    modules = layout.table.modules
    how = []
    for target, origins in sorted(layout.origins.items()):
        found = [rule_of(modules, name) if modules is not None else None for name in origins]
        how.append((target, tuple(origins), tuple((f[0].source_chunks, f[0].target_chunks, f[0].dim, f[1])
                                                  if f else None for f in found)))
    return layout.table.family.key, tuple(how), tuple(sorted(layout.plain.items()))


def read_adapter(source: Mapping[str, LazyTensor], where: str, alpha_override: float | None = None,
                 folders: Iterable[Path] = (), metadata: Mapping[str, str] | None = None,
                 family: ModelFamily | None = None, counts: Mapping[str, int] | None = None) -> LoraAdapter:
    """The adapter a LoRA file or run holds, named and sized from its keys and shapes, with its strength. ``counts``
    are the sizes of the model it is for (--base's), which a fused layer's split may need (its head count); by default
    those of the family's published model."""
    recorded = recorded_config(metadata, folders, where)
    layout = _choose(source, where, family, recorded)
    table = layout.table
    for option, what in (("use_dora", "DoRA magnitudes"), ("lora_bias", "LoRA biases")):
        if recorded.config.get(option) and not _has(layout, option):
            raise CogExportError(f"{where} was trained with {option} ({recorded.where}), but the file holds no "
                                 f"{what}; it is incomplete")
    notes = _drop_zero_deltas(layout)
    strength = Strength(where, alpha_override, _alpha_values(layout, where), recorded, table.default_alpha_for,
                        table.default_alpha_reason, table.alpha_recorded, whole_w2_rule(source, metadata))
    alpha_source, alpha_recorded = set_strengths(layout.source, strength)
    stale = (metadata or {}).get("ss_network_alpha")
    if stale and ALPHA in table.format.parts.values() and not layout.alpha_keys and alpha_override is None:
        # musubi-tuner's convert_lora --target other folds alpha / r into both matrices and keeps kohya's metadata
        alpha_source += (f"; the header's ss_network_alpha {stale} is not applied (musubi-tuner's convert_lora "
                         "folds it into lora_A and lora_B)")
    rslora = bool(recorded.config.get("use_rslora"))
    counts = dict(counts) if counts is not None else names_counts(table.family)
    if table.modules is not None:
        layout.modules_out, layout.origins = translate_modules(layout.source, table.modules, where, rslora, counts)
    else:
        layout.modules_out = dict(layout.source)
    if table.keymap is not None:  # a whole run's key map names the model's weights and the adapters together
        base_source, base_table = (dict(source) if layout.plain else {}), table.keymap
    else:
        base_source, base_table = {name: layout.tensors[key] for name, key in layout.plain.items()}, table.modules
    adapter = LoraAdapter(table.family, table, layout.modules_out,
                          names_schema(table.family, blocks_needed(layout.modules_out)), alpha_source, alpha_recorded,
                          base_source=base_source, base_table=base_table, use_rslora=rslora, warnings=notes,
                          counts=counts, component=_component(layout, recorded, where))
    if not adapter.adapted:
        raise CogExportError(f"{where} has LoRA names but no lora_A / lora_B pairs or LyCORIS factors")
    if not alpha_recorded:
        adapter.warnings.append(f"{where} does not record its LoRA alpha; using {adapter.alpha:g} ({alpha_source}); "
                                "pass --lora-alpha if the run used another")
    return adapter


def _component(layout: _Layout, recorded: Recorded, where: str) -> str | None:
    """The pipeline component the file says its adapter is for (None: it does not say): the prefix of its keys and
    that of its adapter config, which must agree and be one of the family's transformers."""
    said = dict.fromkeys(c for c in (layout.component, recorded.component) if c is not None)
    family = layout.table.family
    if len(said) > 1:
        raise CogExportError(f"{where}: its keys name the pipeline component {layout.component}, its "
                             f"{DIFFUSERS_METADATA} {recorded.component}, so which model it adapts is not said; "
                             "rename the prefixes of one to the other's (the component it was trained for)")
    component = next(iter(said), None)
    if component is not None and component not in family.transformer_folders:
        raise CogExportError(f"{where}: its {DIFFUSERS_METADATA} is keyed {component}., which is no pipeline "
                             f"component of a {family.name} transformer ({', '.join(family.transformer_folders)})")
    return component


def _alpha_values(layout: _Layout, where: str) -> dict[str, tuple[str, float]]:
    """The file's .alpha tensors, by module: (key, value)."""
    return {name: (key, _scalar(layout.tensors[key], key, where)) for name, key in layout.alpha_keys.items()}


def _has(layout: _Layout, option: str) -> bool:
    attribute = "magnitude" if option == "use_dora" else "bias"
    return any(getattr(m, attribute) is not None for m in layout.source.values())


def _drop_zero_deltas(layout: _Layout) -> list[str]:
    """ComfyUI files often carry .diff / .diff_b deltas that are all zeros (norm layers a trainer did not change):
    they change nothing, so they go (and need no format that can hold them)."""
    dropped = 0
    for name in list(layout.source):
        module = layout.source[name]
        for attribute in ("diff", "diff_b"):
            tensor = getattr(module, attribute)
            if tensor is not None and not torch.any(tensor.load()):
                setattr(module, attribute, None)
                dropped += 1
        if not module.parts:
            del layout.source[name]
    return [f"dropped {dropped} all-zero .diff / .diff_b delta(s): they change nothing"] if dropped else []


def _scalar(tensor: LazyTensor, key: str, where: str) -> float:
    if tensor.numel != 1:
        raise CogExportError(f"{where}: {key} has shape {tuple(tensor.shape)}; an alpha is one number")
    return float(tensor.load().reshape(()).item())
