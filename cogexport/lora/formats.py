"""How each trainer names an adapter's tensors (the key grammar of a LoRA file, the same for every model family) and,
for the formats cogexport writes, everything the format knows: its file, where its loaders read the strength, the
adapter config and metadata it carries, and how people load it.

A key is ``<prefix><module><suffix>``: the suffix says which part of the module's adapter it is (parts.py); the module
is named in whatever naming the file uses (Diffusers or the original repo's, with dots written as underscores in
kohya-style files). Which naming, and how it maps to Diffusers modules, is family data (each family's layouts in its
family.toml, read by tables.py); what a format's layouts share (the table's name, description, default alpha, whether
it writes) is the format's ``layout``, which a family's layout overrides only where it differs.

A new writable format is one LoraFormat here (or given to ``register_format``) and one layout per family that writes
it; a format or table that lacks what writing needs is refused when the formats and tables load, not after tensors
were written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from ..errors import CogExportError, ExtensionError
from ..keymap.table_fields import LoraLayout
from ..schema import declared
from .parts import (ALPHA, BASE_BIAS, BASE_WEIGHT, BIAS, DIFF, DIFF_B, DOWN, FACTOR_PARTS, LYCORIS_SUFFIXES, MAGNITUDE,
                    UP, WEIGHT_PARTS)
from .parts import PARTS, PART_NAMES  # noqa: F401  (re-exported: the grammar's part names)
from .usage import LOADERS, usage_lines

# Where a writable format keeps the adapter config (PEFT's LoraConfig / LoKrConfig / LoHaConfig arguments).
IN_HEADER = "header"  # the safetensors header's lora_adapter_metadata, prefixed with the pipeline component (Diffusers)
IN_SIDE_FILE = "side file"  # adapter_config.json beside the file (PEFT)
# How a format's loaders scale a LoKr module whose factors are both whole (no low-rank half to take alpha / r from).
FULL_AT_ONE = "one"  # alpha is ignored: scale 1 (LyCORIS, ComfyUI)
FULL_BY_CONFIG = "config"  # alpha / r of the adapter config (PEFT)


class FormatError(ExtensionError):
    """A LoRA format's entry lacks what writing it needs (a bug in the entry, found when the formats load)."""

    kind = "LoRA formats"


@dataclass(frozen=True)
class LoraFormat:
    """A key grammar, what cogexport needs to write it (a format with a ``file`` is one it writes), and what its
    tables share. The docs' table of these fields is made from the descriptions here (scripts/table_reference.py)."""

    name: str = declared("as `--lora-format` and reports name it")
    title: str = declared("as people call it")
    parts: Mapping[str, str] = declared(
        "key suffix -> part (`DOWN`, `UP`, `BIAS`, `MAGNITUDE`, `ALPHA`, `DIFF`, `DIFF_B`, `BASE_WEIGHT`, `BASE_BIAS` "
        "and LyCORIS's factors, cogexport/lora/parts.py)")
    strip: tuple[str, ...] = declared("prefixes removed, in order, when every key has them", ())
    prefix: str = declared("a prefix every key must have", "")
    write_prefix: str = declared("the prefix written keys get", "")
    component_prefix: bool = declared(
        "each key begins with the pipeline component the adapter is for, as Diffusers' loaders route it: one of the "
        "family's tasks' `transformer_folder` (`transformer.`, or a second task's `transformer_ref.`), read as that "
        "component's adapter and written for the task's (`write_prefix` when none is said); the header's adapter "
        "config is keyed by it too", False)
    encoded: bool = declared("kohya-style: a module path's dots are written as underscores (resolved against the "
                             "family's real module names)", False)
    base_weights: bool = declared("a wrapped model: `base_layer` weights and plain (unwrapped) keys beside the "
                                  "adapters (a training checkpoint)", False)
    extras: tuple[str, ...] = declared(
        "whole keys of network settings, not adapter tensors (musubi-tuner's `lokr_factor`)", ())
    # -- writing (a format with a file is one cogexport writes) -----------------------------------------------------
    file: str = declared("the file a written adapter goes in; a format with one is writable", "")
    write_parts: Mapping[str, str] = declared(
        "part -> suffix, for the parts the format holds (what it cannot hold is refused, naming the formats that "
        "hold it)", {})
    alpha_optional: bool = declared(
        "its loaders apply a module without `.alpha` at scale 1, so alpha = r is left out when writing", False)
    strength_where: str = declared("where its loaders read the trained strength, for the model card", "")
    adapter_config: str = declared(
        "where the adapter config goes: `IN_HEADER` (the header's lora_adapter_metadata), `IN_SIDE_FILE` "
        "(adapter_config.json), or `\"\"` (the strength is in `.alpha` tensors)", "")
    kohya_metadata: bool = declared(
        "ss_network_module / ss_network_dim / ss_network_alpha in the header (a writing table then needs "
        "`network_module`)", False)
    loaders: tuple[str, ...] = declared("how people load it, for the model card: names of `LOADERS` "
                                        "(cogexport/lora/usage.py)", ())
    full_lokr: str = declared("how its loaders scale a LoKr whose factors are both whole: `FULL_AT_ONE` (alpha "
                              "ignored) or `FULL_BY_CONFIG` (alpha / r of the adapter config)", FULL_AT_ONE)
    factor_rules: str = declared(
        "whose rules its loader rebuilds LoKr factor shapes by: `\"peft\"`, `\"lycoris\"`, or `\"\"` (as given)", "")
    # -- its tables (cogexport/lora/tables.py) ------------------------------------------------------------------------
    layout: LoraLayout = declared(
        "what a family's layout of this format is unless the family says otherwise (the fields of "
        "`[[lora.layout]]`): the table's name in the family, its description and source (`{family}` standing for "
        "the family's name), whether it writes, the default alpha", LoraLayout())

    def __post_init__(self) -> None:
        if self.file:
            _check_writable(self)

    @property
    def writable(self) -> bool:
        return bool(self.file)

    def holds(self, part: str) -> bool:
        return part in self.write_parts

    def component_in(self, keys: Iterable[str], components: Sequence[str], where: str) -> str | None:
        """The pipeline component (of ``components``) every key begins with; None for a format whose keys name
        none, or keys that do not all name one. Keys of two components are refused: a file read as one model's
        adapter would otherwise take the other model's layers for its own (both have the same layer names)."""
        if not self.component_prefix:
            return None
        found = [next((c for c in components if key.startswith(f"{c}.")), None) for key in keys
                 if key not in self.extras]
        named = sorted({component for component in found if component is not None})
        if len(named) > 1:
            raise CogExportError(f"{where} holds adapters of {len(named)} pipeline components (keys beginning "
                                 f"{' and '.join(f'{c}.' for c in named)}); cogexport reads one model's adapter: "
                                 "save each component's adapter in a file of its own")
        return named[0] if named and None not in found else None

    def split(self, keys: Iterable[str],
              component: str | None = None) -> tuple[dict[str, tuple[str, str | None]], list[str]] | None:
        """Each key as (module, part) (part None for a plain key of a wrapped model), and the keys that fit no
        suffix; None when the keys do not carry this format's prefix or none is an adapter key. Keys named in
        ``extras`` are left out; ``component`` (component_in's) is taken off every key first."""
        names = {key: key for key in keys if key not in self.extras}
        if component is not None:
            names = {key: name.removeprefix(f"{component}.") for key, name in names.items()}
        for strip in self.strip:
            if names and all(name.startswith(strip) for name in names.values()):
                names = {key: name[len(strip):] for key, name in names.items()}
        if self.prefix:
            if not all(name.startswith(self.prefix) for name in names.values()):
                return None
            names = {key: name[len(self.prefix):] for key, name in names.items()}
        parsed: dict[str, tuple[str, str | None]] = {}
        unknown: list[str] = []
        by_length = sorted(self.parts.items(), key=lambda item: len(item[0]), reverse=True)
        for key, name in names.items():
            found = next(((name[: -len(suffix)], part) for suffix, part in by_length
                          if name.endswith(suffix) and len(name) > len(suffix)), None)
            if found is not None:
                parsed[key] = found
            elif self.base_weights:
                parsed[key] = (name, None)
            else:
                unknown.append(key)
        if not any(part in WEIGHT_PARTS for _, part in parsed.values()):
            return None
        wrapped = any(part is None or part in (BASE_WEIGHT, BASE_BIAS) for _, part in parsed.values())
        if self.base_weights and not wrapped:
            return None  # a wrapped model without its model: an adapter file (DiffSynth-Studio's), not this
        return parsed, unknown

    def key(self, module: str, part: str, component: str | None = None) -> str:
        """The key this format writes for a module's part (the module already in the format's naming), for the
        pipeline component ``component`` in a format whose keys name it."""
        name = module.replace(".", "_") if self.encoded else module
        prefix = f"{component}." if component is not None and self.component_prefix else self.write_prefix
        return f"{prefix}{name}{self.write_parts[part]}"

    def usage_lines(self, pipeline: str, base_model: str | None, files: Mapping[str, str]) -> list[str]:
        """How the adapter is loaded at its trained strength by this format's loaders, for the model card: ``files``
        maps the pipeline component each adapter is for to its file as the user will load it."""
        return usage_lines(self.loaders, pipeline, base_model, files)


def _check_writable(fmt: LoraFormat) -> None:
    def need(condition: bool, what: str) -> None:
        if not condition:
            raise FormatError(f"LoRA format {fmt.name!r}: {what}")

    need(bool(fmt.strength_where), "a writable format says where its loaders read the strength (strength_where)")
    need(bool(fmt.loaders) and all(name in LOADERS for name in fmt.loaders),
         f"its loaders must be some of {', '.join(LOADERS)}")
    need(all(part in fmt.parts.values() for part in fmt.write_parts), "it must read every part it writes")
    need(fmt.holds(DOWN) and fmt.holds(UP) or any(fmt.holds(part) for part in FACTOR_PARTS),
         "it must hold lora_A / lora_B or LyCORIS factors")
    need(fmt.holds(ALPHA) or fmt.adapter_config in (IN_HEADER, IN_SIDE_FILE),
         "its strength needs a place: an .alpha part or an adapter config (header or side file)")
    need(fmt.adapter_config in ("", IN_HEADER, IN_SIDE_FILE),
         f"adapter_config must be {IN_HEADER!r} or {IN_SIDE_FILE!r}")
    need(fmt.full_lokr in (FULL_AT_ONE, FULL_BY_CONFIG), f"full_lokr must be {FULL_AT_ONE!r} or {FULL_BY_CONFIG!r}")
    need(fmt.factor_rules in ("", "peft", "lycoris"), "factor_rules must be 'peft', 'lycoris' or ''")


_LORA_AB = {".lora_A.weight": DOWN, ".lora_B.weight": UP, ".lora_B.bias": BIAS, ".lora_magnitude_vector": MAGNITUDE}
LORA_AB_NAMES = {DOWN: ".lora_A.weight", UP: ".lora_B.weight"}  # PEFT's names for the two matrices
_KOHYA = {".lora_down.weight": DOWN, ".lora_up.weight": UP, ".alpha": ALPHA}
_KOHYA_NAMES = {DOWN: ".lora_down.weight", UP: ".lora_up.weight", ALPHA: ".alpha"}
_WRAPPED = {".lora_A.default.weight": DOWN, ".lora_B.default.weight": UP, ".lora_B.default.bias": BIAS,
            ".lora_magnitude_vector.default.weight": MAGNITUDE}
_FACTOR_NAMES = {part: suffix for suffix, part in LYCORIS_SUFFIXES.items()}
_ALPHA_IN_TENSORS = "each module's alpha is in its .alpha tensor (the loader applies alpha / r)"
_AT_SCALE_ONE = dict(default_alpha="rank", default_alpha_reason="no .alpha tensors: applied at scale 1 (alpha = r)",
                     alpha_recorded=True)  # kohya-style loaders apply a module without .alpha at scale 1

_BUILT_IN = (
    # keys begin with the pipeline component, "transformer." unless a task's transformer is another
    LoraFormat("diffusers", "Diffusers", {**_LORA_AB, **LYCORIS_SUFFIXES}, component_prefix=True,
               write_prefix="transformer.", file="pytorch_lora_weights.safetensors",
               write_parts={DOWN: ".lora_A.weight", UP: ".lora_B.weight", BIAS: ".lora_B.bias"},
               strength_where="lora_alpha, r and per-module patterns are in the file's lora_adapter_metadata",
               adapter_config=IN_HEADER, loaders=("diffusers",),
               layout=LoraLayout(name="diffusers_lora", description="Diffusers {family} LoRA file",
                                 source="Diffusers LoRA weights (pytorch_lora_weights.safetensors)", writes=True,
                                 default_alpha="rank", alpha_recorded=False, default_alpha_reason=(
                                     "Diffusers' loader applies a file that records no adapter config at alpha = r"))),
    LoraFormat("peft", "PEFT", {**_LORA_AB, **LYCORIS_SUFFIXES}, prefix="base_model.model.",
               write_prefix="base_model.model.", file="adapter_model.safetensors",
               write_parts={DOWN: ".lora_A.weight", UP: ".lora_B.weight", BIAS: ".lora_B.bias",
                            MAGNITUDE: ".lora_magnitude_vector", **_FACTOR_NAMES},
               strength_where="lora_alpha (alpha for LoKr / LoHa), r and per-module patterns are in "
                              "adapter_config.json",
               adapter_config=IN_SIDE_FILE, loaders=("peft",), full_lokr=FULL_BY_CONFIG, factor_rules="peft",
               layout=LoraLayout(name="peft_adapter", description="PEFT {family} adapter",
                                 source="PEFT adapter on Diffusers names (adapter_model.safetensors + "
                                        "adapter_config.json)", writes=True, default_alpha="rank",
                                 default_alpha_reason="no adapter_config.json: alpha = r assumed",
                                 alpha_recorded=False)),
    # A model wrapped by PEFT, as a training checkpoint holds it (DeepSpeed, DDP, DCP): the adapters of PEFT's default
    # adapter beside the wrapped layers' base weights and every other weight of the model.
    LoraFormat("peft-checkpoint", "PEFT-wrapped model", {**_WRAPPED, ".base_layer.weight": BASE_WEIGHT,
                                                         ".base_layer.bias": BASE_BIAS},
               strip=("module.", "_orig_mod.", "base_model.model."), base_weights=True,
               # PEFT's own default: the run's adapter_config.json or training YAML, when beside it, says otherwise
               layout=LoraLayout(name="peft_lora", description="PEFT-wrapped {family} transformer",
                                 source="Diffusers-based {family} LoRA run (PEFT adapters)", default_alpha=8.0,
                                 default_alpha_reason="PEFT's default lora_alpha", alpha_recorded=False)),
    # DiffSynth-Studio saves the adapter part of its PEFT-wrapped DiT, with the pipeline's "pipe.dit." removed.
    LoraFormat("diffsynth", "DiffSynth-Studio", {".lora_A.default.weight": DOWN, ".lora_B.default.weight": UP},
               layout=LoraLayout(name="diffsynth_lora", description="DiffSynth-Studio {family} LoRA",
                                 source="DiffSynth-Studio LoRA (original names, lora_A.default)", default_alpha="rank",
                                 alpha_recorded=True, default_alpha_reason=(
                                     "DiffSynth-Studio keeps the strength in lora_B and applies B A at scale 1: "
                                     "alpha = r"))),
    LoraFormat("comfyui", "ComfyUI / original names",
               {**_KOHYA, ".lora_A.weight": DOWN, ".lora_B.weight": UP, ".diff": DIFF, ".diff_b": DIFF_B,
                **LYCORIS_SUFFIXES},
               strip=("model.", "diffusion_model."), write_prefix="diffusion_model.", file="lora.safetensors",
               alpha_optional=True,
               write_parts={**_KOHYA_NAMES, DIFF: ".diff", DIFF_B: ".diff_b", **_FACTOR_NAMES},
               strength_where=_ALPHA_IN_TENSORS, loaders=("diffusers", "comfyui"),
               layout=LoraLayout(name="comfyui_lora", description="ComfyUI {family} LoRA",
                                 source="ComfyUI / original names LoRA (diffusion_model.*, lora_down / lora_up or "
                                        "lora_A / lora_B, .alpha, .diff)", writes=True, **_AT_SCALE_ONE)),
    LoraFormat("musubi", "kohya / musubi-tuner", {**_KOHYA, **LYCORIS_SUFFIXES}, prefix="lora_unet_",
               write_prefix="lora_unet_", encoded=True, extras=("lokr_factor",), file="lora.safetensors",
               write_parts=_KOHYA_NAMES, strength_where=_ALPHA_IN_TENSORS, kohya_metadata=True,
               loaders=("diffusers", "comfyui+musubi"),
               layout=LoraLayout(name="musubi_lora", description="kohya / musubi-tuner {family} LoRA",
                                 source="kohya / musubi-tuner LoRA (lora_unet_..., lora_down / lora_up, .alpha)",
                                 writes=True, **_AT_SCALE_ONE)),
    # LyCORIS's own save of a wrapped Diffusers model (SimpleTuner's LyCORIS runs): lycoris_ + the Diffusers module
    # path with underscores; LoRA modules as LyCORIS's LoCon writes them.
    LoraFormat("lycoris", "LyCORIS", {**_KOHYA, **LYCORIS_SUFFIXES}, prefix="lycoris_", write_prefix="lycoris_",
               encoded=True, file="lycoris.safetensors", write_parts={**_KOHYA_NAMES, **_FACTOR_NAMES},
               strength_where=_ALPHA_IN_TENSORS, loaders=("lycoris",), factor_rules="lycoris",
               layout=LoraLayout(name="lycoris_lora", description="LyCORIS {family} adapter",
                                 source="LyCORIS adapter on Diffusers names (lycoris_..., LoKr / LoHa / LoCon, .alpha)",
                                 writes=True, **_AT_SCALE_ONE)),
    # Diffusers module paths with underscores after lora_transformer_: OneTrainer's legacy LoRA files, ai-toolkit's
    # LoKr files of models it saves in its newer LoKr format.
    LoraFormat("onetrainer", "OneTrainer legacy / ai-toolkit", {**_KOHYA, **LYCORIS_SUFFIXES},
               prefix="lora_transformer_", encoded=True,
               layout=LoraLayout(name="onetrainer_lora", description="OneTrainer legacy {family} LoRA",
                                 source="OneTrainer legacy LoRA (lora_transformer_ + Diffusers names, lora_down / "
                                        "lora_up, .alpha)", **_AT_SCALE_ONE)),
    # A key map (SAT's LoraMixin) already gives Diffusers names: base weights and lora_A / lora_B.
    # LoraMixin defaults to lora_alpha = 1, so a rank-r adapter is applied at 1/r.
    LoraFormat("sat", "SAT LoraMixin", {".lora_A.weight": DOWN, ".lora_B.weight": UP}, base_weights=True,
               layout=LoraLayout(name="sat_lora", default_alpha=1.0, default_alpha_reason="SAT's LoraMixin default",
                                 alpha_recorded=True)),
)
FORMATS: dict[str, LoraFormat] = {f.name: f for f in _BUILT_IN}
_WRITABLE: list[str] = [f.name for f in _BUILT_IN if f.writable]
WRITABLE = tuple(_WRITABLE)  # the built-in writable formats, in --help order (writable_formats() adds registered ones)


def writable_formats() -> tuple[str, ...]:
    """The formats cogexport writes, in --help order."""
    return tuple(_WRITABLE)


def writable_format(name: str) -> LoraFormat:
    if name not in _WRITABLE:
        raise CogExportError(f"--lora-format {name!r} is not one of {', '.join(_WRITABLE)}")
    return FORMATS[name]


def register_format(fmt: LoraFormat, tables: Mapping[str, str | LoraLayout] = ()) -> None:
    """Add a format (checked as the built-in ones are), and for each family key the layout that reads and (with
    writes, of the format's ``layout`` or its own) writes it for that family: a LoraLayout as family.toml gives one
    (``LoraLayout(modules="diffusers_transformer")``: the format's defaults apply), or the TOML text of a LoRA table
    file ([table] and [lora])."""
    from .tables import register_tables

    if fmt.name in FORMATS:
        raise FormatError(f"LoRA format {fmt.name!r} exists already")
    FORMATS[fmt.name] = fmt
    if fmt.writable:
        _WRITABLE.append(fmt.name)
    try:
        register_tables({key: _of_format(table, fmt) for key, table in dict(tables).items()})
    except Exception:
        del FORMATS[fmt.name]
        if fmt.name in _WRITABLE:
            _WRITABLE.remove(fmt.name)
        raise


def _of_format(table: str | LoraLayout, fmt: LoraFormat) -> str | LoraLayout:
    """A layout given to register_format without a format is of the format registered."""
    return replace(table, format=table.format or fmt.name) if isinstance(table, LoraLayout) else table


def unregister_format(name: str) -> None:
    """Take back a format ``register_format`` added, and its tables."""
    from .tables import unregister_tables

    if name in (f.name for f in _BUILT_IN):
        raise FormatError(f"LoRA format {name!r} is built in")
    FORMATS.pop(name, None)
    if name in _WRITABLE:
        _WRITABLE.remove(name)
    unregister_tables(name)


def holders(part: str) -> str:
    """The writable formats that hold a part, as options to give."""
    return " or ".join(f"--lora-format {name}" for name in _WRITABLE if FORMATS[name].holds(part))
