"""Which model a checkpoint holds, read from its names and shapes: the family and layout (the one key-map table whose
signature the names carry), the published variant, and whether it is a LoRA run. Used by ``export`` to choose a
key map and by ``inspect``. Readers never decide this: they hand out names, the tables recognise them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import CogExportError
from ..keymap.plan import translate_shapes
from ..keymap.table import KeyMapTable, load_table
from ..lazy import LazyTensor
from .base_folder import read_json
from .family import ModelFamily, Variant, class_defaults, component_title, families, family_of_class
from .target import build_target
from .told_apart import told_apart

# Name fragments only LoRA checkpoints have (SAT's LoRA mixin, PEFT, kohya / musubi-tuner, ComfyUI files).
LORA_MARKERS = (".original.", ".matrix_A.", ".matrix_B.", ".lora_A.", ".lora_B.", ".base_layer.", ".lora_down.",
                ".lora_up.", ".lora_magnitude_vector", ".lokr_w1", ".lokr_w2", ".hada_w1_", ".hada_w2_", ".dora_scale",
                ".oft_", ".boft_")
LORA_PREFIXES = ("lora_unet_", "lycoris_", "lora_transformer_")


def lora_key(keys: Sequence[str]) -> str | None:
    """A key that marks the checkpoint as a LoRA run, if any."""
    return next((key for key in keys if any(marker in key for marker in LORA_MARKERS)
                 or key.startswith(LORA_PREFIXES)), None)


def component_tables(component: str, family: ModelFamily | None = None) -> list[tuple[ModelFamily, str]]:
    """(family, table name) for every table that translates into ``component`` (transformer, vae, ...); LoRA
    layouts are recognised by cogexport/lora/read.py."""
    found = []
    for each in families() if family is None else (family,):
        spec = each.components.get(component)
        found += [(each, name) for name in (spec.tables if spec else ())]
    return found


def fitting_tables(keys: Sequence[str], candidates: Sequence[tuple[ModelFamily, str]]
                   ) -> list[tuple[ModelFamily, KeyMapTable]]:
    fitting = []
    for family, name in candidates:
        table = load_table(name)
        if table.recognises(table.select(keys)[0]):
            fitting.append((family, table))
    return fitting


def is_specialisation(table: KeyMapTable, other: KeyMapTable) -> bool:
    """Whether ``table`` is ``other``'s layout with more in it (Wan VACE's original layout is Wan's plus its VACE
    blocks): the same signature at least, and strictly more required names."""
    return set(table.signature) >= set(other.signature) and set(table.requires) > set(other.requires)


def most_specific(fitting: list[tuple[ModelFamily, KeyMapTable]]) -> list[tuple[ModelFamily, KeyMapTable]]:
    """Of several fitting layouts, the one that specialises every other (a checkpoint carrying its extra required
    names is that layout, not the plainer one it extends); all of them when there is no such one."""
    for family, table in fitting:
        others = [other for _, other in fitting if other.name != table.name]
        if others and all(is_specialisation(table, other) for other in others):
            return [(f, t) for f, t in fitting if t.name == table.name]
    return fitting


def owner_first(fitting: list[tuple[ModelFamily, KeyMapTable]]) -> list[tuple[ModelFamily, KeyMapTable]]:
    """One layout read by several families (a table named ``wan/...`` that Wan's variants list too): the family
    whose own table it is comes first."""
    owned = [(family, table) for family, table in fitting if table.name.split("/", 1)[0] == family.key]
    return owned + [pair for pair in fitting if pair not in owned]


def preferred_tables(keys: Sequence[str], candidates: Sequence[tuple[ModelFamily, str]]
                     ) -> list[tuple[ModelFamily, KeyMapTable]]:
    """The fitting tables, the one ``choose_table`` takes first."""
    return owner_first(most_specific(fitting_tables(keys, candidates)))


# What an export's user can do when the names do not say the family, or say another than the one named: --base or
# --model-name names it. Other commands give their own advice (verify has no --model-name: see choose_table).
EXPORT_REMEDY = "give a {found} --base (or none)"
EXPORT_AMBIGUITY_REMEDY = "pass --base (or --model-name) to say which model it is"


def choose_table(source: Mapping[str, LazyTensor], component: str, what: str, where: str,
                 family: ModelFamily | None = None, remedy: str | None = None) -> tuple[ModelFamily, KeyMapTable]:
    """The one table (and its family) whose signature the checkpoint's names carry. A table that several families
    share (a VAE of the Wan variants) is one layout: its owner's, or the named family's. Of layouts that extend one
    another, the most specific one the names fit is the checkpoint's. ``remedy`` is the advice of a refusal (with
    ``{found}``, the family the names are), for a command whose options are not the export's."""
    candidates = component_tables(component, family)
    fitting = preferred_tables(list(source), candidates)
    if len({table.name for _, table in fitting}) > 1:
        fitting = _names_fit(fitting, source, component) or fitting
        fitting = told_apart(fitting, source, where)  # look-alike layouts: what beside the tensors says which
    layouts = {table.name for _, table in fitting}
    # the named family's layout fits, but the names carry more: another family's layout that extends it (a SkyReels-V2
    # fps embedding, a VACE branch beside Wan's names)
    others = preferred_tables(list(source), component_tables(component)) if family else []
    wider = others and others[0][0] is not family and all(is_specialisation(others[0][1], t) for _, t in fitting)
    if len(layouts) == 1 and not wider:
        return fitting[0]
    if not fitting or wider:
        sample = ", ".join(list(source)[:3]) or "no tensors at all"
        if others:
            advice = (remedy or EXPORT_REMEDY).format(found=others[0][0].name)
            raise CogExportError(f"{where} holds a {others[0][0].name} {component}, not a {family.name} one; {advice}")
        another = _another_component(list(source), component)
        if another is not None:
            raise CogExportError(f"{where} holds a {component_title(another[1])} ({another[0].name}), not a {what}; "
                                 f"export it with --component {another[1]}")
        # a table several families read (Wan's, by its variants) is one layout tried once; its families named once
        tried = len({name for _, name in candidates})
        owners = ", ".join(dict.fromkeys(candidate_family.name for candidate_family, _ in candidates))
        raise CogExportError(f"{where} holds no {what} weights cogexport recognises (it tried the {tried} {what} "
                             f"layouts of {owners}); its first keys are {sample}")
    owners = sorted({found_family.name for found_family, _ in fitting})
    if len(owners) > 1:  # the same names in two families' models (LTX-Video's and LTX-2's Diffusers VAEs)
        advice = (remedy or EXPORT_AMBIGUITY_REMEDY).format(found=" or ".join(owners))
        raise CogExportError(f"{where} has the tensor names of a {' and a '.join(owners)} {what} alike; {advice}")
    raise CogExportError(f"{where} matches several layouts ({', '.join(sorted(layouts))}); its keys are mixed")


def _another_component(keys: Sequence[str], component: str) -> tuple[ModelFamily, str] | None:
    """The (family, component) of another kind whose layout the names are, when none of ``component``'s is (a
    release's VAE file given for the transformer, or a diffusion decoder's for the VAE): what to ask for instead."""
    for family in families():
        for name, spec in family.components.items():
            if name != component and fitting_tables(keys, [(family, table) for table in spec.tables]):
                return family, name
    return None


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _names_fit(fitting: list[tuple[ModelFamily, KeyMapTable]], source: Mapping[str, LazyTensor],
               component: str) -> list[tuple[ModelFamily, KeyMapTable]]:
    """Of several layouts whose signatures the names carry, those under which every name becomes a tensor name of
    the table's own Diffusers class (block indices aside: the size is not known yet). Two families' prefix-only
    tables (their Diffusers names) can both claim a state dict; only one class has those names."""
    shapes = {name: tensor.shape for name, tensor in source.items()}
    return [(family, table) for family, table in fitting
            if {_INDEX.sub("#", name) for name in translate_shapes(table, shapes)}
            <= _class_names(family.key, component, family.components[component].class_of(table))]


@cache
def _class_names(family_key: str, component: str, class_name: str) -> frozenset[str]:
    """The tensor names (block indices as #) of one of the family's component classes at the config of its first
    variant with that class (the class's defaults if none has it)."""
    family = next(each for each in families() if each.key == family_key)
    variant = next((v for v in family.variants if family.component_class(component, v) == class_name), None)
    config = family.component_config(component, variant) if variant else class_defaults(class_name)
    return frozenset(_INDEX.sub("#", name) for name in build_target(class_name, config).schema)


@dataclass
class Recognised:
    """A transformer checkpoint's family, layout and the facts its shapes show."""

    family: ModelFamily
    table: KeyMapTable
    facts: dict[str, Any]
    variant: Variant | None

    @property
    def task(self) -> str:
        return self.family.shapes.task_of(self.facts)

    @property
    def tasks(self) -> tuple[str, ...]:
        """Every task these shapes can be (more than one when a family's tasks share shapes), the default first."""
        return self.family.tasks_of(self.facts)

    @property
    def model(self) -> str:
        return self.variant.name if self.variant else f"{self.family.name} (unpublished size)"


def read_facts(family: ModelFamily, table: KeyMapTable, shapes: Mapping[str, Any],
               experts: tuple[str, ...] = (), metadata: Mapping[str, str] | None = None) -> Recognised:
    """The facts of a transformer in ``table``'s layout (LoRA tensors, if any, left out), and, for families whose
    releases say more beside the transformer (LTX-Video: the VAE in the same file tells the version, the file's
    metadata holds the config), what the shapes module's optional ``release_facts`` reads off every key of the
    source and its metadata."""
    translated = translate_shapes(table, shapes)
    base = {name: shape for name, shape in translated.items() if ".lora_" not in name}
    facts = family.shapes.read_facts(base)
    facts.update(family.shapes.release_facts(shapes, metadata or {}))
    return Recognised(family, table, facts, family.published_variant(facts, experts))


def recognise(source: Mapping[str, LazyTensor], table: KeyMapTable, family: ModelFamily,
              experts: tuple[str, ...] = (), metadata: Mapping[str, str] | None = None) -> Recognised:
    """The facts of a transformer checkpoint in ``table``'s layout (with the header metadata of its file, if any)."""
    return read_facts(family, table, {name: tensor.shape for name, tensor in source.items()}, experts, metadata)


def config_beside(family: ModelFamily, folders: Sequence, facts: Mapping[str, Any]) -> dict | None:
    """The config a checkpoint keeps beside its weights: a Diffusers config.json of the family's transformer class
    (a save_pretrained folder), else the original layout's own config, read by the family."""
    return diffusers_config_beside(family.transformer.class_name, folders) or \
        family.shapes.config_beside(folders, facts)


def family_beside(folders: Sequence) -> ModelFamily | None:
    """The family the config.json beside the weights names, if any: a Diffusers config of one of a family's model
    classes, or an original-layout config a family claims (when its weights' names would read as another family's)."""
    for folder in folders:
        path = Path(folder) / "config.json"
        if not path.is_file():
            continue
        config = read_json(path)
        found = family_of_class(config.get("_class_name"))
        if found is not None:
            return found[0]
        claimed = [family for family in families() if family.shapes.claims_config(config)]
        if claimed:
            return claimed[0]
    return None


def diffusers_config_beside(class_name: str, folders: Sequence) -> dict | None:
    """The config.json a save_pretrained folder of ``class_name`` keeps beside its weights, if any."""
    for folder in folders:
        path = Path(folder) / "config.json"
        if path.is_file():
            config = read_json(path)
            if config.get("_class_name") == class_name:
                return config
    return None


def expert_folders(paths: list[Path]) -> dict[str, Path]:
    """A release or run holding one model per expert (Wan 2.2 A14B: high_noise_model/, low_noise_model/): the
    pipeline component each subfolder becomes. Empty when the paths are one ordinary checkpoint."""
    if len(paths) != 1 or not paths[0].is_dir():
        return {}
    for family in families():
        for variant in family.variants:
            if not variant.experts:
                continue
            present = {component: paths[0] / sub for component, sub in variant.experts.items()
                       if (paths[0] / sub).is_dir()}
            if present and len(present) < len(variant.experts):
                missing = [sub for component, sub in variant.experts.items() if component not in present]
                raise CogExportError(f"{paths[0]} holds {', '.join(p.name for p in present.values())} but not "
                                     f"{', '.join(missing)}: a {variant.name} run needs every expert (a half pipeline "
                                     "would not generate); point at one expert's folder to export it alone")
            if present:
                return present
    return {}
