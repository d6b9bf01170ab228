"""A model family (CogVideoX, Wan, ...) as data: ``key_maps/<family>/family.toml`` beside the family's key-map tables.

The file declares the Diffusers classes and the tables that translate into them, the published variants (names,
Hub ids, the shape facts that tell them apart, the config values that differ from the class defaults), the fp32
allowlists, the pipeline composition per task (pipeline class, what ``--base`` supplies, the scheduler) and the
way back to the original layout. The facts that truly need code (reading shapes, naming a custom config's layout)
live in one small module per family, ``cogexport/models/<shapes>.py``, named by the file. Shared code reads
families from here and never asks which family it has.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from types import ModuleType
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..errors import CogExportError

FAMILY_FILE = "family.toml"


class FamilyError(ValueError):
    """A family.toml is malformed (a bug in the family's data, not in the user's input)."""


@dataclass(frozen=True)
class Variant:
    """A published model: its name and Hub id, the facts its shapes show, and its config values."""

    name: str
    hub_id: str
    task: str
    shapes: Mapping[str, Any]
    transformer: Mapping[str, Any] = field(default_factory=dict)
    vae: Mapping[str, Any] = field(default_factory=dict)
    scheduler: Mapping[str, Any] = field(default_factory=dict)
    pipeline: Mapping[str, Any] = field(default_factory=dict)  # pipeline config values (boundary_ratio, ...)
    experts: Mapping[str, str] = field(default_factory=dict)  # pipeline component -> the release's subfolder
    from_base: tuple[str, ...] | None = None  # components taken from --base, when not the task's


@dataclass(frozen=True)
class OriginalLayout:
    """How the family's own code stores the model: the table that runs backwards and the writer of the file."""

    table: str
    # "safetensors" (single or sharded files with the family's config.json), "sat" (a SAT folder: latest +
    # 1/mp_rank_00_model_states.pt), "model_states" (one torch.save file `file` holding {"module": state dict}),
    # "torch" (one torch.save state dict, e.g. Wan2.1_VAE.pth), "single_file" (one safetensors file holding the
    # transformer and, for a pipeline, its VAE, each under its prefix: LTX-Video), or "" for a VAE written beside
    # the transformer by a single_file writer
    writer: str
    prefix: str = ""
    file: str = ""


@dataclass(frozen=True)
class ModelSpec:
    """One Diffusers model class of the family and the tables that translate checkpoints into it."""

    class_name: str
    tables: tuple[str, ...]
    keep_fp32: tuple[str, ...] = ()
    # the original layouts, in the order tried: the first whose inverted table takes every tensor is written (a family
    # may have several, e.g. Wan's 2.1 and 2.2 VAEs)
    originals: tuple[OriginalLayout, ...] = ()

    @property
    def original(self) -> OriginalLayout | None:
        return self.originals[0] if self.originals else None


@dataclass(frozen=True)
class Task:
    name: str
    pipeline: str
    pipeline_tag: str
    from_base: tuple[str, ...]


@dataclass(frozen=True)
class ModelFamily:
    key: str  # the folder under key_maps/
    name: str  # as people write it: CogVideoX, Wan
    shapes: ModuleType  # reads facts off tensor shapes (see cogexport/models/cogvideox.py for the interface)
    tags: tuple[str, ...]
    transformer: ModelSpec
    vae: ModelSpec | None
    lora_tables: tuple[str, ...]
    lora_keep_fp32: tuple[str, ...]
    lora_names_from: str | None
    scheduler_class: str
    scheduler_config: Mapping[str, Any]
    tasks: Mapping[str, Task]
    variants: tuple[Variant, ...]
    vae_from_checkpoint: bool = False  # releases hold the VAE beside the transformer (LTX-Video's single file)

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
        """Every task a model with these shapes can be, the default first. A shapes module whose tasks share shapes
        (HunyuanVideo's T2V and 16-channel I2V) says so with ``tasks_of``; otherwise ``task_of`` is the answer."""
        several = getattr(self.shapes, "tasks_of", None)
        return tuple(several(facts)) if several else (self.shapes.task_of(facts),)

    def layout_variant(self, config: Mapping[str, Any], experts: tuple[str, ...] = (),
                       pipeline: Mapping[str, Any] | None = None,
                       components: Mapping[str, Mapping[str, Any]] | None = None) -> Variant:
        """The published variant a (possibly resized) transformer config, with its pipeline's settings if known, is
        built like: it decides the pipeline, the scheduler and the VAE's latent scaling of a custom-size model.

        ``components`` are the other model configs of a --base pipeline ({"vae": ...}); a family whose releases
        differ only there (LTX-Video's 2B versions: same transformer, another VAE) refines its choice with the
        shapes module's optional ``variant_of_components(name, components)``."""
        name = self.shapes.layout_variant(config, experts, pipeline)
        refine = getattr(self.shapes, "variant_of_components", None)
        if components and refine is not None:
            name = refine(name, components)
        return self.variant_named(name)

    def has_config(self, variant: Variant, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` is the variant's published transformer config (lists and tuples alike)."""
        published = json.loads(json.dumps(self.transformer_config(variant)))
        given = json.loads(json.dumps({key: config.get(key) for key in published}))
        return published == given

    # -- configs -------------------------------------------------------------------------------------------
    def transformer_config(self, variant: Variant) -> dict:
        return {**class_defaults(self.transformer.class_name), **variant.transformer}

    def vae_config(self, variant: Variant) -> dict:
        return {**class_defaults(self.vae.class_name), **variant.vae}

    def scheduler_for(self, variant: Variant) -> dict:
        return {**self.scheduler_config, **variant.scheduler}

    def task(self, name: str) -> Task:
        return self.tasks[name]

    def from_base(self, variant: Variant) -> tuple[str, ...]:
        """The pipeline components a --base folder supplies for this variant."""
        return variant.from_base if variant.from_base is not None else self.tasks[variant.task].from_base


def class_defaults(class_name: str) -> dict:
    """A Diffusers class's constructor defaults (what its config holds for arguments a variant leaves alone)."""
    import diffusers

    model_class = getattr(diffusers, class_name)
    return {name: p.default for name, p in inspect.signature(model_class.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


# -- loading ----------------------------------------------------------------------------------------------------
def _require(condition: bool, family: str, message: str) -> None:
    if not condition:
        raise FamilyError(f"family {family}: {message}")


def _model_spec(data: dict, key: str, what: str) -> ModelSpec:
    _require(isinstance(data.get("class"), str), key, f"[{what}] needs class")
    originals = data.get("original", [])
    originals = [originals] if isinstance(originals, dict) else originals
    _require(all(isinstance(o, dict) and "table" in o for o in originals), key,
             f"[{what}] original needs a table (one inline table or a list of them)")
    return ModelSpec(
        class_name=data["class"],
        tables=tuple(f"{key}/{name}" for name in data.get("tables", ())),
        keep_fp32=tuple(data.get("keep_fp32", ())),
        originals=tuple(OriginalLayout(f"{key}/{o['table']}", o.get("writer", ""), o.get("prefix", ""), o.get("file", ""))
                        for o in originals),
    )


def parse_family(text: str, key: str) -> ModelFamily:
    data = tomllib.loads(text)
    unknown = set(data) - {"family", "transformer", "vae", "lora", "pipeline", "tasks", "variant"}
    _require(not unknown, key, f"unknown section(s) {', '.join(sorted(unknown))}")
    header, pipeline, lora = data.get("family", {}), data.get("pipeline", {}), data.get("lora", {})
    _require(isinstance(header.get("name"), str) and isinstance(header.get("shapes"), str), key,
             "[family] needs name and shapes")
    tasks = {name: Task(name, spec["pipeline"], spec["pipeline_tag"],
                        tuple(spec.get("from_base", pipeline.get("from_base", ()))))
             for name, spec in data.get("tasks", {}).items()}
    variants = tuple(Variant(v["name"], v["hub_id"], v["task"], v.get("shapes", {}), v.get("transformer", {}),
                             v.get("vae", {}), v.get("scheduler", {}), v.get("pipeline", {}), v.get("experts", {}),
                             tuple(v["from_base"]) if "from_base" in v else None)
                     for v in data.get("variant", ()))
    for variant in variants:
        _require(variant.task in tasks, key, f"variant {variant.name} has unknown task {variant.task!r}")
    names = [v.name.lower() for v in variants]
    _require(len(names) == len(set(names)), key, "two variants share a name")
    return ModelFamily(
        key=key, name=header["name"], shapes=importlib.import_module(f"cogexport.models.{header['shapes']}"),
        tags=tuple(header.get("tags", ())), transformer=_model_spec(data.get("transformer", {}), key, "transformer"),
        vae=_model_spec(data["vae"], key, "vae") if "vae" in data else None,
        lora_tables=tuple(f"{key}/{name}" for name in lora.get("tables", ())),
        lora_keep_fp32=tuple(lora.get("keep_fp32", ())), lora_names_from=lora.get("names_from"),
        scheduler_class=pipeline.get("scheduler", ""), scheduler_config=pipeline.get("scheduler_config", {}),
        tasks=tasks, variants=variants, vae_from_checkpoint=bool(pipeline.get("vae_from_checkpoint", False)),
    )


@cache
def families() -> tuple[ModelFamily, ...]:
    """Every family shipped in key_maps/, in name order."""
    root = resources.files("cogexport.key_maps")
    found = []
    for folder in sorted(root.iterdir(), key=lambda p: p.name):
        spec = folder.joinpath(FAMILY_FILE)
        if spec.is_file():
            found.append(parse_family(spec.read_text(encoding="utf-8"), folder.name))
    return tuple(found)


def family_named(name: str) -> ModelFamily:
    for family in families():
        if name.lower() in (family.key, family.name.lower()):
            return family
    raise CogExportError(f"unknown model family {name!r}; one of {', '.join(f.name for f in families())}")


def family_of_class(class_name: str) -> tuple[ModelFamily, str] | None:
    """The family and component ("transformer" or "vae") a Diffusers class belongs to."""
    for family in families():
        if family.transformer.class_name == class_name:
            return family, "transformer"
        if family.vae is not None and family.vae.class_name == class_name:
            return family, "vae"
    return None


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
