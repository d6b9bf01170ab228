"""A model family (CogVideoX, Wan, ...) as data: ``key_maps/<family>/family.toml`` beside the family's key-map tables.

The file declares the Diffusers classes and the tables that translate into them, the published variants (names,
Hub ids, the shape facts that tell them apart, the config values that differ from the class defaults), the fp32
allowlists, the pipeline composition per task (pipeline class, what ``--base`` supplies, the scheduler) and the
way back to the original layout. The facts that truly need code (reading shapes, naming a custom config's layout)
live in one small module per family, ``cogexport/models/<shapes>.py``, named by the file. Shared code reads
families from here and never asks which family it has.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import sys
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..errors import CogExportError, ExtensionError
from ..keymap.roots import family_folders, key_map_roots
from ..keymap.table_fields import LoraLayout, given
from ..schema import SchemaError, convert, header, read, unknown_field
from .diffusers_cache import remembered
from .family_fields import ORIGINAL_WRITERS, ComponentSection, FamilyFile, OriginalLayout, VariantEntry
from .shapes import FamilyShapes

FAMILY_FILE = "family.toml"


class FamilyError(ExtensionError):
    """A family.toml is malformed (a bug in the family's data, not in the user's input)."""

    kind = "key maps"


@dataclass(frozen=True)
class Variant:
    """A published model: its name and Hub id, the facts its shapes show, and its config values."""

    name: str
    hub_id: str
    task: str
    shapes: Mapping[str, Any]
    configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # component -> values off the defaults
    scheduler: Mapping[str, Any] = field(default_factory=dict)
    pipeline: Mapping[str, Any] = field(default_factory=dict)  # pipeline config values (boundary_ratio, ...)
    experts: Mapping[str, str] = field(default_factory=dict)  # pipeline component -> the release's subfolder
    from_base: tuple[str, ...] | None = None  # components taken from --base, when not the task's
    classes: Mapping[str, str] = field(default_factory=dict)  # component -> its class here, when not the usual one

    @property
    def transformer(self) -> Mapping[str, Any]:
        return self.configs.get("transformer", {})


@dataclass(frozen=True)
class ModelSpec:
    """One Diffusers model class of the family (a pipeline component) and the tables that translate into it."""

    component: str  # the pipeline component it is: transformer, vae, audio_vae, ...
    class_name: str
    tables: tuple[str, ...]
    # where the class lives when Diffusers does not export it at the top level (a pipeline's own model, such as
    # LTX-2's text connectors: "pipelines.ltx2")
    module: str = ""
    keep_fp32: tuple[str, ...] = ()
    # the original layouts, in the order tried: the first whose inverted table takes every tensor is written (a family
    # may have several, e.g. Wan's 2.1 and 2.2 VAEs)
    originals: tuple[OriginalLayout, ...] = ()
    # whether the tasks' pipelines hold it (LTX-2.5's diffusion decoder and duration head belong to other pipelines)
    in_pipeline: bool = True
    # the classes it is in some variants instead (LTX-2.3's vocoder with bandwidth extension)
    other_classes: tuple[str, ...] = ()

    @property
    def original(self) -> OriginalLayout | None:
        return self.originals[0] if self.originals else None

    @property
    def classes(self) -> tuple[str, ...]:
        return (self.class_name, *self.other_classes)

    def class_of(self, table: Any) -> str:
        """The class a table of this component translates into: the one its target names, when that is one of the
        component's other classes."""
        return table.target if table.target in self.other_classes else self.class_name


# a variant's `classes` may name its pipeline's scheduler class too, under this key
SCHEDULER = "scheduler"


# the pipeline component a task's transformer is unless its family says otherwise ([tasks.X] transformer_folder)
DEFAULT_TRANSFORMER_FOLDER = "transformer"


@dataclass(frozen=True)
class Task:
    name: str
    pipeline: str
    pipeline_tag: str
    from_base: tuple[str, ...]
    scheduler: str | None = None  # the task's own scheduler class, when not the family's
    scheduler_config: Mapping[str, Any] | None = None
    transformer_folder: str = DEFAULT_TRANSFORMER_FOLDER  # where a pipeline folder holds this task's transformer


@dataclass(frozen=True, eq=False)  # one object per family: compared and hashed by identity
class ModelFamily:
    key: str  # the folder under key_maps/
    name: str  # as people write it: CogVideoX, Wan
    shapes: FamilyShapes  # reads facts off tensor shapes (the interface: cogexport/models/shapes.py)
    tags: tuple[str, ...]
    components: Mapping[str, ModelSpec]  # every model the family exports, the transformer first
    lora_layouts: tuple[LoraLayout, ...]  # [[lora.layout]]: read into tables by cogexport/lora/tables.py
    lora_names_from: tuple[str, ...]  # the variants whose models together have every layer an adapter may name
    # settings an adapter's recorded config may hold that change what its matrices mean: {setting: what it means}
    # (each layout's reads_settings says which recorded values it reads: cogexport/lora/recorded_settings.py)
    lora_recorded_settings: Mapping[str, str]
    scheduler_class: str
    scheduler_config: Mapping[str, Any]
    tasks: Mapping[str, Task]
    variants: tuple[Variant, ...]
    # the components a release file holds beside the transformer (LTX-Video's single file: the VAE); a pipeline
    # exported from such a file takes them from it
    from_checkpoint: tuple[str, ...] = ()
    # the families whose model this one's extends with layers of its own (Wan VACE: Wan's blocks and a VACE branch):
    # the extended family's LoRA adapters, on layers this model has too, apply to it
    extends: tuple[str, ...] = ()
    # the families whose weights this one's are exactly (names and shapes; only the config differs): weights of a
    # published size both have are one family's or the other's only by the user's word or a config beside them
    same_weights_as: tuple[str, ...] = ()
    # a release folder of partitions ([release]): task -> its subfolder, and component -> where a partition holds it
    release_partitions: Mapping[str, str] = field(default_factory=dict)
    release_models: Mapping[str, str] = field(default_factory=dict)

    @property
    def transformer(self) -> ModelSpec:
        return self.components["transformer"]

    @property
    def vae(self) -> ModelSpec | None:
        return self.components.get("vae")

    @property
    def model_components(self) -> tuple[str, ...]:
        """The components other than the transformer (VAE, ...), in the family's order."""
        return tuple(name for name in self.components if name != "transformer")

    @property
    def pipeline_models(self) -> tuple[str, ...]:
        """The model components the tasks' pipelines hold (a pipeline export writes or links each)."""
        return tuple(name for name in self.model_components if self.components[name].in_pipeline)

    # -- variants ------------------------------------------------------------------------------------------
    def variant_named(self, name: str) -> Variant:
        for variant in self.variants:
            if variant.name.lower() == name.lower():
                return variant
        raise CogExportError(f"unknown {self.name} model name {name!r}; one of "
                             f"{', '.join(v.name for v in self.variants)}")

    def published_variant(self, facts: Mapping[str, Any], experts: tuple[str, ...] = (),
                          task: str | None = None) -> Variant | None:
        """The published variant with exactly these shape facts (and these expert subfolders), if any; of ``task``
        when two variants of different tasks share their shapes."""
        for variant in self.variants:
            if tuple(variant.experts.values()) == tuple(experts) and task in (None, variant.task) and all(
                    facts.get(key) == value for key, value in variant.shapes.items()):
                return variant
        return None

    def tasks_of(self, facts: Mapping[str, Any]) -> tuple[str, ...]:
        """Every task a model with these shapes can be, the default first."""
        return self.shapes.tasks_of(facts)

    def layout_variant(self, config: Mapping[str, Any], experts: tuple[str, ...] = (),
                       pipeline: Mapping[str, Any] | None = None,
                       components: Mapping[str, Mapping[str, Any]] | None = None) -> Variant:
        """The published variant a (possibly resized) transformer config, with its pipeline's settings if known, is
        built like: it decides the pipeline, the scheduler and the VAE's latent scaling of a custom-size model.
        ``components`` are the other model configs of a --base pipeline ({"vae": ...})."""
        name = self.shapes.layout_variant(config, experts, pipeline)
        if components:
            name = self.shapes.variant_of_components(name, components)
        return self.variant_named(name)

    def expert_layout(self, count: int) -> Mapping[str, str]:
        """Pipeline component -> release subfolder of the family's releases with ``count`` experts (empty if none)."""
        return next((v.experts for v in self.variants if v.experts and len(v.experts) == count), {})

    def has_config(self, variant: Variant, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` is the variant's published transformer config (lists and tuples alike)."""
        published = json.loads(json.dumps(self.transformer_config(variant)))
        given = json.loads(json.dumps({key: config.get(key) for key in published}))
        return published == given

    # -- configs -------------------------------------------------------------------------------------------
    def component_class(self, component: str, variant: Variant) -> str:
        """The Diffusers class of one of the variant's models."""
        return variant.classes.get(component) or self.components[component].class_name

    def component_config(self, component: str, variant: Variant) -> dict:
        """The published config of one of the variant's models: its class's defaults and the variant's values."""
        return {**class_defaults(self.component_class(component, variant)), **variant.configs.get(component, {})}

    def transformer_config(self, variant: Variant) -> dict:
        return self.component_config("transformer", variant)

    def vae_config(self, variant: Variant) -> dict:
        return self.component_config("vae", variant)

    def scheduler_class_for(self, variant: Variant) -> str:
        return variant.classes.get(SCHEDULER) or self.tasks[variant.task].scheduler or self.scheduler_class

    def scheduler_for(self, variant: Variant) -> dict:
        """The scheduler's config values; a variant naming its own scheduler class gives them all (another class's
        values need not fit it: Kandinsky 6's distilled models sample with pi-Flow, the others with flow matching)."""
        if SCHEDULER in variant.classes:
            return dict(variant.scheduler)
        task = self.tasks[variant.task]
        config = task.scheduler_config if task.scheduler else self.scheduler_config
        return {**(config or {}), **variant.scheduler}

    def task(self, name: str) -> Task:
        return self.tasks[name]

    @property
    def transformer_folders(self) -> tuple[str, ...]:
        """The pipeline components the tasks' transformers are, the default first: the prefixes a Diffusers LoRA's
        keys and adapter config may carry (one pipeline may hold several tasks' transformers: MiniMax-H3's
        transformer_ref/ for Ref2VA)."""
        return tuple(dict.fromkeys((DEFAULT_TRANSFORMER_FOLDER, *(t.transformer_folder for t in self.tasks.values()))))

    def tasks_in_folder(self, folder: str) -> tuple[str, ...]:
        """The tasks whose transformer is the pipeline component ``folder``."""
        return tuple(name for name, task in self.tasks.items() if task.transformer_folder == folder)

    def from_base(self, variant: Variant) -> tuple[str, ...]:
        """The pipeline components a --base folder supplies for this variant."""
        return variant.from_base if variant.from_base is not None else self.tasks[variant.task].from_base


def class_defaults(class_name: str) -> dict:
    """A Diffusers class's constructor defaults (what its config holds for arguments a variant leaves alone), kept
    on disk per Diffusers version (diffusers_cache.py) where JSON carries them exactly; a new dict each call."""
    return copy.deepcopy(_remembered_defaults(class_name))


@cache
def _remembered_defaults(class_name: str) -> dict:
    return remembered("defaults", {"class": class_name}, lambda: {"defaults": _live_defaults(class_name)},
                      fields=("defaults",))["defaults"]


def _live_defaults(class_name: str) -> dict:
    return {name: p.default for name, p in inspect.signature(model_class(class_name).__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def model_class(class_name: str) -> type:
    """The Diffusers model class of this name: a top-level export of diffusers, or a pipeline's own model that a
    family's component names with its module (``module = "pipelines.ltx2"``)."""
    import diffusers

    found = getattr(diffusers, class_name, None)
    if found is not None:
        return found
    modules = {spec.module for family in families() for spec in family.components.values()
               if class_name in spec.classes and spec.module}
    for module in modules:
        found = getattr(importlib.import_module(f"diffusers.{module}"), class_name, None)
        if found is not None:
            return found
    raise CogExportError(f"Diffusers has no model class {class_name!r}")


def model_index_entry(class_name: str) -> list[str]:
    """[library, class] as a pipeline's save_pretrained writes a model component into model_index.json: "diffusers"
    for Diffusers' own models, the pipeline module's name for a pipeline's own model (["ltx2", "LTX2Vocoder"])."""
    answer = remembered("model_index_entry", {"class": class_name},
                        lambda: {"entry": _live_model_index_entry(class_name)}, fields=("entry",))
    return list(answer["entry"])


def _live_model_index_entry(class_name: str) -> list[str]:
    import diffusers

    if getattr(diffusers, class_name, None) is not None:
        return ["diffusers", class_name]
    parts = model_class(class_name).__module__.split(".")
    return [parts[2] if len(parts) > 2 and parts[1] == "pipelines" else parts[0], class_name]


# -- loading ----------------------------------------------------------------------------------------------------
def _require(condition: bool, family: str, message: str) -> None:
    if not condition:
        raise FamilyError(f"family {family}: {message}")


def table_name(family_key: str, name: str) -> str:
    """A table named in a family.toml: the family's own (``original_vae``), or another family's (``wan/original_vae``:
    families that share a model, such as the Wan variants sharing Wan's VAE, share its tables)."""
    return name if "/" in name else f"{family_key}/{name}"


def _model_spec(data: ComponentSection, key: str, component: str) -> ModelSpec:
    originals = data.original if isinstance(data.original, tuple) else (data.original,)
    unknown = {o.writer for o in originals} - set(ORIGINAL_WRITERS)
    _require(not unknown, key, f"[{component}] original names unknown writer(s) {', '.join(sorted(unknown))} "
             f"(one of {', '.join(w for w in ORIGINAL_WRITERS if w)})")
    return ModelSpec(
        component=component,
        class_name=data.class_name,
        tables=tuple(table_name(key, name) for name in data.tables),
        module=data.module,
        keep_fp32=data.keep_fp32,
        originals=tuple(replace(o, table=table_name(key, o.table)) for o in originals),
        in_pipeline=data.in_pipeline,
        other_classes=data.other_classes,
    )


def _variant(data: VariantEntry, index: int, key: str, components: Mapping[str, ModelSpec],
             tasks: Mapping[str, Task]) -> Variant:
    place = (f"variant #{index + 1}",)
    try:
        unknown = [name for name in data.configs if name not in components]
        if unknown:
            raise unknown_field(place, unknown[0])
        configs = {name: convert(data.configs[name], dict, place, name) for name in components if name in data.configs}
        unknown = [name for name in data.null if name not in components]
        if unknown:
            raise unknown_field((*place, "null"), unknown[0])
        for name, keys in data.null.items():  # a published config's nulls, which TOML cannot write
            configs[name] = {**configs.get(name, {}), **dict.fromkeys(keys)}
    except SchemaError as error:
        raise FamilyError(f"family {key}: {error}") from None
    variant = Variant(data.name, data.hub_id, data.task, data.shapes, configs, data.scheduler, data.pipeline,
                      data.experts, data.from_base, data.classes)
    _require(variant.task in tasks, key, f"variant {variant.name} has unknown task {variant.task!r}")
    for component, class_name in data.classes.items():
        if component == SCHEDULER:  # any scheduler class: Diffusers checks it when the scheduler is first built
            continue
        _require(class_name in (components[component].other_classes if component in components else ()), key,
                 f"variant {variant.name}'s classes give {component} {class_name}, which is not one of that "
                 "component's other_classes")
    return variant


def _lora_layout(layout: LoraLayout, index: int, key: str) -> LoraLayout:
    """A LoRA layout with its table names in full; one of a file of its own says nothing else, another its format."""
    where = header(("lora", f"layout #{index + 1}"))
    if layout.file is not None:
        _require(given(layout).keys() == {"file"}, key, f"{where}: a layout with a file of its own gives nothing else")
        return replace(layout, file=table_name(key, layout.file))
    _require(layout.format is not None and layout.modules is not None, key,
             f"{where} needs format and modules (or a file of its own)")
    return replace(layout, modules=table_name(key, layout.modules))


def _shapes_module(name: str, key: str) -> FamilyShapes:
    """The family's shapes module: cogexport.models.<name>, or a module path of its own (a family of another
    package), checked against the declared interface."""
    module = importlib.import_module(name if "." in name else f"cogexport.models.{name}")
    missing = FamilyShapes.missing_hooks(module)
    _require(not missing, key, f"its shapes module {module.__name__} lacks {', '.join(f'{m}()' for m in missing)} "
             "(see cogexport/models/shapes.py)")
    return FamilyShapes(module)


def _read(text: str, key: str) -> FamilyFile:
    try:
        return read(FamilyFile, tomllib.loads(text))
    except SchemaError as error:
        raise FamilyError(f"family {key}: {error}") from None


def parse_family(text: str, key: str) -> ModelFamily:
    data = _read(text, key)
    head, pipeline, lora = data.family, data.pipeline, data.lora
    components = {name: _model_spec(spec, key, name) for name, spec in data.components.items()}
    _require("transformer" in components, key, "[transformer] is missing")
    components = {"transformer": components.pop("transformer"), **components}
    tasks = {name: Task(name, spec.pipeline, spec.pipeline_tag,
                        spec.from_base if spec.from_base is not None else pipeline.from_base,
                        spec.scheduler, spec.scheduler_config, spec.transformer_folder)
             for name, spec in data.tasks.items()}
    variants = tuple(_variant(v, index, key, components, tasks) for index, v in enumerate(data.variant))
    names = [v.name.lower() for v in variants]
    _require(len(names) == len(set(names)), key, "two variants share a name")
    _require(set(pipeline.from_checkpoint) <= set(components), key,
             "[pipeline] from_checkpoint names an unknown component")
    layouts = tuple(_lora_layout(layout, index, key) for index, layout in enumerate(lora.layout))
    _check_release(data.release, key, components, tasks)
    return ModelFamily(
        key=key, name=head.name, shapes=_shapes_module(head.shapes, key), tags=head.tags,
        components=components, lora_layouts=layouts,
        lora_names_from=(lora.names_from,) if isinstance(lora.names_from, str) else tuple(lora.names_from or ()),
        lora_recorded_settings=dict(lora.recorded_settings),
        scheduler_class=pipeline.scheduler, scheduler_config=pipeline.scheduler_config,
        tasks=tasks, variants=variants, from_checkpoint=pipeline.from_checkpoint, extends=head.extends,
        same_weights_as=head.same_weights_as,
        release_partitions=dict(data.release.partitions), release_models=dict(data.release.models),
    )


def _check_release(release, key: str, components: Mapping[str, ModelSpec], tasks: Mapping[str, Task]) -> None:
    """[release]: partitions of known tasks, each holding its transformer, and models of known components."""
    if not release.partitions and not release.models:
        return
    _require(set(release.partitions) <= set(tasks), key, "[release] partitions names an unknown task")
    _require(set(release.models) <= set(components), key, "[release] models names an unknown component")
    _require("transformer" in release.models, key, "[release] models must say where a partition holds its "
             "transformer")
    folders = [tasks[task].transformer_folder for task in release.partitions]
    _require(len(folders) == len(set(folders)), key, "[release] partitions of tasks whose transformers go to one "
             "transformer_folder")


def families() -> tuple[ModelFamily, ...]:
    """Every family of every key-map root (cogexport's own key_maps/ first), in name order within a root."""
    return _families(key_map_roots())


@cache
def _families(roots: tuple[str, ...]) -> tuple[ModelFamily, ...]:
    found: dict[str, ModelFamily] = {}
    for key, folder in family_folders():
        spec = folder.joinpath(FAMILY_FILE)
        if not spec.is_file():
            continue
        _require(key not in found, key, "two key-map roots hold a family of this name")
        found[key] = parse_family(spec.read_text(encoding="utf-8"), key)
    for key, family in found.items():
        _require(set(family.extends) <= set(found) - {key}, key, "[family] extends names no other family")
        _require(set(family.same_weights_as) <= set(found) - {key}, key,
                 "[family] same_weights_as names no other family")
    return tuple(found.values())


def component_title(component: str) -> str:
    """A pipeline component as messages name it: vae -> VAE, audio_vae -> audio VAE, transformer_2 -> transformer 2."""
    return " ".join("VAE" if word == "vae" else word for word in component.split("_"))


def family_named(name: str) -> ModelFamily:
    for family in families():
        if name.lower() in (family.key, family.name.lower()):
            return family
    raise CogExportError(f"unknown model family {name!r}; one of {', '.join(f.name for f in families())}")


def family_of_class(class_name: str) -> tuple[ModelFamily, str] | None:
    """The family and pipeline component (transformer, vae, ...) a Diffusers class belongs to; of families that
    share a model (Wan's VAE, which its variants list with Wan's tables), the one whose own tables translate it."""
    found = [(family, component) for family in families() for component, spec in family.components.items()
             if class_name in spec.classes]
    owners = [(family, component) for family, component in found
              if any(table.split("/", 1)[0] == family.key for table in family.components[component].tables)]
    return (owners or found or [None])[0]


def family_of_variant(name: str) -> tuple[ModelFamily, Variant]:
    """The published variant with this name, in whichever family has it (for --model-name)."""
    for family in families():
        for variant in family.variants:
            if variant.name.lower() == name.lower():
                return family, variant
    known = ", ".join(v.name for f in families() for v in f.variants)
    raise CogExportError(f"unknown model name {name!r}; one of {known}")


def all_tasks() -> tuple[str, ...]:
    return tuple(dict.fromkeys(task for family in families() for task in family.tasks))


def all_transformer_folders() -> tuple[str, ...]:
    """Every family's pipeline components a transformer is (the prefixes of Diffusers LoRA files, before the file's
    family is known)."""
    return tuple(dict.fromkeys(folder for family in families() for folder in family.transformer_folders))
