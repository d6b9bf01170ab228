"""The main job: a CogVideoX training checkpoint to a Diffusers transformer, VAE or whole pipeline folder, or for a
LoRA run to an adapter file (or a model with the adapter fused in).

read (any checkpoint cogexport opens) -> translate (a key-map table, chosen by the names it finds) -> check
against the target model built on the meta device -> cast (the dtype policy) -> write (staged, then moved into
place) -> publish (optional upload). Everything up to the write is planned from names and shapes, so bad input
fails before a byte is written.
"""

from __future__ import annotations

import shlex
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence


from .checkpoint import LazyCheckpoint, as_paths, open_checkpoint
from .checkpoint.locate import ema_source
from .errors import CogExportError
from .keymap.plan import Plan, plan_translation, translate_shapes
from .keymap.table import KeyMapTable, load_table
from .lazy import LazyTensor
from .lora import LORA_WEIGHTS_NAME, PIPELINE_PREFIX, LoraAdapter, adapter_file_metadata, is_lora_key, plan_adapter, \
    plan_fused, read_adapter
from .models.base_folder import TRANSFORMER_CLASS, VAE_CLASS, BaseFolder, open_base
from .models.cogvideox import (CogVideoXVariant, TargetModel, TransformerShape, build_target, published_variant,
                               layout_schema, read_transformer_shape, scheduler_config, transformer_config, vae_config,
                               variant_like, variant_named)
from .models.recognize import TRANSFORMER_TABLES, VAE_TABLES, choose_table, lora_key
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
    model_type: str | None = None  # t2v or i2v; checked against the checkpoint when given
    component: str | None = None  # default: pipeline when --base is a pipeline folder, else transformer
    base: Path | None = None
    vae: Path | None = None  # a SAT or Diffusers VAE checkpoint for the pipeline (default: the base's VAE)
    dtype: str = "bf16"
    keep_fp32: tuple[str, ...] = ()
    max_shard_size: str | int = "5GB"
    variant: str | None = None  # file-name variant, as save_pretrained(variant=...)
    tag: str | None = None
    ema: bool = False
    lora: str | None = None  # adapter or fuse; a LoRA run defaults to adapter
    lora_alpha: float | None = None
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

    component: str
    target: TargetModel
    plan: Plan
    tensors: dict[str, LazyTensor]
    policy: PrecisionPolicy
    table: KeyMapTable
    label: str = ""  # what the model is, for the user: a published name, or a custom size in a variant's layout
    published: bool = False
    shards: ShardPlan | None = None


@dataclass
class ExportResult:
    output: str
    component: str
    model: str
    files: list[str]
    tensors: int
    total_bytes: int
    precision: str
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
    tag = options.tag
    if options.ema:
        paths, tag = ema_source(paths, tag)
    return open_checkpoint(paths, tag)


def _policy(defaults: Sequence[str], options: ExportOptions) -> PrecisionPolicy:
    return PrecisionPolicy.build(options.dtype, defaults, options.keep_fp32)


# -- the transformer ----------------------------------------------------------------------------------------------
@dataclass
class _TransformerTarget:
    target: TargetModel
    variant: CogVideoXVariant
    label: str
    published: bool


def _transformer_target(shape: TransformerShape | None, base: BaseFolder | None, options: ExportOptions,
                        where: str) -> _TransformerTarget:
    """The Diffusers transformer to export into: --base's config, else the published variant of this shape."""
    base_config = base.config("transformer") if base else None
    published = published_variant(shape) if shape else None
    if base is not None and base_config is None:
        raise CogExportError(f"--base {base.path} has no transformer config.json (give a pipeline folder with "
                             "transformer/, or a transformer folder)")
    if base_config is not None:
        config, variant = base_config, variant_like(base_config)
    else:
        variant = variant_named(options.model_name) if options.model_name else published
        if variant is None:
            what = f"a {shape.describe()}, which is not a published CogVideoX size" if shape else "an adapter alone"
            raise CogExportError(f"{where} is {what}; pass --base with a Diffusers folder whose config describes it")
        config = transformer_config(variant)
    if shape is not None:
        kind = "i2v" if shape.image_to_video else "t2v"
        if options.model_type and options.model_type != kind:
            name = published.name if published else f"a CogVideoX {kind.upper()} model of unpublished size"
            raise CogExportError(f"checkpoint is {name} (in_channels {shape.in_channels}) but --model-type "
                                 f"{options.model_type} was given")
        if shape.learned_positions and not config.get("use_learned_positional_embeddings"):
            raise CogExportError(f"{where} has learned position embeddings (CogVideoX-5b-I2V's pos_embedding), but "
                                 "the config it would go into has use_learned_positional_embeddings false; check --base")
    is_published = published == variant if shape else base_config is None
    label = variant.name if is_published else f"custom-size CogVideoX ({variant.name} layout)"
    return _TransformerTarget(build_target(TRANSFORMER_CLASS, config), variant, label, is_published)


def _shape_through(table: KeyMapTable, source: LazyCheckpoint) -> TransformerShape | None:
    shapes = translate_shapes(table, {name: t.shape for name, t in source.items()})
    base_shapes = {name: shape for name, shape in shapes.items() if not is_lora_key(name)}
    return read_transformer_shape(base_shapes) if base_shapes else None


def plan_transformer(source: LazyCheckpoint, base: BaseFolder | None, options: ExportOptions,
                     where: str) -> tuple[ModelExport, CogVideoXVariant]:
    table = choose_table(source, TRANSFORMER_TABLES, "CogVideoX transformer", where)
    chosen = _transformer_target(_shape_through(table, source), base, options, where)
    plan = plan_translation(table, source, chosen.target.schema, chosen.target.counts, what=where)
    policy = _policy(table.keep_fp32, options)
    return ModelExport("transformer", chosen.target, plan, policy.apply(plan.tensors), policy, table, chosen.label,
                       chosen.published), chosen.variant


def _base_transformer_weights(base: BaseFolder | None, target: TargetModel, stack: ExitStack) -> dict | None:
    """The base model's own transformer weights (for fusing an adapter that came without them)."""
    if base is None:
        return None
    folder = base.component_dir("transformer") if base.is_pipeline else base.path
    if any(folder.glob("*.safetensors")):
        weights = stack.enter_context(open_checkpoint(folder))
    elif (folder / "diffusion_pytorch_model.bin").is_file():  # older save_pretrained output (read safely)
        weights = stack.enter_context(open_checkpoint(folder / "diffusion_pytorch_model.bin"))
    else:
        return None
    table = load_table("diffusers_transformer")
    return plan_translation(table, weights, target.schema, target.counts, what=f"--base {folder}").tensors


def plan_fused_transformer(source: LazyCheckpoint, adapter: LoraAdapter, base: BaseFolder | None,
                           options: ExportOptions, where: str, stack: ExitStack) -> tuple[ModelExport, CogVideoXVariant]:
    chosen = _transformer_target(_shape_through(adapter.table, source), base, options, where)
    target = chosen.target
    fused = plan_fused(source, adapter, target.schema, None if adapter.has_base_weights else
                       _base_transformer_weights(base, target, stack), target.counts, where)
    # The output is a plain Diffusers transformer, so its defaults are the Diffusers transformer's.
    policy = _policy(load_table("diffusers_transformer").keep_fp32, options)
    return ModelExport("transformer", target, Plan(fused), policy.apply(fused), policy, adapter.table,
                       f"{chosen.label} + LoRA", chosen.published), chosen.variant


# -- the VAE ------------------------------------------------------------------------------------------------------
def plan_vae(source: LazyCheckpoint, base: BaseFolder | None, variant: CogVideoXVariant | None,
             options: ExportOptions, where: str) -> ModelExport:
    table = choose_table(source, VAE_TABLES, "CogVideoX VAE", where)
    config = base.config("vae") if base else None
    if base is not None and config is None:
        raise CogExportError(f"--base {base.path} has no VAE config.json (give a pipeline folder with vae/, or a VAE "
                             "folder)")
    if config is None:
        if variant is None:
            raise CogExportError("a VAE alone does not say which CogVideoX it belongs to (the latent scaling differs: "
                                 "2b 1.15258426, the others 0.7); pass --model-name or --base")
        config = vae_config(variant)
    target = build_target(VAE_CLASS, config)
    plan = plan_translation(table, source, target.schema, target.counts, what=where)
    policy = _policy(table.keep_fp32, options)
    return ModelExport("vae", target, plan, policy.apply(plan.tensors), policy, table)


# -- the job ------------------------------------------------------------------------------------------------------
def _lora_mode(source: LazyCheckpoint, options: ExportOptions, where: str) -> str | None:
    marker = lora_key(list(source))
    if options.lora is not None:
        if options.lora not in LORA_MODES:
            raise CogExportError(f"--lora {options.lora!r} is not one of {', '.join(LORA_MODES)}")
        if marker is None:
            raise CogExportError(f"{where} holds no LoRA adapter (no lora_A or matrix_A weights); export it without "
                                 "--lora")
        if options.lora == "adapter" and options.component is not None:
            raise CogExportError(f"--lora adapter writes an adapter file, not a {options.component}; use --lora fuse "
                                 f"--component {options.component} to merge the adapter into one")
        return options.lora
    if marker is not None and options.component is not None:
        raise CogExportError(f"{where} is a LoRA checkpoint ({marker}); export the adapter with --lora adapter, or "
                             "merge it into a full model with --lora fuse (giving --base when the checkpoint does not "
                             "hold the base weights)")
    return "adapter" if marker is not None else None



def _search_folders(paths: list[Path], source: LazyCheckpoint) -> list[Path]:
    """Where a run may have saved its configs: the folders given, and above each checkpoint folder."""
    folders = [p if p.is_dir() else p.parent for p in paths]
    for folder in source.own_folders():
        folders += [folder, folder.parent]
    return folders


def export(checkpoint: str | Path | Sequence[str | Path], output: str | Path,
           options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Export ``checkpoint`` into the Diffusers folder ``output``; see ExportOptions for the knobs."""
    options = replace(options or ExportOptions(), **overrides)
    paths, output = as_paths(checkpoint), Path(output)
    base = open_base(options.base) if options.base else None
    with ExitStack() as stack:
        source = stack.enter_context(open_source(paths, options))
        where = ", ".join(str(p) for p in paths)
        mode = _lora_mode(source, options, where)
        adapter = None
        if mode is not None:
            adapter = read_adapter(source, where, options.lora_alpha, _search_folders(paths, source),
                                   source.info.metadata)
        component = "lora adapter" if mode == "adapter" else \
            options.component or ("pipeline" if base and base.is_pipeline else "transformer")
        if component not in (*COMPONENTS, "lora adapter"):
            raise CogExportError(f"--component {component!r} is not one of {', '.join(COMPONENTS)}")
        if component == "pipeline" and not (base and base.is_pipeline):
            raise CogExportError("--component pipeline needs --base DIR: a local Diffusers CogVideoX pipeline folder "
                                 "for the text encoder and tokenizer (nothing is downloaded)")
        if options.vae is not None and component != "pipeline":
            raise CogExportError("--vae goes into a pipeline (--component pipeline); to export a VAE alone, give it "
                                 "as CHECKPOINT with --component vae")
        if options.model_name and base is not None:
            raise CogExportError("--model-name and --base both say which model this is; give one of them")
        if component == "pipeline":
            base.check_pipeline(linked=("text_encoder", "tokenizer", *(() if options.vae else ("vae",))))
        inputs = [*paths, *source.info.files, *([options.vae] if options.vae else []), *([base.path] if base else [])]
        if mode == "adapter":
            return _export_adapter(source, adapter, base, options, where, output, inputs)

        parts: list[ModelExport] = []
        variant = variant_named(options.model_name) if options.model_name else None
        if component in ("transformer", "pipeline"):
            transformer, variant = plan_fused_transformer(source, adapter, base, options, where, stack) \
                if mode == "fuse" else plan_transformer(source, base, options, where)
            parts.append(transformer)
        if component == "vae":
            parts.append(plan_vae(source, base, variant, options, where))
        if component == "pipeline" and options.vae is not None:
            vae_source = stack.enter_context(open_checkpoint(as_paths(options.vae)))
            parts.append(plan_vae(vae_source, base, variant, options, str(options.vae)))
        for part in parts:
            part.shards = plan_model_folder(part.tensors, options.max_shard_size, options.variant)
        check_destination(output, source.own_folders(), inputs, options.overwrite)

        label = parts[0].label or (variant.name if variant else "CogVideoX VAE")
        result = ExportResult(str(output), component, label, [], sum(len(p.tensors) for p in parts),
                              sum(p.shards.total_bytes for p in parts), parts[0].policy.describe(),
                              source=asdict(source.info), notes=list(source.info.notes))
        if adapter is not None:
            result.lora, result.notes = _lora_summary(adapter), result.notes + adapter.warnings
        for part in parts:
            result.dropped.update(part.plan.dropped)
            result.ignored += len(part.plan.ignored)
        with staged_folder(output) as staging, byte_progress(result.total_bytes, "export", options.progress) as bar:
            def on_tensor(_name: str, nbytes: int) -> None:
                bar.update(nbytes)

            if component == "pipeline":
                _write_pipeline(staging, parts, base, variant, options, source, result, on_tensor, adapter)
            else:
                part = parts[0]
                result.files = write_model_folder(staging, part.target.model, part.tensors, part.shards, on_tensor)
        if options.push_to_hub:
            result.pushed_to = _push(output, options)
        return result


def _lora_summary(adapter: LoraAdapter) -> dict:
    return {"table": adapter.table.name, "rank": adapter.rank, "alpha": adapter.alpha,
            "alpha_source": adapter.alpha_source, "scale": adapter.scale(),
            "target_modules": adapter.target_modules, "modules": len(adapter.ranks), "layers": adapter.layers}


def _export_adapter(source: LazyCheckpoint, adapter: LoraAdapter, base: BaseFolder | None, options: ExportOptions,
                    where: str, output: Path, inputs: list[Path]) -> ExportResult:
    """pytorch_lora_weights.safetensors with the adapter config Diffusers reads, and a model card."""
    chosen = None
    shape = _shape_through(adapter.table, source)
    if base is not None and base.config("transformer") or shape is not None or options.model_name:
        chosen = _transformer_target(shape, base, options, where)
        schema = chosen.target.schema
    else:  # the size is unknown: check the adapted modules' names against the CogVideoX layout alone
        schema = layout_schema(adapter.blocks_needed)
    tensors = plan_adapter(source, adapter, schema, where, check_shapes=chosen is not None)
    policy = _policy(adapter.table.keep_fp32, options)
    tensors = {PIPELINE_PREFIX + name: tensor for name, tensor in policy.apply(tensors).items()}
    check_destination(output, source.own_folders(), inputs, options.overwrite)
    total = sum(t.nbytes for t in tensors.values())
    result = ExportResult(str(output), "lora adapter", chosen.label if chosen else "CogVideoX", [], len(tensors),
                          total, policy.describe(), lora=_lora_summary(adapter), source=asdict(source.info),
                          notes=[*source.info.notes, *adapter.warnings])
    with staged_folder(output) as staging, byte_progress(total, "export", options.progress) as bar:
        write_safetensors(staging / LORA_WEIGHTS_NAME, tensors, adapter_file_metadata(adapter, schema),
                          lambda _name, nbytes: bar.update(nbytes))
        variant = chosen.variant if chosen else None
        (staging / "README.md").write_text(_adapter_card(adapter, variant, chosen, options, source), encoding="utf-8")
        result.files = [LORA_WEIGHTS_NAME, "README.md"]
    if options.push_to_hub:
        result.pushed_to = _push(output, options)
    return result


# -- pipeline folders and cards -----------------------------------------------------------------------------------
def _write_pipeline(staging: Path, parts: list[ModelExport], base: BaseFolder, variant: CogVideoXVariant,
                    options: ExportOptions, source: LazyCheckpoint, result: ExportResult,
                    on_tensor: Callable[[str, int], None], adapter: LoraAdapter | None) -> None:
    exported = {part.component: part for part in parts}
    for name, part in exported.items():
        result.files += [f"{name}/{f}" for f in write_model_folder(staging / name, part.target.model, part.tensors,
                                                                   part.shards, on_tensor)]
    for name in ("text_encoder", "tokenizer", *(("vae",) if "vae" not in exported else ())):
        result.linked[name] = link_or_copy_tree(base.component_dir(name), staging / name)
    write_scheduler(staging / "scheduler", scheduler_config(variant))
    components = {name: base.components[name] for name in ("text_encoder", "tokenizer") if name in base.components}
    components.update(scheduler=["diffusers", "CogVideoXDDIMScheduler"], transformer=["diffusers", TRANSFORMER_CLASS],
                      vae=["diffusers", VAE_CLASS])
    write_model_index(staging, variant.pipeline_class, components)
    (staging / "README.md").write_text(_pipeline_card(variant, options, source, exported, adapter), encoding="utf-8")
    result.files += ["scheduler/scheduler_config.json", "model_index.json", "README.md"]


def _source_line(source: LazyCheckpoint) -> str:
    info = source.info
    described = {"deepspeed": "DeepSpeed checkpoint", "safetensors": "safetensors weights",
                 "torch": "torch state dict"}.get(info.format, info.format)
    where = f"{described} {', '.join(Path(p).name for p in info.paths)}"
    if info.tag:
        where += f", tag {info.tag}"
    if info.step is not None:
        where += f", step {info.step}"
    return f"{where} ({info.weights_source})"


def _pipeline_card(variant: CogVideoXVariant, options: ExportOptions, source: LazyCheckpoint,
                   exported: dict[str, ModelExport], adapter: LoraAdapter | None) -> str:
    transformer = exported["transformer"]
    details = [f"Key map: {part.table.name} ({part.table.description})" for part in exported.values()]
    if adapter is not None:
        details.append(f"LoRA fused into the weights: {adapter.describe()}")
    return model_card(CardFacts(
        title=f"{transformer.label} fine-tune",
        base_model=options.base_model or (variant.hub_id if transformer.published else None),
        relation="finetune",
        pipeline_tag=variant.pipeline_tag,
        pipeline_class=variant.pipeline_class,
        command=options.command or "cogexport (Python API)",
        source=_source_line(source),
        precision="; ".join(f"{name}: {part.policy.describe()}" for name, part in exported.items()),
        details=details,
        usage=(f"import torch\nfrom diffusers import {variant.pipeline_class}\n\n"
               f"pipe = {variant.pipeline_class}.from_pretrained(\"{options.push_to_hub or 'path/to/this/folder'}\", "
               + (f"variant=\"{options.variant}\", " if options.variant else "") + "torch_dtype=torch.bfloat16)"),
    ))


def _adapter_card(adapter: LoraAdapter, variant: CogVideoXVariant | None, chosen: _TransformerTarget | None,
                  options: ExportOptions, source: LazyCheckpoint) -> str:
    pipeline_class = variant.pipeline_class if variant else "CogVideoXPipeline"
    base_model = options.base_model or (variant.hub_id if chosen and chosen.published else None)
    return model_card(CardFacts(
        title=f"{chosen.label if chosen else 'CogVideoX'} LoRA",
        base_model=base_model,
        relation="adapter",
        pipeline_tag=variant.pipeline_tag if variant else "text-to-video",
        pipeline_class=pipeline_class,
        command=options.command or "cogexport (Python API)",
        source=_source_line(source),
        precision=f"{options.dtype} ({', '.join(adapter.table.keep_fp32)} kept in fp32)",
        details=[f"Adapter: {adapter.describe()}",
                 "lora_alpha and r are stored in the file's lora_adapter_metadata, so Diffusers applies the trained "
                 "scale with no scale passed by hand",
                 f"Key map: {adapter.table.name} ({adapter.table.description})"],
        usage=(f"import torch\nfrom diffusers import {pipeline_class}\n\n"
               f"pipe = {pipeline_class}.from_pretrained(\"{base_model or 'path/to/base'}\", torch_dtype=torch.bfloat16)\n"
               f"pipe.load_lora_weights(\"{options.push_to_hub or 'path/to/this/folder'}\")"),
    ))


def _push(folder: Path, options: ExportOptions) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(options.push_to_hub, private=options.private, exist_ok=True)
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(folder), commit_message="Upload with cogexport")
    return repo.repo_id
