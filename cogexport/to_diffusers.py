"""The main job: a training checkpoint of any family cogexport knows (CogVideoX, Wan, ...) to a Diffusers
transformer, VAE or whole pipeline folder, or for a LoRA run to an adapter file (or a model with the adapter fused).

read (any checkpoint cogexport opens) -> translate (the key-map table whose signature the names carry; it names
the family) -> check against the target model built on the meta device -> cast (the family's dtype policy) ->
write (staged, then moved into place) -> publish (optional upload). Everything up to the write is planned from
names and shapes, so bad input fails before a byte is written. Nothing here knows a family by name: what differs
between families is data (key_maps/<family>/family.toml) and each family's small shapes module.
"""

from __future__ import annotations

import shlex
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from .checkpoint import LazyCheckpoint, as_paths, open_checkpoint, open_ema
from .errors import CogExportError
from .keymap.plan import Plan, plan_translation
from .keymap.table import KeyMapTable
from .lazy import LazyTensor
from .lora import WRITABLE, AdapterOutput, LoraAdapter, base_weights, check_fits, plan_fused, plan_output, read_adapter
from .lora.formats import FORMATS
from .models.base_folder import BaseFolder, open_base
from .models.family import ModelFamily, Variant, family_of_variant
from .models.recognize import (Recognised, choose_table, expert_folders, component_tables, config_beside, diffusers_config_beside,
                               fitting_tables, lora_key, read_facts)
from .models.target import TargetModel, build_target
from .precision import PrecisionPolicy
from .progress import byte_progress
from .write.diffusers_folders import (link_or_copy_tree, plan_model_folder, write_model_folder, write_model_index,
                                      write_scheduler)
from .write.model_card import CardFacts, model_card
from .write.safetensors_file import write_safetensors
from .write.shards import ShardPlan
from .write.staging import check_destination, staged_folder

COMPONENTS = ("transformer", "vae", "pipeline")
LORA_MODES = ("adapter", "fuse")


@dataclass
class ExportOptions:
    model_type: str | None = None  # the family's task (t2v, i2v, ...); checked against the checkpoint when given
    component: str | None = None  # default: pipeline when --base is a pipeline folder, else transformer
    base: Path | None = None
    vae: Path | None = None  # a VAE checkpoint for the pipeline (default: the base's VAE)
    dtype: str = "bf16"
    keep_fp32: tuple[str, ...] = ()
    max_shard_size: str | int = "5GB"
    variant: str | None = None  # file-name variant, as save_pretrained(variant=...)
    tag: str | None = None
    ema: bool = False
    lora: str | None = None  # adapter or fuse; a LoRA run defaults to adapter
    lora_alpha: float | None = None
    lora_format: str | None = None  # the adapter file's layout (diffusers, peft, comfyui, musubi); default diffusers
    model_name: str | None = None  # a published variant name, for VAE-only exports or to check detection
    base_model: str | None = None  # the Hub id the model card names as base model
    overwrite: bool = False
    push_to_hub: str | None = None
    private: bool = False
    progress: bool | None = None
    command: str = ""


@dataclass
class ModelExport:
    """One Diffusers model to write: its meta-device target, the checked plan, and the cast tensors."""

    component: str  # the pipeline component it becomes: transformer, transformer_2 or vae
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


@dataclass
class ExportResult:
    output: str
    component: str
    model: str
    files: list[str]
    tensors: int
    total_bytes: int
    precision: str
    family: str = ""
    dropped: dict[str, str] = field(default_factory=dict)
    ignored: int = 0
    linked: dict[str, str] = field(default_factory=dict)
    lora: dict | None = None
    notes: list[str] = field(default_factory=list)
    source: dict = field(default_factory=dict)
    pushed_to: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def command_line() -> str:
    """The command as the user typed it, for the model card."""
    return "cogexport " + shlex.join(sys.argv[1:])


def open_source(paths: list[Path], options: ExportOptions) -> LazyCheckpoint:
    return open_ema(paths, options.tag) if options.ema else open_checkpoint(paths, options.tag)


def _policy(defaults: Sequence[str], options: ExportOptions) -> PrecisionPolicy:
    return PrecisionPolicy.build(options.dtype, defaults, options.keep_fp32)


def _search_folders(paths: list[Path], source: LazyCheckpoint) -> list[Path]:
    """Where a run may have saved its configs: the folders given, and above each checkpoint folder."""
    folders = [p if p.is_dir() else p.parent for p in paths]
    for folder in source.own_folders():
        folders += [folder, folder.parent]
    return list(dict.fromkeys(folders))


def _model_name_family(options: ExportOptions) -> tuple[ModelFamily, Variant] | None:
    return family_of_variant(options.model_name) if options.model_name else None


def _family_hint(base: BaseFolder | None, options: ExportOptions) -> ModelFamily | None:
    named = _model_name_family(options)
    return base.family if base else (named[0] if named else None)


# -- the transformer ----------------------------------------------------------------------------------------------
@dataclass
class _TransformerTarget:
    family: ModelFamily
    target: TargetModel
    variant: Variant
    label: str
    published: bool
    notes: list[str] = field(default_factory=list)  # what the user should know about the choice


def _transformer_target(recognised: Recognised | None, family: ModelFamily, base: BaseFolder | None,
                        options: ExportOptions, where: str, folders: Sequence[Path] = (), component: str = "transformer",
                        experts: tuple[str, ...] = ()) -> _TransformerTarget:
    """The Diffusers transformer to export into: --base's config, else the config the original release keeps beside
    its weights, else the published variant of this shape (of --model-type's task, when tasks share shapes)."""
    base_config = base.config(component) if base else None
    published = recognised.variant if recognised else None
    if base is not None and base_config is None:
        raise CogExportError(f"--base {base.path} has no {component} config.json (give a pipeline folder with "
                             f"{component}/, or a transformer folder)")
    if options.model_type and options.model_type not in family.tasks:
        raise CogExportError(f"--model-type {options.model_type} is not a {family.name} task; {where} is a {family.name} "
                             f"model (tasks: {', '.join(family.tasks)})")
    if recognised is not None and options.model_type:
        if options.model_type not in recognised.tasks:
            task = recognised.task
            name = published.name if published else f"a {family.name} {task.upper()} model of unpublished size"
            raise CogExportError(f"checkpoint is {name} (in_channels {recognised.facts.get('in_channels')}) but "
                                 f"--model-type {options.model_type} was given")
        published = family.published_variant(recognised.facts, experts, options.model_type)
    beside = None if base_config is not None or options.model_name or recognised is None else \
        config_beside(family, folders, recognised.facts)
    notes = []
    if base_config is not None or beside is not None:
        config = base_config if base_config is not None else beside
        variant = family.layout_variant(config, experts, base.settings if base else None,
                                        base.configs if base else None)
        if base is None and published is not None and family.has_config(published, config):
            variant = published  # a release whose own config is its published variant's config is that release
        told = f"--base {base.path}" if base_config is not None else "the config beside the checkpoint"
    else:
        variant = family.variant_named(options.model_name) if options.model_name else published
        if variant is None:
            what = (f"a {family.shapes.describe(recognised.facts)}, which is not a published {family.name} size"
                    if recognised else "an adapter alone")
            raise CogExportError(f"{where} is {what}; pass --base with a Diffusers folder whose config describes it")
        config = family.transformer_config(variant)
        told = f"--model-name {options.model_name}"
        if recognised is not None and not options.model_type and not options.model_name:
            others = {task: family.published_variant(recognised.facts, experts, task) for task in recognised.tasks[1:]}
            notes = [f"{where} has the shapes of {other.name if other else f'a {family.name} {task} model'} too; "
                     f"exported as {variant.name} ({variant.task}): pass --model-type {task} for that one"
                     for task, other in others.items() if other is not None or not recognised.variant]
    if options.model_type and variant.task != options.model_type:
        raise CogExportError(f"--model-type {options.model_type} was given, but {told} describes {variant.name}, a "
                             f"{variant.task} model")
    if recognised is not None:
        if base_config is not None and variant.task not in recognised.tasks:  # e.g. a Wan 2.1 T2V run, a 2.2 TI2V base
            raise CogExportError(f"{where} is a {family.name} {recognised.task.upper()} model (in_channels "
                                 f"{recognised.facts.get('in_channels')}), but --base {base.path} is a "
                                 f"{variant.name}-layout {variant.task.upper()} model; give the base the checkpoint "
                                 "was trained from")
        family.shapes.check_target(recognised.facts, config, where)
    is_published = published == variant if recognised else base_config is None
    label = variant.name if is_published else f"custom-size {family.name} ({variant.name} layout)"
    return _TransformerTarget(family, build_target(family.transformer.class_name, config), variant, label, is_published,
                              notes)


def _recognise(source: LazyCheckpoint, table: KeyMapTable, family: ModelFamily,
               experts: tuple[str, ...] = ()) -> Recognised:
    metadata = source.info.metadata if isinstance(source, LazyCheckpoint) else None  # a plain mapping has none
    return read_facts(family, table, {name: tensor.shape for name, tensor in source.items()}, experts, metadata)


def _recognise_adapter(adapter: LoraAdapter) -> Recognised | None:
    """The facts of the model a LoRA run saved beside its adapter (None for an adapter alone)."""
    if not adapter.has_base_weights:
        return None
    facts = adapter.family.shapes.read_facts(adapter.base_shapes())
    return Recognised(adapter.family, adapter.base_table, facts, adapter.family.published_variant(facts))


def plan_transformer(source: LazyCheckpoint, base: BaseFolder | None, options: ExportOptions, where: str,
                     folders: Sequence[Path] = (), component: str = "transformer",
                     experts: tuple[str, ...] = ()) -> tuple[ModelExport, Variant]:
    family, table = choose_table(source, "transformer", "transformer", where, _family_hint(base, options))
    recognised = _recognise(source, table, family, experts)
    chosen = _transformer_target(recognised, family, base, options, where, folders, component, experts)
    plan = plan_translation(table, source, chosen.target.schema, chosen.target.counts, what=where)
    policy = _policy(family.transformer.keep_fp32, options)
    return ModelExport(component, chosen.target, plan, policy.apply(plan.tensors), policy, table, family,
                       chosen.label, chosen.published, notes=chosen.notes), chosen.variant


def _base_transformer_weights(base: BaseFolder | None, family: ModelFamily, target: TargetModel,
                              stack: ExitStack, component: str = "transformer") -> dict | None:
    """The base model's own transformer weights (for fusing an adapter that came without them)."""
    if base is None:
        return None
    folder = base.component_dir(component) if base.is_pipeline else base.path
    if any(folder.glob("*.safetensors")):
        weights = stack.enter_context(open_checkpoint(folder))
    elif (folder / "diffusion_pytorch_model.bin").is_file():  # older save_pretrained output (read safely)
        weights = stack.enter_context(open_checkpoint(folder / "diffusion_pytorch_model.bin"))
    else:
        return None
    _, table = choose_table(weights, "transformer", "transformer", f"--base {folder}", family)
    return plan_translation(table, weights, target.schema, target.counts, what=f"--base {folder}").tensors


def plan_fused_transformer(adapter: LoraAdapter, base: BaseFolder | None, options: ExportOptions, where: str,
                           stack: ExitStack, component: str = "transformer",
                           experts: tuple[str, ...] = ()) -> tuple[ModelExport, Variant]:
    """The transformer (or one expert) with the adapter fused in: the base weights come from the run when it saved
    them, else from --base."""
    family = adapter.family
    chosen = _transformer_target(_recognise_adapter(adapter), family, base, options, where, component=component,
                                 experts=experts)
    target = chosen.target
    check_fits(adapter, target.schema, where)
    if adapter.has_base_weights:
        weights = base_weights(adapter, target.schema, target.counts, where)
    else:
        weights = _base_transformer_weights(base, family, target, stack, component)
        if weights is None:
            raise CogExportError(f"--lora fuse needs the base weights: {where} holds only the adapter; pass --base with "
                                 "the Diffusers pipeline or transformer folder (with its weights) it was trained on")
    fused = plan_fused(adapter, weights, where)
    policy = _policy(family.transformer.keep_fp32, options)
    return ModelExport(component, target, Plan(fused), policy.apply(fused), policy, adapter.base_table, family,
                       f"{chosen.label} + LoRA", chosen.published), chosen.variant


# -- the VAE ------------------------------------------------------------------------------------------------------
def _vae_config(family: ModelFamily, table: KeyMapTable, source: LazyCheckpoint, variant: Variant | None,
                where: str) -> dict:
    """The VAE config of the known variant, else the one config among the family's variants this VAE fits."""
    if variant is not None:
        return family.vae_config(variant)
    fitting = []
    for config in {repr(c): c for c in (family.vae_config(v) for v in family.variants)}.values():
        target = build_target(family.vae.class_name, config)
        try:
            plan_translation(table, source, target.schema, target.counts, what=where)
        except CogExportError:
            continue
        fitting.append(config)
    if len(fitting) == 1:
        return fitting[0]
    names = ", ".join(v.name for v in family.variants)
    raise CogExportError(f"a VAE alone does not say which {family.name} it belongs to (the variants' VAE configs "
                         f"differ, e.g. in latent scaling); pass --model-name (one of {names}) or --base")


def plan_vae(source: LazyCheckpoint, base: BaseFolder | None, family: ModelFamily | None, variant: Variant | None,
             options: ExportOptions, where: str, folders: Sequence[Path] = ()) -> ModelExport:
    """The VAE to export into: --base's config, else the Diffusers config.json beside the weights (a save_pretrained
    folder), else the published variant's (or the one variant config this VAE fits)."""
    family, table = choose_table(source, "vae", "VAE", where, family)
    config = base.config("vae") if base else None
    if base is not None and config is None:
        raise CogExportError(f"--base {base.path} has no VAE config.json (give a pipeline folder with vae/, or a VAE "
                             "folder)")
    if config is None and variant is None:
        config = diffusers_config_beside(family.vae.class_name, folders)
    if config is None:
        config = _vae_config(family, table, source, variant, where)
    target = build_target(family.vae.class_name, config)
    plan = plan_translation(table, source, target.schema, target.counts, what=where)
    policy = _policy(family.vae.keep_fp32, options)
    return ModelExport("vae", target, plan, policy.apply(plan.tensors), policy, table, family,
                       variant.name + " VAE" if variant else f"{family.name} VAE")


def _count_shared_keys_once(parts: list[ModelExport], keys: list[str]) -> None:
    used = {key for part in parts for key in part.table.select(keys)[0].values()}
    for part in parts:
        part.plan.ignored = [key for key in part.plan.ignored if key not in used]


def _holds_vae(source: LazyCheckpoint, family: ModelFamily) -> bool:
    """Whether the checkpoint holds the family's VAE beside the transformer (one of its VAE layouts fits)."""
    return bool(fitting_tables(list(source), component_tables("vae", family)))


# -- the job ------------------------------------------------------------------------------------------------------
def _lora_mode(source: LazyCheckpoint, options: ExportOptions, where: str) -> str | None:
    marker = lora_key(list(source))
    if options.lora_format is not None and options.lora_format not in WRITABLE:
        raise CogExportError(f"--lora-format {options.lora_format!r} is not one of {', '.join(WRITABLE)}")
    if options.lora is not None:
        if options.lora not in LORA_MODES:
            raise CogExportError(f"--lora {options.lora!r} is not one of {', '.join(LORA_MODES)}")
        if marker is None:
            raise CogExportError(f"{where} holds no LoRA adapter (no lora_A, lora_down or matrix_A weights); export "
                                 "it without --lora")
        if options.lora == "adapter" and options.component is not None:
            raise CogExportError(f"--lora adapter writes an adapter file, not a {options.component}; use --lora fuse "
                                 f"--component {options.component} to merge the adapter into one")
        if options.lora == "fuse" and options.lora_format is not None:
            raise CogExportError("--lora-format names the layout of an adapter file; --lora fuse writes a full model")
        return options.lora
    if marker is None and options.lora_format is not None:
        raise CogExportError(f"{where} holds no LoRA adapter (no lora_A, lora_down or matrix_A weights); "
                             "--lora-format is for LoRA checkpoints")
    if marker is not None and options.component is not None:
        raise CogExportError(f"{where} is a LoRA checkpoint ({marker}); export the adapter with --lora adapter, or "
                             "merge it into a full model with --lora fuse (giving --base when the checkpoint does not "
                             "hold the base weights)")
    return "adapter" if marker is not None else None


def _check_options(component: str, base: BaseFolder | None, options: ExportOptions) -> None:
    if component not in (*COMPONENTS, "lora adapter"):
        raise CogExportError(f"--component {component!r} is not one of {', '.join(COMPONENTS)}")
    if component == "pipeline" and not (base and base.is_pipeline):
        raise CogExportError("--component pipeline needs --base DIR: a local Diffusers pipeline folder of the base "
                             "model, for the text encoder and tokenizer (nothing is downloaded)")
    if options.vae is not None and component != "pipeline":
        raise CogExportError("--vae goes into a pipeline (--component pipeline); to export a VAE alone, give it "
                             "as CHECKPOINT with --component vae")
    if options.model_name and base is not None:
        raise CogExportError("--model-name and --base both say which model this is; give one of them")


def export(checkpoint: str | Path | Sequence[str | Path], output: str | Path,
           options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Export ``checkpoint`` into the Diffusers folder ``output``; see ExportOptions for the knobs."""
    options = replace(options or ExportOptions(), **overrides)
    paths, output = as_paths(checkpoint), Path(output)
    base = open_base(options.base) if options.base else None
    experts = expert_folders(paths)
    with ExitStack() as stack:
        sources = {component: stack.enter_context(open_source([folder], options))
                   for component, folder in experts.items()} or \
            {"transformer": stack.enter_context(open_source(paths, options))}
        source = sources["transformer"]
        where = ", ".join(str(p) for p in paths)
        mode = _lora_mode(source, options, where)
        adapters = _read_adapters(sources, experts, paths, base, options, where) if mode is not None else {}
        adapter = adapters.get("transformer")
        component = "lora adapter" if mode == "adapter" else \
            options.component or ("pipeline" if base and base.is_pipeline else "transformer")
        _check_options(component, base, options)
        read_files = [file for each in sources.values() for file in each.info.files]
        inputs = [*paths, *read_files, *([options.vae] if options.vae else []), *([base.path] if base else [])]
        own_folders = [folder for each in sources.values() for folder in each.own_folders()]
        if mode == "adapter":
            return _export_adapters(sources, adapters, experts, base, options, where, output, inputs)

        parts: list[ModelExport] = []
        named = _model_name_family(options)
        family, variant = named if named else (base.family if base else None, None)
        if component in ("transformer", "pipeline"):
            names = tuple(folder.name for folder in experts.values())
            if mode == "fuse":
                for name, each in adapters.items():
                    part, variant = plan_fused_transformer(each, base, options, _where_of(name, experts, where),
                                                           stack, name, names)
                    parts.append(part)
            else:
                for name, each in sources.items():
                    part, variant = plan_transformer(each, base, options, _where_of(name, experts, where),
                                                     _search_folders(_paths_of(name, experts, paths), each), name,
                                                     names)
                    parts.append(part)
            family = parts[0].family
        vae_inside = component == "pipeline" and options.vae is None and family.vae_from_checkpoint and \
            _holds_vae(source, family)
        if component == "pipeline":
            base.check_pipeline(linked=(*family.from_base(variant), *(() if options.vae or vae_inside else ("vae",))))
            if variant.experts and not experts:
                raise CogExportError(f"--base {base.path} is a {variant.name} pipeline, whose {len(variant.experts)} "
                                     f"experts ({', '.join(variant.experts.values())}) all come from the checkpoint, but "
                                     f"{where} is one model; give the folder holding "
                                     f"{' and '.join(f'{sub}/' for sub in variant.experts.values())}, or export "
                                     "--component transformer")
        if component == "vae" or vae_inside:  # a release that holds its VAE too gives the pipeline that VAE
            parts.append(plan_vae(source, base, family, variant, options, where, _search_folders(paths, source)))
        if vae_inside:  # the two models share the file: a key one of them reads is not ignored
            _count_shared_keys_once(parts, list(source))
        if component == "pipeline" and options.vae is not None:
            vae_source = stack.enter_context(open_checkpoint(as_paths(options.vae)))
            parts.append(plan_vae(vae_source, base, family, variant, options, str(options.vae)))
        for part in parts:
            part.shards = plan_model_folder(part.tensors, options.max_shard_size, options.variant)
        check_destination(output, own_folders, inputs, options.overwrite)

        label = parts[0].label or (variant.name if variant else f"{parts[0].family.name} VAE")
        result = ExportResult(str(output), component, label, [], sum(len(p.tensors) for p in parts),
                              sum(p.shards.total_bytes for p in parts), parts[0].policy.describe(),
                              family=parts[0].family.name, source=asdict(source.info), notes=list(source.info.notes))
        if adapters:
            result.lora = _lora_summary(adapters, experts)
            result.notes += [note for each in adapters.values() for note in each.warnings]
        for part in parts:
            result.notes += part.notes
            result.dropped.update(part.plan.dropped)
            result.ignored += len(part.plan.ignored)
        with staged_folder(output, result.total_bytes) as staging, \
                byte_progress(result.total_bytes, "export", options.progress) as bar:
            def on_tensor(_name: str, nbytes: int) -> None:
                bar.update(nbytes)

            if component == "pipeline":
                _write_pipeline(staging, parts, base, variant, options, source, result, on_tensor, adapter)
            elif len(parts) > 1:  # every expert of a multi-expert model, each in its pipeline component's folder
                for part in parts:
                    result.files += [f"{part.component}/{name}" for name in write_model_folder(
                        staging / part.component, part.target.model, part.tensors, part.shards, on_tensor)]
            else:
                part = parts[0]
                result.files = write_model_folder(staging, part.target.model, part.tensors, part.shards, on_tensor)
        if options.push_to_hub:
            result.pushed_to = _push(output, options)
        return result


# -- LoRA adapters ------------------------------------------------------------------------------------------------
def _read_adapters(sources: dict[str, LazyCheckpoint], experts: dict[str, Path], paths: list[Path],
                   base: BaseFolder | None, options: ExportOptions, where: str) -> dict[str, LoraAdapter]:
    """The adapter of each expert (one, for an ordinary run), checked against the model --base or --model-name
    names."""
    adapters = {}
    for name, source in sources.items():
        folders = _search_folders(_paths_of(name, experts, paths), source)
        adapters[name] = read_adapter(source, _where_of(name, experts, where), options.lora_alpha, folders, source.info.metadata,
                                      _family_hint(base, options))
    families = {adapter.family.name for adapter in adapters.values()}
    if len(families) > 1:
        raise CogExportError(f"{where}: the experts' adapters are of different families ({', '.join(sorted(families))})")
    family = next(iter(adapters.values())).family
    hint = _family_hint(base, options)
    if hint is not None and hint.key != family.key:
        given = f"--base {base.path}" if base else f"--model-name {options.model_name}"
        raise CogExportError(f"{where} is a {family.name} LoRA, but {given} is a {hint.name} model; give the "
                             f"{family.name} model it was trained on")
    return adapters


def _lora_summary(adapters: dict[str, LoraAdapter], experts: dict[str, Path]) -> dict:
    summary = next(iter(adapters.values())).summary()
    if experts:
        summary["experts"] = {experts[name].name: adapter.summary() for name, adapter in adapters.items()}
    return summary


def _adapter_target(adapter: LoraAdapter, base: BaseFolder | None, options: ExportOptions, where: str,
                    component: str, experts: tuple[str, ...]) -> tuple[_TransformerTarget | None, dict]:
    """The model the adapter is for, when known (--base, --model-name, or the base weights the run saved), and the
    schema its names and shapes are checked against (else: the family's layout, names only)."""
    recognised = _recognise_adapter(adapter)
    if base is None and not options.model_name and recognised is not None and recognised.variant is None:
        # A custom size: an adapter needs only its modules' names and shapes, which the run's own weights give.
        schema = adapter.base_shapes()
        check_fits(adapter, schema, where)
        return None, schema
    if base is not None and base.config(component) or recognised is not None or options.model_name:
        chosen = _transformer_target(recognised, adapter.family, base, options, where, component=component,
                                     experts=experts)
        check_fits(adapter, chosen.target.schema, where)
        return chosen, chosen.target.schema
    return None, adapter.names


def _export_adapters(sources: dict[str, LazyCheckpoint], adapters: dict[str, LoraAdapter], experts: dict[str, Path],
                     base: BaseFolder | None, options: ExportOptions, where: str, output: Path,
                     inputs: list[Path]) -> ExportResult:
    """The adapter file (one per expert, in the release's expert subfolders) in --lora-format's layout, the files
    its loader reads beside it, and a model card."""
    lora_format = options.lora_format or "diffusers"
    names = tuple(folder.name for folder in experts.values())
    planned: dict[str, tuple[AdapterOutput, _TransformerTarget | None]] = {}
    for name, adapter in adapters.items():
        part_where = _where_of(name, experts, where)
        chosen, schema = _adapter_target(adapter, base, options, part_where, name, names)
        base_model = options.base_model or (chosen.variant.hub_id if chosen and chosen.published else None)
        planned[experts[name].name if experts else ""] = (
            plan_output(adapter, lora_format, schema, _policy(adapter.family.lora_keep_fp32, options), part_where,
                        base_model), chosen)
    check_destination(output, [f for each in sources.values() for f in each.own_folders()], inputs, options.overwrite)
    first = next(iter(adapters.values()))
    chosen = next(iter(planned.values()))[1]
    total = sum(t.nbytes for out, _ in planned.values() for t in out.tensors.values())
    result = ExportResult(str(output), "lora adapter", chosen.label if chosen else first.family.name, [],
                          sum(len(out.tensors) for out, _ in planned.values()), total,
                          _policy(first.family.lora_keep_fp32, options).describe(), family=first.family.name,
                          lora={**_lora_summary(adapters, experts), "written_as": lora_format},
                          source=asdict(_first_source(sources).info),
                          notes=[*_first_source(sources).info.notes, *(n for a in adapters.values() for n in a.warnings)])
    with staged_folder(output, total) as staging, byte_progress(total, "export", options.progress) as bar:
        for sub, (out, _) in planned.items():
            folder = staging / sub if sub else staging
            folder.mkdir(parents=True, exist_ok=True)
            write_safetensors(folder / out.file, out.tensors, out.metadata, lambda _name, nbytes: bar.update(nbytes))
            for name, text in out.side_files.items():
                (folder / name).write_text(text, encoding="utf-8")
            result.files += [f"{sub}/{f}" if sub else f for f in (out.file, *out.side_files)]
        (staging / "README.md").write_text(_adapter_card(adapters, planned, lora_format, options,
                                                         _first_source(sources)), encoding="utf-8")
        result.files.append("README.md")
    if options.push_to_hub:
        result.pushed_to = _push(output, options)
    return result


def _where_of(name: str, experts: dict[str, Path], where: str) -> str:
    """What messages call one expert's part of the input (the whole input for an ordinary model)."""
    return str(experts[name]) if experts else where


def _paths_of(name: str, experts: dict[str, Path], paths: list[Path]) -> list[Path]:
    """Where one expert's files are (its own config.json sits in its subfolder); the input for an ordinary model."""
    return [experts[name]] if experts else paths


def _first_source(sources: dict[str, LazyCheckpoint]) -> LazyCheckpoint:
    return next(iter(sources.values()))


# -- pipeline folders and cards -----------------------------------------------------------------------------------
def _write_pipeline(staging: Path, parts: list[ModelExport], base: BaseFolder, variant: Variant,
                    options: ExportOptions, source: LazyCheckpoint, result: ExportResult,
                    on_tensor: Callable[[str, int], None], adapter: LoraAdapter | None) -> None:
    family = parts[0].family
    task = family.task(variant.task)
    exported = {part.component: part for part in parts}
    for name, part in exported.items():
        result.files += [f"{name}/{f}" for f in write_model_folder(staging / name, part.target.model, part.tensors,
                                                                   part.shards, on_tensor)]
    from_base = family.from_base(variant)
    for name in (*from_base, *(("vae",) if "vae" not in exported else ())):
        result.linked[name] = link_or_copy_tree(base.component_dir(name), staging / name)
    write_scheduler(staging / "scheduler", family.scheduler_class, family.scheduler_for(variant))
    components = {name: base.components[name] for name in from_base if name in base.components}
    components.update(scheduler=["diffusers", family.scheduler_class], vae=["diffusers", family.vae.class_name])
    components.update({name: ["diffusers", part.target.class_name] for name, part in exported.items()})
    write_model_index(staging, task.pipeline, components, variant.pipeline)
    (staging / "README.md").write_text(_pipeline_card(family, variant, options, source, exported, adapter),
                                       encoding="utf-8")
    result.files += ["scheduler/scheduler_config.json", "model_index.json", "README.md"]


def _source_line(source: LazyCheckpoint) -> str:
    info = source.info
    described = {"deepspeed": "DeepSpeed checkpoint", "safetensors": "safetensors weights", "torch": "torch state dict",
                 "dcp": "PyTorch distributed checkpoint", "deepspeed-universal": "DeepSpeed universal checkpoint"
                 }.get(info.format, info.format)
    where = f"{described} {', '.join(Path(p).name for p in info.paths)}"
    if info.tag:
        where += f", tag {info.tag}"
    if info.step is not None:
        where += f", step {info.step}"
    return f"{where} ({info.weights_source})"


def _pipeline_card(family: ModelFamily, variant: Variant, options: ExportOptions, source: LazyCheckpoint,
                   exported: dict[str, ModelExport], adapter: LoraAdapter | None) -> str:
    transformer = exported["transformer"]
    task = family.task(variant.task)
    details = [f"Key map: {part.table.name} ({part.table.description})" for part in exported.values()]
    if adapter is not None:
        details.append(f"LoRA fused into the weights: {adapter.describe()}")
    return model_card(CardFacts(
        title=f"{transformer.label} fine-tune",
        base_model=options.base_model or (variant.hub_id if transformer.published else None),
        relation="finetune",
        pipeline_tag=task.pipeline_tag,
        pipeline_class=task.pipeline,
        tags=family.tags,
        command=options.command or "cogexport (Python API)",
        source=_source_line(source),
        precision="; ".join(f"{name}: {part.policy.describe()}" for name, part in exported.items()),
        details=details,
        usage=(f"import torch\nfrom diffusers import {task.pipeline}\n\n"
               f"pipe = {task.pipeline}.from_pretrained(\"{options.push_to_hub or 'path/to/this/folder'}\", "
               + (f"variant=\"{options.variant}\", " if options.variant else "") + "torch_dtype=torch.bfloat16)"),
    ))


_STRENGTH_WHERE = {
    "diffusers": "lora_alpha, r and per-module patterns are in the file's lora_adapter_metadata",
    "peft": "lora_alpha, r and per-module patterns are in adapter_config.json",
    "comfyui": "each module's alpha is in its .alpha tensor (the loader applies alpha / r)",
    "musubi": "each module's alpha is in its .alpha tensor (the loader applies alpha / r)",
}


def _adapter_usage(lora_format: str, pipeline: str, base_model: str | None, where: str,
                   planned: dict[str, tuple[AdapterOutput, _TransformerTarget | None]]) -> str:
    """How the adapter is loaded at its trained strength, by the loaders of its format."""
    files = {sub: f"{where}/{sub + '/' if sub else ''}{out.file}" for sub, (out, _) in planned.items()}
    lines = ["import torch", f"from diffusers import {pipeline}", ""]
    lines.append(f"pipe = {pipeline}.from_pretrained(\"{base_model or 'path/to/base'}\", torch_dtype=torch.bfloat16)")
    if lora_format == "peft":
        lines[1:1] = ["from peft import PeftModel"]
        for sub, transformer in zip(files, ("transformer", "transformer_2")):
            folder = f"{where}/{sub}" if sub else where
            lines.append(f"pipe.{transformer} = PeftModel.from_pretrained(pipe.{transformer}, \"{folder}\")"
                         ".merge_and_unload()")
    else:  # Diffusers reads its own files, and for Wan kohya / musubi and ComfyUI files too
        for index, path in enumerate(files.values()):
            into = ", load_into_transformer_2=True" if index else ""
            lines.append(f"pipe.load_lora_weights(\"{path}\"{into})")
    if lora_format in ("comfyui", "musubi"):
        runners = "ComfyUI (LoraLoaderModelOnly)" + (", musubi-tuner (--lora_weight)" if lora_format == "musubi" else "")
        lines.append(f"# or in {runners}: {', '.join(files.values())} at strength 1.0")
    return "\n".join(lines)


def _adapter_card(adapters: dict[str, LoraAdapter], planned: dict[str, tuple[AdapterOutput, _TransformerTarget | None]],
                  lora_format: str, options: ExportOptions, source: LazyCheckpoint) -> str:
    adapter = next(iter(adapters.values()))
    chosen = next(iter(planned.values()))[1]
    family = adapter.family
    variant = chosen.variant if chosen else None
    task = family.task(variant.task if variant else next(iter(family.tasks)))
    base_model = options.base_model or (variant.hub_id if chosen and chosen.published else None)
    title = FORMATS[lora_format].title
    return model_card(CardFacts(
        title=f"{chosen.label if chosen else family.name} LoRA",
        base_model=base_model,
        relation="adapter",
        pipeline_tag=task.pipeline_tag,
        pipeline_class=task.pipeline,
        tags=family.tags,
        command=options.command or "cogexport (Python API)",
        source=_source_line(source),
        precision=f"{options.dtype} ({', '.join(family.lora_keep_fp32)} kept in fp32)",
        details=[*(f"Adapter{' (' + sub + ')' if sub else ''}: {each.describe()}"
                   for sub, each in zip(planned, adapters.values())),
                 f"Layout: {title}; {_STRENGTH_WHERE[lora_format]}, so its loader applies the trained strength with "
                 "no scale passed by hand",
                 f"Read with: {adapter.table.name} ({adapter.table.description})"],
        usage=_adapter_usage(lora_format, task.pipeline, base_model, options.push_to_hub or "path/to/this/folder",
                             planned),
        layout=title,
    ))


def _push(folder: Path, options: ExportOptions) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(options.push_to_hub, private=options.private, exist_ok=True)
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(folder), commit_message="Upload with cogexport")
    return repo.repo_id
