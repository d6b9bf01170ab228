"""The folder plan of a Diffusers export: one model folder, one folder per expert, or a whole pipeline folder (the
exported models, what --base supplies, the scheduler, model_index.json and the model card), every file made before
the staging folder is opened."""

from __future__ import annotations

from ..errors import CogExportError
from ..lora import LoraAdapter
from ..models.base_folder import BaseFolder
from ..models.family import Variant, model_index_entry
from ..models.pipeline_facts import pipeline_signature, scheduler_config
from ..write.diffusers_folders import model_folder_files, model_index_file, scheduler_file
from ..write.folder_plan import SAFETENSORS_METADATA, FolderPlan, LinkedFolder, TensorFile, TextFile
from .cards import model_folder_card
from .inputs import ExportInputs
from .options import ExportOptions
from .parts import ModelExport


def model_folders(parts: list[ModelExport], variant: Variant | None, inputs: ExportInputs, options: ExportOptions,
                  adapter: LoraAdapter | None) -> FolderPlan:
    """One model folder, or with several parts (every expert of a multi-expert model) one folder each, named by
    its pipeline component; and the model card saying how to load them."""
    folder = FolderPlan()
    for part in parts:
        folder.add(*part_files(part, part.component if len(parts) > 1 else ""))
    folder.add(TextFile("README.md", model_folder_card(parts, variant, options, inputs.source, adapter,
                                                       pipeline=False)))
    folder.check()
    return folder


def part_files(part: ModelExport, folder: str) -> list:
    """A model folder: config.json and the weights as save_pretrained writes them, and the tensors the table keeps
    beside them because the Diffusers class has no place for them (each kept file as it was, uncast)."""
    kept = [TensorFile(f"{folder}/{file}" if folder else file, tensors, metadata=SAFETENSORS_METADATA)
            for file, tensors in part.plan.kept.items()]
    return [*model_folder_files(folder, part.target.config_json, part.tensors, part.shards), *kept]


def linked_from_base(parts: list[ModelExport], variant: Variant, base: BaseFolder) -> tuple[str, ...]:
    """The pipeline components --base supplies: the task's (text encoders, tokenizers, ...) and every model of the
    family that was not exported (the VAE, unless it came from the checkpoint or --vae). An optional component of the
    pipeline class that the base's own model_index.json says is null ([null, null]: save_pretrained of a pipeline
    built without it, as Kandinsky 6's may be without its audio VAE and vocoder) is not linked: the export's index
    says null for it too, and the pipeline loads as the base does."""
    family, exported = parts[0].family, {part.component for part in parts}
    wanted = (*family.from_base(variant), *(name for name in family.pipeline_models if name not in exported))
    null = {name for name in wanted if base.components.get(name) == [None, None]}
    # (the pipeline class is asked only then: a modular pipeline's has no signature to ask)
    optional = set(pipeline_signature(family.task(variant.task).pipeline).optional) if null else set()
    return tuple(name for name in wanted if name not in null & optional)


def pipeline_folder(parts: list[ModelExport], base: BaseFolder, variant: Variant, inputs: ExportInputs,
                    options: ExportOptions, adapter: LoraAdapter | None) -> FolderPlan:
    family = parts[0].family
    if base.modular_index:
        return modular_pipeline_folder(parts, base, variant, inputs, options, adapter)
    if not family.scheduler_class:  # a family whose Diffusers pipeline no model_index.json describes
        raise CogExportError(f"{base.path} is a pipeline folder, but cogexport writes no {family.name} pipeline (its "
                             "family.toml declares no [pipeline] scheduler); give --base the transformer's own "
                             f"folder ({base.path / 'transformer'}) to export the transformer")
    task = family.task(variant.task)
    folder = FolderPlan()
    for part in parts:
        folder.add(*part_files(part, part.component))
    linked = linked_from_base(parts, variant, base)
    folder.add(*(LinkedFolder(name, base.component_dir(name)) for name in linked))
    scheduler_class = family.scheduler_class_for(variant)
    folder.add(scheduler_file("scheduler", scheduler_config(scheduler_class, family.scheduler_for(variant))))
    components = {name: base.components[name] for name in family.from_base(variant) if name in base.components}
    # a model taken from --base keeps the base's own entry (its class may be a variant's other class)
    components.update({name: base.components.get(name) or model_index_entry(family.components[name].class_name)
                       for name in linked if name in family.components})
    components.update(scheduler=["diffusers", scheduler_class])
    components.update({part.component: model_index_entry(part.target.class_name) for part in parts})
    folder.add(model_index_file(pipeline_signature(task.pipeline), task.pipeline, components, variant.pipeline),
               TextFile("README.md", model_folder_card(parts, variant, options, inputs.source, adapter)))
    folder.check()
    return folder


def pipeline_folder_of(part: ModelExport, variant: Variant) -> str:
    """The pipeline folder a part goes to: a transformer to its own task's (a pipeline holding several tasks'
    transformers: MiniMax-H3's transformer_ref/ for Ref2VA), any other model to its component's."""
    if part.component != "transformer":
        return part.component
    return part.family.task((part.variant or variant).task).transformer_folder


def modular_pipeline_folder(parts: list[ModelExport], base: BaseFolder, variant: Variant, inputs: ExportInputs,
                            options: ExportOptions, adapter: LoraAdapter | None) -> FolderPlan:
    """A modular pipeline (Diffusers' ModularPipeline), whose index gives every component's class and loading spec:
    the exported models in their folders, every other component of the base's index linked from it, and the base's
    index files as they are. The exported models keep the classes the index names, and a ModularPipeline loads a
    component whose files are in the folder from the folder, so the index still says how to load them all."""
    folders = {part.component: pipeline_folder_of(part, variant) for part in parts}
    for part in parts:
        named = base.components.get(folders[part.component], [None, None])[1]
        if named != part.target.class_name:
            raise CogExportError(f"--base {base.path}/{base.modular_index[0]} names {named} for "
                                 f"{folders[part.component]}/, not the exported {part.target.class_name}; give the "
                                 f"base pipeline of this model ({variant.name})")
    folder = FolderPlan()
    for part in parts:
        folder.add(*part_files(part, folders[part.component]))
    folder.add(*(LinkedFolder(name, base.component_dir(name)) for name in base.components
                 if name not in folders.values()))
    folder.add(*(TextFile(name, (base.path / name).read_text(encoding="utf-8")) for name in base.modular_index),
               TextFile("README.md", model_folder_card(parts, variant, options, inputs.source, adapter)))
    folder.check()
    return folder
