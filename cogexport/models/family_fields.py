"""What ``key_maps/<family>/family.toml`` may say: its sections and fields, declared once (cogexport/schema.py reads
the file with them; the docs' field tables are made from them). family.py turns them into a ModelFamily and checks
what types cannot say (known tasks, writers and components, the shapes module's hooks)."""

# No `from __future__ import annotations`: the schema takes these types as objects, with nothing to evaluate.

from dataclasses import dataclass
from typing import Any

from ..keymap.table_fields import LoraLayout
from ..schema import declared

# the writers of original layouts (cogexport/exporter/original_writers.py); "" writes a model into another's file
ORIGINAL_WRITERS = ("safetensors", "sat", "model_states", "torch", "single_file", "")


@dataclass(frozen=True, kw_only=True)
class FamilySection:
    """``[family]``: who the family is."""

    name: str = declared("as people write it; used in messages and `--help`")
    shapes: str = declared("the shapes module: `cogexport.models.<name>`, or a dotted path of another package's")
    tags: tuple[str, ...] = declared("model card tags", ())
    extends: tuple[str, ...] = declared(
        "families whose model this one's extends with layers of its own (Wan VACE: Wan's blocks and a VACE branch): "
        "their LoRA adapters, on layers this model has too, apply to it", ())
    same_weights_as: tuple[str, ...] = declared(
        "families whose weights this one's are exactly, names and shapes alike (ChronoEdit: Wan 2.1 I2V's), the "
        "difference being in the config alone: where neither `--model-name`, `--base` nor a config beside the "
        "weights says which, an export of such weights is refused, never guessed", ())


@dataclass(frozen=True)
class OriginalLayout:
    """How the family's own code stores a model: the table that runs backwards and the writer of the file. In
    family.toml, a component's ``original`` (one inline table, or a list of them tried in order)."""

    table: str = declared("the table run backwards (`--to original`)")
    writer: str = declared(
        "a name in cogexport/exporter/original_writers.py: `safetensors` (single or sharded files with the family's "
        "config.json), `sat` (a SAT folder: latest + 1/mp_rank_00_model_states.pt), `model_states` (one torch.save "
        "file `file` holding {\"module\": state dict}), `torch` (one torch.save state dict, e.g. Wan2.1_VAE.pth; from "
        "a pipeline, with the components written into it), "
        "`single_file` (one safetensors file holding the transformer and, from a pipeline, the components the release "
        "keeps beside it, each under its prefix: LTX-Video), or `\"\"` for a component written into the transformer's "
        "file", "")
    prefix: str = declared("the prefix its keys get in a single file", "")
    file: str = declared("the file written", "")
    under: str = declared("the dict entry a `torch` writer saves the state dict under (a trainer's "
                          "torch.save({\"state_dict\": ...}), as NVlabs' Sana releases are); empty: the file is the "
                          "state dict itself", "")


@dataclass(frozen=True, kw_only=True)
class ComponentSection:
    """``[transformer]``, ``[vae]``, ``[audio_vae]``, ...: one Diffusers model the family exports (the section's name
    is the pipeline component); ``[transformer]`` is required."""

    class_name: str = declared("the Diffusers class", key="class")
    tables: tuple[str, ...] = declared(
        "every layout that translates into it (a name with a slash is another family's table: `wan/original_vae`)",
        ())
    module: str = declared(
        "where the class lives when Diffusers does not export it at the top level (a pipeline's own model: "
        "`pipelines.ltx2`)", "")
    keep_fp32: tuple[str, ...] = declared("globs on dotted name components kept in fp32; say why in a comment", ())
    other_classes: tuple[str, ...] = declared(
        "other Diffusers classes this component is in some variants (LTX-2.3's vocoder with bandwidth extension): "
        "each table translates into the class its `target` names, a variant's `classes` says which it has", ())
    in_pipeline: bool = declared(
        "whether the tasks' pipelines hold it (false: a model of another pipeline of the family, exported with "
        "--component alone and never taken from --base: LTX-2.5's diffusion decoder)", True)
    original: OriginalLayout | tuple[OriginalLayout, ...] = declared(
        "the way back (`--to original`): a list is tried in order, the first whose inverted table takes every tensor "
        "written", ())


@dataclass(frozen=True, kw_only=True)
class LoraSection:
    """``[lora]``: the family's LoRA adapters (see adding-a-lora-format.md)."""

    names_from: str | tuple[str, ...] | None = declared(
        "the variant whose model has every tensor name (adapters' names are checked against it), or a list of "
        "variants whose models together have every one (LTX-2: 2.0's caption projections, 2.3's gates)", None)
    layout: tuple[LoraLayout, ...] = declared("the layouts its adapters come in, in the order they are tried", ())
    recorded_settings: dict[str, str] = declared(
        "settings a trainer records in the adapter's config (the header's lora_adapter_metadata, adapter_config.json) "
        "that change what its matrices mean, each with what it means and which layouts read which values: an adapter "
        "is read only by a layout that reads the value it records (`reads_settings`), and refused when none does "
        "rather than read as if the setting were absent", {})


@dataclass(frozen=True, kw_only=True)
class PipelineSection:
    """``[pipeline]``: what every task's pipeline shares."""

    from_base: tuple[str, ...] = declared("the components `--base` supplies (a task may say otherwise)", ())
    scheduler: str = declared("the scheduler class", "")
    scheduler_config: dict[str, Any] = declared("the scheduler's config values", {})
    from_checkpoint: tuple[str, ...] = declared(
        "components a release file holds beside the transformer (LTX-Video: `[\"vae\"]`); a pipeline exported from "
        "such a file takes them from it", ())


@dataclass(frozen=True, kw_only=True)
class ReleaseSection:
    """``[release]``: a release folder holding one partition per task, each a folder of the pipeline's models
    (MiniMax-H3's FL2VA/ and Ref2VA/), read as one input and written back as one folder."""

    partitions: dict[str, str] = declared(
        "task -> the release folder's subfolder holding that task's models (`fl2va = \"FL2VA\"`)", {})
    models: dict[str, str] = declared(
        "pipeline component -> where each partition holds it: a folder, or a file (a name ending `.safetensors`: "
        "the release keeps it as that one file, and the way back writes it so); the `transformer` is each "
        "partition's own, going to its task's `transformer_folder`, every other model is one the partitions share "
        "and must be equal in all of them", {})


@dataclass(frozen=True, kw_only=True)
class TaskSection:
    """``[tasks.<task>]``: one task (`--model-type` takes its name)."""

    pipeline: str = declared("the Diffusers pipeline class")
    pipeline_tag: str = declared("the model card's pipeline_tag")
    from_base: tuple[str, ...] | None = declared(
        "the components `--base` supplies for this task (default: `[pipeline] from_base`)", None)
    scheduler: str | None = declared(
        "the scheduler class of this task's pipeline, when not `[pipeline] scheduler`", None)
    scheduler_config: dict[str, Any] | None = declared(
        "that scheduler's config values (with `scheduler`; default: `[pipeline] scheduler_config`)", None)
    transformer_folder: str = declared(
        "the pipeline folder's subfolder this task's transformer goes to, when its pipeline holds the transformers of "
        "several tasks (MiniMax-H3's `transformer_ref`); also the component prefix of a Diffusers-layout LoRA of that "
        "transformer, read as this task's adapter and written for it", "transformer")


@dataclass(frozen=True, kw_only=True)
class VariantEntry:
    """``[[variant]]``: one published model. Any other key is a component's name (`transformer = { ... }`): the
    config values that differ from the class's defaults."""

    name: str = declared("`--model-name` takes it")
    hub_id: str = declared("the Hub id: the model card's base_model")
    task: str = declared("a task of `[tasks]`")
    shapes: dict[str, Any] = declared("the facts the shapes module reads that tell this variant apart", {})
    scheduler: dict[str, Any] = declared("scheduler values that differ from `[pipeline] scheduler_config`", {})
    pipeline: dict[str, Any] = declared("pipeline config values (boundary_ratio, ...)", {})
    experts: dict[str, str] = declared(
        "pipeline component -> the release's subfolder, for a release of several experts", {})
    from_base: tuple[str, ...] | None = declared(
        "the components `--base` supplies for this variant, when not its task's", None)
    classes: dict[str, str] = declared(
        "component -> its Diffusers class in this variant, when not the component's `class` (one of its "
        "`other_classes`); `scheduler` -> its pipeline's scheduler class, when not its task's (then `scheduler` "
        "gives that class's whole config: Kandinsky 6's distilled models' `PiflowScheduler`)", {})
    null: dict[str, tuple[str, ...]] = declared(
        "component -> its config keys whose published value is null (TOML has no null)", {})
    # any value here, so that a key naming no component is refused as unknown (family.py) before its type is checked
    configs: dict[str, Any] = declared("component -> its config values off the class's defaults (a table)", rest=True)


@dataclass(frozen=True, kw_only=True)
class FamilyFile:
    """``key_maps/<family>/family.toml``: a model family as data."""

    family: FamilySection = declared("who the family is")
    lora: LoraSection = declared("its LoRA layouts", LoraSection())
    pipeline: PipelineSection = declared("its pipelines", PipelineSection())
    release: ReleaseSection = declared("its release folder of partitions, if it has one", ReleaseSection())
    tasks: dict[str, TaskSection] = declared("its tasks, by name", {})
    variant: tuple[VariantEntry, ...] = declared("its published models", ())
    components: dict[str, ComponentSection] = declared("its models, by pipeline component", rest=True)
