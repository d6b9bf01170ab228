"""The main job: a CogVideoX training checkpoint to a Diffusers transformer, VAE or whole pipeline folder.

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
from typing import Sequence

from .checkpoint import LazyCheckpoint, as_paths, open_checkpoint
from .checkpoint.locate import ema_source
from .errors import CogExportError
from .keymap.plan import Plan, plan_translation, translate_shapes
from .keymap.table import KeyMapTable
from .lazy import LazyTensor
from .models.base_folder import TRANSFORMER_CLASS, VAE_CLASS, BaseFolder, open_base
from .models.recognize import TRANSFORMER_TABLES, VAE_TABLES, choose_table, lora_key
from .models.cogvideox import (CogVideoXVariant, TargetModel, build_target, published_variant,
                               read_transformer_shape, scheduler_config, transformer_config, vae_config,
                               variant_like, variant_named)
from .precision import PrecisionPolicy
from .progress import byte_progress
from .write.diffusers_folders import (link_or_copy_tree, plan_model_folder, write_model_folder, write_model_index,
                                      write_scheduler)
from .write.model_card import CardFacts, model_card
from .write.shards import ShardPlan
from .write.staging import check_destination, staged_folder

COMPONENTS = ("transformer", "vae", "pipeline")


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
    notes: list[str] = field(default_factory=list)
    source: dict = field(default_factory=dict)
    pushed_to: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _policy(table: KeyMapTable, options: ExportOptions) -> PrecisionPolicy:
    return PrecisionPolicy.build(options.dtype, table.keep_fp32, options.keep_fp32)


def plan_transformer(source: LazyCheckpoint, base: BaseFolder | None, options: ExportOptions,
                     where: str) -> tuple[ModelExport, CogVideoXVariant]:
    table = choose_table(source, TRANSFORMER_TABLES, "CogVideoX transformer", where)
    shape = read_transformer_shape(translate_shapes(table, {name: t.shape for name, t in source.items()}))
    base_config = base.config("transformer") if base else None
    if base_config is not None:
        config, variant = base_config, variant_like(base_config)
    else:
        variant = variant_named(options.model_name) if options.model_name else published_variant(shape)
        if variant is None:
            raise CogExportError(f"{where} is a {shape.describe()}, which is not a published CogVideoX size; pass "
                                 "--base with a Diffusers folder whose config describes it")
        config = transformer_config(variant)
    kind = "i2v" if shape.image_to_video else "t2v"
    if options.model_type and options.model_type != kind:
        name = variant.name if base_config is None else f"an {kind.upper()} model"
        raise CogExportError(f"checkpoint is {name} (in_channels {shape.in_channels}) but --model-type "
                             f"{options.model_type} was given")
    target = build_target(TRANSFORMER_CLASS, config)
    plan = plan_translation(table, source, target.schema, target.counts, what=where)
    policy = _policy(table, options)
    published = published_variant(shape) == variant
    label = variant.name if published else f"custom-size CogVideoX ({variant.name} layout)"
    return ModelExport("transformer", target, plan, policy.apply(plan.tensors), policy, table, label, published), \
        variant


def plan_vae(source: LazyCheckpoint, base: BaseFolder | None, variant: CogVideoXVariant | None,
             options: ExportOptions, where: str) -> ModelExport:
    table = choose_table(source, VAE_TABLES, "CogVideoX VAE", where)
    config = base.config("vae") if base else None
    if config is None:
        if variant is None:
            raise CogExportError("a VAE alone does not say which CogVideoX it belongs to (the latent scaling differs: "
                                 "2b 1.15258426, the others 0.7); pass --model-name or --base")
        config = vae_config(variant)
    target = build_target(VAE_CLASS, config)
    plan = plan_translation(table, source, target.schema, target.counts, what=where)
    policy = _policy(table, options)
    return ModelExport("vae", target, plan, policy.apply(plan.tensors), policy, table)


def open_source(paths: list[Path], options: ExportOptions) -> LazyCheckpoint:
    tag = options.tag
    if options.ema:
        paths, tag = ema_source(paths, tag)
    source = open_checkpoint(paths, tag)
    lora = lora_key(list(source))
    if lora is not None:
        source.close()
        raise CogExportError(f"{paths[0]} is a LoRA checkpoint ({lora}); export the adapter with --lora adapter, or "
                             "merge it into a full model with --lora fuse (giving --base when the checkpoint does not "
                             "hold the base weights)")
    return source


def export(checkpoint: str | Path | Sequence[str | Path], output: str | Path,
           options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Export ``checkpoint`` into the Diffusers folder ``output``; see ExportOptions for the knobs."""
    options = replace(options or ExportOptions(), **overrides)
    paths, output = as_paths(checkpoint), Path(output)
    base = open_base(options.base) if options.base else None
    component = options.component or ("pipeline" if base and base.is_pipeline else "transformer")
    if component not in COMPONENTS:
        raise CogExportError(f"--component {component!r} is not one of {', '.join(COMPONENTS)}")
    if component == "pipeline" and not (base and base.is_pipeline):
        raise CogExportError("--component pipeline needs --base DIR: a local Diffusers CogVideoX pipeline folder for "
                             "the text encoder and tokenizer (nothing is downloaded)")
    with ExitStack() as stack:
        source = stack.enter_context(open_source(paths, options))
        where = ", ".join(str(p) for p in paths)
        parts: list[ModelExport] = []
        variant = variant_named(options.model_name) if options.model_name else None
        if component in ("transformer", "pipeline"):
            transformer, variant = plan_transformer(source, base, options, where)
            parts.append(transformer)
        if component == "vae":
            parts.append(plan_vae(source, base, variant, options, where))
        if component == "pipeline" and options.vae is not None:
            vae_source = stack.enter_context(open_checkpoint(as_paths(options.vae)))
            parts.append(plan_vae(vae_source, base, variant, options, str(options.vae)))
        for part in parts:
            part.shards = plan_model_folder(part.tensors, options.max_shard_size, options.variant)
        inputs = [*paths, *source.info.files, *([options.vae] if options.vae else []), *([base.path] if base else [])]
        check_destination(output, source.own_folders(), inputs, options.overwrite)

        label = parts[0].label or (variant.name if variant else "CogVideoX VAE")
        result = ExportResult(str(output), component, label, [],
                              sum(len(p.tensors) for p in parts), sum(p.shards.total_bytes for p in parts),
                              parts[0].policy.describe(), source=asdict(source.info), notes=list(source.info.notes))
        for part in parts:
            result.dropped.update(part.plan.dropped)
            result.ignored += len(part.plan.ignored)
        with staged_folder(output) as staging, byte_progress(result.total_bytes, "export", options.progress) as bar:
            def on_tensor(_name: str, nbytes: int) -> None:
                bar.update(nbytes)

            if component == "pipeline":
                _write_pipeline(staging, parts, base, variant, options, source, result, on_tensor)
            else:
                part = parts[0]
                result.files = write_model_folder(staging, part.target.model, part.tensors, part.shards, on_tensor)
        if options.push_to_hub:
            result.pushed_to = _push(output, options)
        return result


def _write_pipeline(staging: Path, parts: list[ModelExport], base: BaseFolder, variant: CogVideoXVariant,
                    options: ExportOptions, source: LazyCheckpoint, result: ExportResult, on_tensor) -> None:
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
    (staging / "README.md").write_text(_card(variant, options, source, exported), encoding="utf-8")
    result.files += ["scheduler/scheduler_config.json", "model_index.json", "README.md"]


def _card(variant: CogVideoXVariant, options: ExportOptions, source: LazyCheckpoint,
          exported: dict[str, ModelExport]) -> str:
    info = source.info
    described = {"deepspeed": "DeepSpeed checkpoint", "safetensors": "safetensors weights",
                 "torch": "torch state dict"}.get(info.format, info.format)
    where = f"{described} {', '.join(Path(p).name for p in info.paths)}"
    if info.tag:
        where += f", tag {info.tag}"
    if info.step is not None:
        where += f", step {info.step}"
    precision = "; ".join(f"{name}: {part.policy.describe()}" for name, part in exported.items())
    transformer = exported["transformer"]
    return model_card(CardFacts(
        title=f"{transformer.label} fine-tune",
        base_model=options.base_model or (variant.hub_id if transformer.published else None),
        relation="finetune",
        pipeline_tag=variant.pipeline_tag,
        pipeline_class=variant.pipeline_class,
        command=options.command or "cogexport (Python API)",
        source=f"{where} ({info.weights_source})",
        precision=precision,
        details=[f"Key map: {part.table.name} ({part.table.description})" for part in exported.values()],
        usage=(f"import torch\nfrom diffusers import {variant.pipeline_class}\n\n"
               f"pipe = {variant.pipeline_class}.from_pretrained(\"{options.push_to_hub or 'path/to/this/folder'}\", "
               "torch_dtype=torch.bfloat16)"),
    ))


def _push(folder: Path, options: ExportOptions) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(options.push_to_hub, private=options.private, exist_ok=True)
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(folder), commit_message="Upload with cogexport")
    return repo.repo_id


def command_line() -> str:
    """The command as the user typed it, for the model card."""
    return "cogexport " + shlex.join(sys.argv[1:])
