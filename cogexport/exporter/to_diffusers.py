"""The main job: a training checkpoint of any family cogexport knows to a Diffusers model, a folder per expert, or a
whole pipeline folder; for a LoRA run, the adapter file (or a model with the adapter fused in).

open the inputs -> plan the parts (the key-map table whose signature the names carry names the family; each part is
checked against its target model built on the meta device, and cast by the family's dtype policy) -> plan every
file of the folder -> publish (staged write, move into place, optional upload). Bad input fails before a byte is
written. Nothing here knows a family by name: what differs between families is data (key_maps/<family>/family.toml)
and each family's small shapes module.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..checkpoint import LazyCheckpoint
from ..checkpoint.readers import info_dict
from ..errors import CogExportError
from ..lora import LoraAdapter
from ..models.family import ModelFamily, Variant, component_title, family_of_variant
from ..write.diffusers_folders import plan_model_folder
from ..write.folder_plan import FolderPlan
from .adapters import adapters_to_fuse, lora_summary, plan_adapter_export, read_adapters
from .experts import assign_experts
from .diffusers_layout import linked_from_base, model_folders, pipeline_folder
from .inputs import ExportInputs, open_inputs
from .options import PIPELINE, ExportOptions, checked_format, default_component, is_pipeline_folder, lora_mode
from .output_formats import OutputFormat
from .parts import (ModelExport, components_inside, components_of_file, count_shared_keys_once, family_hint,
                    plan_component, plan_fused_transformer, plan_transformer)
from .publish import publish
from .result import ExportResult


def export(checkpoint, output, options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Export ``checkpoint`` (a path or several) into the Diffusers folder ``output``; see ExportOptions."""
    _, options = checked_format(replace(options or ExportOptions(), **overrides), "diffusers")
    output = Path(output)
    with open_inputs(checkpoint, options) as inputs:
        mode = lora_mode(options, inputs.lora_marker, inputs.where)
        adapters = assign_experts(read_adapters(inputs, options), inputs, options) if mode else {}
        if mode == "adapter":
            folder, result = plan_adapter_export(inputs, adapters, options, str(output))
        else:
            folder, result = _plan_model_export(inputs, options, adapters, str(output))
        return publish(folder, result, output, inputs, options)


def _plan_model_export(inputs: ExportInputs, options: ExportOptions, adapters: dict[str, LoraAdapter],
                       output: str) -> tuple[FolderPlan, ExportResult]:
    """Full weights (with the adapters fused in, for --lora fuse) as model folders or a pipeline folder."""
    component = default_component(options)
    parts, variant = _plan_parts(inputs, adapters, component, options)
    for part in parts:
        part.shards = plan_model_folder(part.tensors, options.max_shard_size, options.variant)
    if component == PIPELINE:
        folder = pipeline_folder(parts, inputs.base, variant, inputs, options, adapters.get("transformer"))
    else:
        folder = model_folders(parts, variant, inputs, options, adapters.get("transformer"))
    return folder, _model_result(parts, variant, component, folder, inputs, adapters, output)


def _named_family(inputs: ExportInputs, options: ExportOptions) -> tuple[ModelFamily | None, Variant | None]:
    if options.model_name:
        return family_of_variant(options.model_name)
    return family_hint(inputs.base, options, inputs.search_folders()), None


def plan_transformers(inputs: ExportInputs, options: ExportOptions) -> list[ModelExport]:
    """Every expert's transformer (one for an ordinary model) in Diffusers names, checked against its Diffusers model
    and cast by the family's policy, a LoRA run's adapter fused in: what a format writing the transformer in Diffusers
    names plans its files from."""
    return _plan_transformers(inputs, adapters_to_fuse(inputs, options), options)


def _plan_transformers(inputs: ExportInputs, adapters: dict[str, LoraAdapter],
                       options: ExportOptions) -> list[ModelExport]:
    """Every expert's transformer (one for an ordinary model), with its adapter fused in when there is one."""
    if adapters:
        return [plan_fused_transformer(adapter, inputs, component, options) for component, adapter in adapters.items()]
    return [plan_transformer(source, _task_options(inputs, component, options), inputs.where_of(component),
                             inputs.base, component, inputs.expert_names, inputs.search_folders(component))
            for component, source in inputs.sources.items()]


def _task_options(inputs: ExportInputs, component: str, options: ExportOptions) -> ExportOptions:
    """A release folder of partitions: each transformer is its partition's task's model, as --model-type would say."""
    task = inputs.tasks.get(component)
    return replace(options, model_type=task) if task else options


def _plan_parts(inputs: ExportInputs, adapters: dict[str, LoraAdapter], component: str,
                options: ExportOptions) -> tuple[list[ModelExport], Variant | None]:
    family, variant = _named_family(inputs, options)
    parts: list[ModelExport] = []
    if component in ("transformer", PIPELINE):
        parts = _plan_transformers(inputs, adapters, options)
        family, variant = parts[0].family, parts[-1].variant
    inside: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    given = _given_files(inputs, family, options) if component == PIPELINE else []
    if component == PIPELINE:  # a model a --vae file gives is not taken from the checkpoint too
        from_files = {name for _, _, names in given for name in names}
        inside = tuple(name for name in components_inside(inputs.source, family) if name not in from_files)
        # a release folder of partitions: the models they share (its VAEs), each from its own file
        released = tuple(name for name in inputs.models if name not in from_files)
        _check_pipeline(inputs, parts, variant, (*inside, *released, *from_files), options)
    for name in (*((component,) if component not in ("transformer", PIPELINE) else ()), *inside, *released):
        folders = inputs.search_folders(name) if name in inputs.models else inputs.search_folders()
        parts.append(plan_component(inputs.model_source(name), name, family, variant, inputs.base, options,
                                    inputs.where_of(name) if name in inputs.models else inputs.where, folders))
    if inside:  # the models share the file: a key one of them reads is not ignored by the others
        count_shared_keys_once(parts, list(inputs.source))
    for path, source, names in given:
        of_file = [plan_component(source, name, family, variant, inputs.base, options, str(path)) for name in names]
        count_shared_keys_once(of_file, list(source))  # LTX-2.5's audio VAE file: two models, one file
        parts += of_file
    return parts, variant


def _given_files(inputs: ExportInputs, family: ModelFamily,
                 options: ExportOptions) -> list[tuple[Path, LazyCheckpoint, tuple[str, ...]]]:
    """Each --vae file, opened, with the pipeline components it gives; a component two of them hold is refused."""
    given, seen = [], {}
    for path in options.vae:
        source = inputs.open_more([path])
        names = components_of_file(source, family)
        for name in names:
            if name in seen:
                raise CogExportError(f"--vae {seen[name]} and --vae {path} both hold the {component_title(name)}; "
                                     "give each model once")
            seen[name] = path
        given.append((path, source, names))
    return given


def _check_pipeline(inputs: ExportInputs, parts: list[ModelExport], variant: Variant, inside: tuple[str, ...],
                    options: ExportOptions) -> None:
    """Before anything is planned further: the pipeline can be complete."""
    exported = {part.component for part in parts} | set(inside)
    linked = tuple(name for name in linked_from_base(parts, variant, inputs.base) if name not in exported)
    inputs.base.check_pipeline(linked=linked)
    if variant.experts and not inputs.experts:
        folders = " and ".join(f"{sub}/" for sub in variant.experts.values())
        raise CogExportError(f"--base {inputs.base.path} is a {variant.name} pipeline, whose {len(variant.experts)} "
                             f"experts ({', '.join(variant.experts.values())}) all come from the checkpoint, but "
                             f"{inputs.where} is one model; give the folder holding {folders}, or export --component "
                             "transformer")


def _model_result(parts: list[ModelExport], variant: Variant | None, component: str, folder: FolderPlan,
                  inputs: ExportInputs, adapters: dict[str, LoraAdapter], output: str) -> ExportResult:
    label = parts[0].label or (variant.name if variant else f"{parts[0].family.name} VAE")
    result = ExportResult(output, component, label, folder.written_paths, sum(len(p.tensors) for p in parts),
                          sum(p.shards.total_bytes for p in parts), parts[0].policy.describe(),
                          family=parts[0].family.name, source=info_dict(inputs.source.info),
                          notes=[*inputs.source.info.notes, *inputs.notes_of_others()])
    if adapters:
        result.lora = lora_summary(adapters, inputs)
        result.notes += [note for each in adapters.values() for note in each.warnings]
    for part in parts:
        result.notes += part.notes
        result.dropped.update(part.plan.dropped)
        result.ignored += len(part.plan.ignored)
    return result


def _check(options: ExportOptions) -> None:
    """--vae goes into a pipeline, and a pipeline needs --base's pipeline folder for what the checkpoint lacks."""
    component = default_component(options)
    if options.vae and component != PIPELINE:
        raise CogExportError("--vae goes into a pipeline (--component pipeline); to export a VAE alone, give it "
                             "as CHECKPOINT with --component vae")
    if component == PIPELINE and not is_pipeline_folder(options.base):
        raise CogExportError("--component pipeline needs --base DIR: a local Diffusers pipeline folder of the base "
                             "model, for the text encoder and tokenizer (nothing is downloaded)")


def _verify(output: Path, request):
    from ..verify_models import verify_model_folders

    return verify_model_folders(output, request)


def _inspect_folder(path: Path, check_data: bool) -> dict | None:
    from ..inspect_folders import diffusers_folder_kind, inspect_diffusers_folder

    return inspect_diffusers_folder(path, check_data) if diffusers_folder_kind(path) is not None else None


def _render_folder(report: dict) -> str:
    from ..inspect_folders import render_folder_text

    return render_folder_text(report)


FORMAT = OutputFormat(
    name="diffusers",
    title="Diffusers folders (a model, a folder per expert, or a whole pipeline with --base)",
    writes="pipeline",
    export=export,
    takes=frozenset({"vae", "variant", "push_to_hub", "private"}),
    check=_check,
    verify=_verify,
    inspects_folder=_inspect_folder,
    renders_folder=_render_folder,
)
