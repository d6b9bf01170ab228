"""Planning the models an export writes (the parts): the transformer (or one expert), a transformer with a LoRA
adapter fused in, and the other components a family exports (VAE, ...). Each part is the meta-device Diffusers
model it becomes, the checked plan of its tensors and their casts: everything but the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ..checkpoint import LazyCheckpoint
from ..errors import CogExportError
from ..keymap.plan import Plan, plan_translation
from ..keymap.table import KeyMapTable
from ..lazy import LazyTensor
from ..lora import LoraAdapter, base_weights, check_fits, plan_fused
from ..models.base_folder import BaseFolder
from ..models.family import DEFAULT_TRANSFORMER_FOLDER, ModelFamily, Variant, component_title
from ..models.recognize import (Recognised, choose_table, component_tables, diffusers_config_beside, family_beside,
                                fitting_tables, recognise)
from ..models.target import TargetModel, build_target
from ..models.target_choice import TargetRequest, TransformerChoice, choose_transformer
from ..precision import PrecisionPolicy
from ..write.shards import ShardPlan
from .adapter_component import adapter_task_options
from .inputs import ExportInputs
from .options import MODEL_DTYPE, ExportOptions


@dataclass
class ModelExport:
    """One Diffusers model to write: its meta-device target, the checked plan, and the cast tensors."""

    component: str  # the pipeline component it becomes: transformer, transformer_2, vae, ...
    target: TargetModel
    plan: Plan
    tensors: dict[str, LazyTensor]
    policy: PrecisionPolicy
    table: KeyMapTable
    family: ModelFamily
    label: str = ""  # what the model is, for the user: a published name, or a custom size in a variant's layout
    published: bool = False
    shards: ShardPlan | None = None
    notes: list[str] = field(default_factory=list)
    variant: Variant | None = None  # the published variant whose pipeline it belongs to (transformers)


def precision(defaults: Sequence[str], options: ExportOptions) -> PrecisionPolicy:
    return PrecisionPolicy.build(options.dtype or MODEL_DTYPE, defaults, options.keep_fp32)


def target_request(options: ExportOptions, base: BaseFolder | None, component: str = "transformer",
                   experts: tuple[str, ...] = ()) -> TargetRequest:
    return TargetRequest(options.model_type, options.model_name, base, component, experts)


def family_hint(base: BaseFolder | None, options: ExportOptions, folders: Sequence[Path] = ()) -> ModelFamily | None:
    """The family --base or --model-name names, else the one a config.json in ``folders`` names (models of two
    families can have the same tensor names: LTX-Video's and LTX-2's VAEs, Wan's and SkyReels-V2's transformers)."""
    from ..models.family import family_of_variant

    if base is not None:
        return base.family
    if options.model_name:
        return family_of_variant(options.model_name)[0]
    return family_beside(folders)


def plan_transformer(source: Mapping[str, LazyTensor], options: ExportOptions, where: str,
                     base: BaseFolder | None = None, component: str = "transformer", experts: tuple[str, ...] = (),
                     folders: Sequence[Path] = ()) -> ModelExport:
    """The transformer (or the expert ``component`` of a model with ``experts``) of the checkpoint ``source``,
    translated into its Diffusers model; ``folders`` are where the run may keep its config."""
    family, table = choose_table(source, "transformer", "transformer", where, family_hint(base, options, folders))
    metadata = source.info.header_metadata if isinstance(source, LazyCheckpoint) else None  # a plain mapping has none
    recognised = recognise(source, table, family, experts, metadata)
    request = target_request(options, base, base_transformer_folder(component, family, options.model_type, base), experts)
    chosen = choose_transformer(recognised, family, request, where, folders)
    plan = plan_translation(table, source, chosen.target.schema, chosen.target.counts, what=where,
                            target=chosen.described_as, remedy=chosen.remedy)
    return _transformer_part(component, chosen, plan, table, options)


def _transformer_part(component: str, chosen: TransformerChoice, plan: Plan, table: KeyMapTable,
                      options: ExportOptions, label_suffix: str = "") -> ModelExport:
    policy = precision(chosen.family.transformer.keep_fp32, options)
    return ModelExport(component, chosen.target, plan, policy.apply(plan.tensors), policy, table, chosen.family,
                       chosen.label + label_suffix, chosen.published, notes=list(chosen.notes), variant=chosen.variant)


def model_family(adapter: LoraAdapter, base: BaseFolder | None, options: ExportOptions) -> ModelFamily:
    """The family of the model an adapter goes on: the one --base or --model-name names, when that family extends the
    adapter's (a Wan LoRA on a Wan VACE model's Wan blocks, or on a ChronoEdit model), else the adapter's own."""
    named = family_hint(base, options)
    if named is not None and adapter.family.key in named.extends:
        return named
    return adapter.family


def adapter_recognised(adapter: LoraAdapter) -> Recognised | None:
    """The facts of the model a LoRA run saved beside its adapter (None for an adapter alone)."""
    if not adapter.has_base_weights:
        return None
    facts = adapter.family.shapes.read_facts(adapter.base_shapes())
    return Recognised(adapter.family, adapter.base_table, facts, adapter.family.published_variant(facts))


def plan_fused_transformer(adapter: LoraAdapter, inputs: ExportInputs, component: str,
                           options: ExportOptions) -> ModelExport:
    """The transformer (or one expert) with the adapter fused in: the base weights come from the run when it saved
    them, else from --base."""
    where = inputs.where_of(component)
    options = adapter_task_options(adapter, options, where)
    family = model_family(adapter, inputs.base, options)
    held_in = base_transformer_folder(component, family, options.model_type, inputs.base)
    request = target_request(options, inputs.base, held_in, inputs.expert_names)
    chosen = choose_transformer(adapter_recognised(adapter), family, request, where)
    check_fits(adapter, chosen.target.schema, where)
    if adapter.has_base_weights:
        weights = base_weights(adapter, chosen.target.schema, chosen.target.counts, where)
    else:
        weights = _base_transformer_weights(inputs, family, chosen.target, component, held_in)
    fused = plan_fused(adapter, weights, where)
    return _transformer_part(component, chosen, Plan(fused), adapter.base_table, options, " + LoRA")


def base_transformer_folder(component: str, family: ModelFamily, task: str | None, base: BaseFolder | None) -> str:
    """Where a --base pipeline holds the transformer a checkpoint is exported as (its config; for an adapter, the
    weights it is fused into too): --model-type's task's transformer folder (a pipeline holding several tasks'
    transformers: MiniMax-H3's transformer_ref/ for Ref2VA), an expert's own."""
    if base is None or not base.is_pipeline or component != DEFAULT_TRANSFORMER_FOLDER or \
            task not in family.tasks:
        return component
    return family.task(task).transformer_folder


def _base_transformer_weights(inputs: ExportInputs, family: ModelFamily, target: TargetModel,
                              component: str, held_in: str) -> dict[str, LazyTensor]:
    """The base model's own transformer weights (for fusing an adapter that came without them): a pipeline's
    ``held_in`` folder."""
    base = inputs.base
    files = None if base is None else base.weight_files(held_in)
    if files is None:
        raise CogExportError(f"--lora fuse needs the base weights: {inputs.where_of(component)} holds only the "
                             "adapter; pass --base with the Diffusers pipeline or transformer folder (with its "
                             "weights) it was trained on")
    weights, folder = inputs.open_more(files), files[0] if files[0].is_dir() else files[0].parent
    _, table = choose_table(weights, "transformer", "transformer", f"--base {folder}", family)
    return plan_translation(table, weights, target.schema, target.counts, what=f"--base {folder}").tensors


# -- the other components (VAE, ...) ---------------------------------------------------------------------------
def _fitting_config(family: ModelFamily, component: str, class_name: str, table: KeyMapTable,
                    source: Mapping[str, LazyTensor], where: str) -> dict:
    """The one config among those of the family's variants with this class that this component's weights fit."""
    variants = [v for v in family.variants if family.component_class(component, v) == class_name]
    fitting = []
    configs = (family.component_config(component, v) for v in variants)
    for config in {repr(c): c for c in configs}.values():
        target = build_target(class_name, config)
        try:
            plan_translation(table, source, target.schema, target.counts, what=where)
        except CogExportError:
            continue
        fitting.append(config)
    if len(fitting) == 1:
        return fitting[0]
    if not fitting:  # an unpublished size: no --model-name would fit it either, only a config that describes it
        raise CogExportError(f"{where} holds {class_name} weights of no published {family.name} size (their shapes fit "
                             f"none of the {class_name} configs of {family.name}'s variants); pass --base with the "
                             f"pipeline (or model folder) whose {component}/config.json describes it")
    names = ", ".join(v.name for v in variants)
    raise CogExportError(f"a {component} alone does not say which {family.name} it belongs to (the variants' "
                         f"{component} configs differ, e.g. in latent scaling); pass --model-name (one of {names}) "
                         "or --base")


def component_class(family: ModelFamily, component: str, table: KeyMapTable, variant: Variant | None,
                    base: BaseFolder | None, where: str) -> str:
    """The class the weights' layout translates into, refused when the variant or --base says the component is
    another of its classes (LTX-2.0's vocoder where 2.3's, with bandwidth extension, is expected, or the other way
    round): the weights' names say which, and a model of the other class would not load them."""
    found = family.components[component].class_of(table)
    title = component_title(component)
    if variant is not None and family.component_class(component, variant) != found:
        raise CogExportError(f"{where} holds {found} weights ({table.source}), but {variant.name}'s {title} is "
                             f"{family.component_class(component, variant)}; give the {title} of that model, or the "
                             "--model-name or --base of the model this one belongs to")
    named = (base.config(component) or {}).get("_class_name") if base else None
    # only another class of this component: a config naming some other class is checked against the weights as before
    if named != found and named in family.components[component].classes:
        raise CogExportError(f"--base {base.config_file(component)} describes {named}, but {where} holds {found} "
                             f"weights ({table.source}); give as --base the pipeline (or model folder) the checkpoint "
                             "belongs to")
    return found


def plan_component(source: Mapping[str, LazyTensor], component: str, family: ModelFamily | None,
                   variant: Variant | None, base: BaseFolder | None, options: ExportOptions, where: str,
                   folders: Sequence[Path] = ()) -> ModelExport:
    """A model other than the transformer (the VAE, ...): --base's config, else the Diffusers config.json beside
    the weights (a save_pretrained folder), else the published variant's (or the one variant config it fits)."""
    family, table = choose_table(source, component, component_title(component), where, family)
    spec = family.components[component]
    class_name = component_class(family, component, table, variant, base, where)
    config = base.config(component) if base else None
    if base is not None and config is None:
        raise CogExportError(f"--base {base.path} has no {component} config.json (give a pipeline folder with "
                             f"{component}/, or a {component} folder)")
    if config is None and variant is None:
        config = diffusers_config_beside(class_name, folders)
    if config is None:
        config = family.component_config(component, variant) if variant is not None else \
            _fitting_config(family, component, class_name, table, source, where)
    target = build_target(class_name, config)
    told = dict(target=f"the {component_title(component)} --base describes ({base.config_file(component)})",
                remedy="give as --base the pipeline (or model folder) the checkpoint belongs to, if this is not "
                       "it") if base else {}
    plan = plan_translation(table, source, target.schema, target.counts, what=where, **told)
    policy = precision(spec.keep_fp32, options)
    return ModelExport(component, target, plan, policy.apply(plan.tensors), policy, table, family,
                       f"{variant.name if variant else family.name} {component_title(component)}", variant=variant)


def components_inside(source: Mapping[str, LazyTensor], family: ModelFamily) -> tuple[str, ...]:
    """The components a release holds beside its transformer (LTX-Video's single file: the VAE): those of the
    family's ``from_checkpoint`` one of whose layouts fits."""
    keys = list(source)
    return tuple(name for name in family.from_checkpoint if fitting_tables(keys, component_tables(name, family)))


def components_of_file(source: Mapping[str, LazyTensor], family: ModelFamily) -> tuple[str, ...]:
    """The pipeline components a --vae file gives: the VAE, or those of the family's ``from_checkpoint`` whose layouts
    it holds (a release may ship several models in one file: LTX-2.5's audio VAE file holds the audio VAE and the
    vocoder); the VAE when none fits, so that its refusal says what the file holds."""
    keys = list(source)
    candidates = [name for name in dict.fromkeys(("vae", *family.from_checkpoint)) if name in family.components]
    return tuple(name for name in candidates if fitting_tables(keys, component_tables(name, family))) or ("vae",)


def count_shared_keys_once(parts: list[ModelExport], keys: list[str]) -> None:
    """Models that share one file: a key one of them reads is not 'ignored' by the others, nor 'dropped' by one whose
    table drops it because it is the other's (LTX-2's text connectors under the transformer's prefix)."""
    selected = {id(part): set(part.table.select(keys)[0].values()) for part in parts}
    read = {id(part): selected[id(part)] - set(part.plan.dropped) for part in parts}
    used = set().union(*read.values())
    seen = set().union(*selected.values())
    for part in parts:
        elsewhere = used - read[id(part)]
        part.plan.ignored = [key for key in part.plan.ignored if key not in seen]
        part.plan.dropped = {key: why for key, why in part.plan.dropped.items() if key not in elsewhere}
