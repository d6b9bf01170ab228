"""The way back (``--to original``): Diffusers weights of a family's transformer written in the family's original
layout, by running the same key-map table backwards. For Wan, the single or sharded safetensors (with the WanModel
config.json) that the Wan repo and ComfyUI load; for CogVideoX, the SAT model-states file SAT's loader reads; for
LTX-Video, the single release file (and, from a pipeline, its VAE in the same file); for Mochi, dit.safetensors.

read (a save_pretrained folder, a pipeline's transformer, or a training checkpoint in Diffusers names) -> check it
against the Diffusers model it claims to be (every tensor present, every shape right) -> cast (the family's dtype
policy, decided on the Diffusers names) -> the original table inverted -> write, a tensor at a time, staged.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

from .checkpoint import as_paths
from .errors import CogExportError
from .keymap.plan import plan_translation
from .keymap.table import load_table
from .lazy import LazyTensor
from .models.base_folder import open_base, read_json
from .models.family import ModelFamily, OriginalLayout
from .progress import byte_progress
from .to_diffusers import (ExportOptions, ExportResult, _family_hint, _policy, _recognise, _search_folders,
                           _transformer_target, open_source)
from .models.recognize import choose_table
from .models.target import build_target
from .write.diffusers_folders import write_config_json
from .write.safetensors_file import write_safetensors
from .write.sat_file import write_sat_model_states
from .write.shards import plan_shards, write_shards
from .write.staging import check_destination, staged_folder


def _pipeline_vae(paths: list[Path]) -> Path | None:
    """A pipeline folder's VAE (written back beside the transformer by a single-file layout)."""
    if len(paths) == 1 and (paths[0] / "model_index.json").is_file() and (paths[0] / "vae" / "config.json").is_file():
        return paths[0] / "vae"
    return None


def _original_vae(folder: Path, family: ModelFamily, options: ExportOptions, stack: ExitStack) -> dict[str, LazyTensor]:
    """The pipeline's VAE in the family's original names (under its prefix), cast by the VAE's dtype policy. Where the
    original layout has one table per version, the version's table is the one under which every name translates."""
    source = stack.enter_context(open_source([folder], options))
    _, table = choose_table(source, "vae", "VAE", str(folder), family)
    target = build_target(family.vae.class_name, read_json(folder / "config.json"))
    diffusers = plan_translation(table, source, target.schema, target.counts, what=str(folder)).tensors
    cast = _policy(family.vae.keep_fp32, options).apply(diffusers)
    layout, fitting = family.vae.original, []
    for name in layout.candidates:
        try:
            fitting.append(plan_translation(load_table(name).inverted(), cast, None, target.counts, what=str(folder)))
        except CogExportError:
            continue
    if len(fitting) != 1:
        raise CogExportError(f"{folder} is an {family.vae.class_name} that {'no' if not fitting else 'more than one'} "
                             f"original {family.name} VAE layout describes; its config does not match a release")
    return {layout.prefix + name: tensor for name, tensor in fitting[0].tensors.items()}


def _transformer_folders(paths: list[Path]) -> dict[str, list[Path]]:
    """A pipeline folder stands for its transformer(s); anything else is the transformer's checkpoint itself."""
    if len(paths) == 1 and (paths[0] / "model_index.json").is_file():
        index = read_json(paths[0] / "model_index.json")
        found = {name: [paths[0] / name] for name in ("transformer", "transformer_2")
                 if isinstance(index.get(name), list) and index[name][0] is not None}
        if not found:
            raise CogExportError(f"{paths[0]}/model_index.json names no transformer to write back")
        return found
    return {"transformer": paths}


def _expert_folder(family: ModelFamily, component: str, experts: int) -> str:
    """Where the original release keeps this expert (Wan 2.2 A14B: high_noise_model/, low_noise_model/)."""
    if experts == 1:
        return ""
    layouts = [v.experts for v in family.variants if v.experts and len(v.experts) == experts]
    if not layouts:
        raise CogExportError(f"{family.name} has no release with {experts} experts")
    return layouts[0][component]


def export_original(checkpoint: str | Path | Sequence[str | Path], output: str | Path,
                    options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer of ``checkpoint`` (Diffusers names) into ``output`` in its family's original layout."""
    options = replace(options or ExportOptions(), **overrides)
    if options.component not in (None, "transformer"):
        raise CogExportError(f"--to original writes the transformer; --component {options.component} has no original "
                             "layout here")
    if options.lora or options.vae or options.push_to_hub:
        raise CogExportError("--to original writes a full transformer; it takes no --lora, --vae or --push-to-hub")
    paths, output = as_paths(checkpoint), Path(output)
    base = open_base(options.base) if options.base else None
    with ExitStack() as stack:
        parts, inputs, own = [], [*paths, *([base.path] if base else [])], []
        folders = _transformer_folders(paths)
        for component, sources in folders.items():
            source = stack.enter_context(open_source(sources, options))
            where = ", ".join(map(str, sources))
            family, table = choose_table(source, "transformer", "transformer", where, _family_hint(base, options))
            layout = family.transformer.original
            if layout is None:
                raise CogExportError(f"cogexport knows no original layout for {family.name}")
            if table.name == layout.table:
                raise CogExportError(f"{where} is already in the original {family.name} layout ({table.name})")
            recognised = _recognise(source, table, family)
            if recognised is None:
                raise CogExportError(f"{where} holds no transformer weights to write back (a LoRA adapter alone?)")
            search = [*sources, *_search_folders(sources, source)]
            chosen = _transformer_target(recognised, family, base, options, where, search, component)
            diffusers = plan_translation(table, source, chosen.target.schema, chosen.target.counts, what=where)
            policy = _policy(family.transformer.keep_fp32, options)
            original = plan_translation(load_table(layout.table).inverted(), policy.apply(diffusers.tensors), None,
                                        chosen.target.counts, what=where).tensors
            parts.append((component, family, layout, chosen, original, policy))
            inputs += source.info.files
            own += source.own_folders()
        beside = {}
        vae_folder = _pipeline_vae(paths)
        if layout.writer == "single_file" and vae_folder is not None and family.vae and family.vae.original:
            beside = _original_vae(vae_folder, family, options, stack)
        check_destination(output, own, inputs, options.overwrite)
        _, family, _, chosen, _, policy = parts[0]
        total = sum(t.nbytes for part in parts for t in part[4].values()) + sum(t.nbytes for t in beside.values())
        result = ExportResult(str(output), "original transformer" + (" and VAE" if beside else ""), chosen.label, [],
                              sum(len(p[4]) for p in parts) + len(beside), total, policy.describe(), family=family.name,
                              source=asdict(source.info), notes=list(source.info.notes))
        with staged_folder(output) as staging, byte_progress(total, "export", options.progress) as bar:
            for component, family, layout, chosen, tensors, _ in parts:
                folder = staging / _expert_folder(family, component, len(parts))
                folder.mkdir(parents=True, exist_ok=True)
                written = _write(folder, family, layout, chosen, tensors, options, lambda _n, size: bar.update(size),
                                 beside)
                result.files += [str((folder / name).relative_to(staging)) for name in written]
        return result


def _write(folder: Path, family: ModelFamily, layout: OriginalLayout, chosen, tensors: dict[str, LazyTensor],
           options: ExportOptions, on_tensor, beside: dict[str, LazyTensor] | None = None) -> list[str]:
    if layout.writer == "sat":
        return write_sat_model_states(folder, {layout.prefix + name: t for name, t in tensors.items()}, on_tensor)
    if layout.writer == "single_file":  # one file: the transformer under its prefix, the VAE (if any) under its own
        everything = {**{layout.prefix + name: t for name, t in tensors.items()}, **(beside or {})}
        metadata = family.shapes.original_metadata(chosen.target.config, chosen.variant.task)
        write_safetensors(folder / layout.file, everything, metadata, on_tensor)
        return [layout.file]
    plan = plan_shards(tensors, layout.file, options.max_shard_size)
    written = write_shards(folder, tensors, plan, on_tensor)
    config = family.shapes.original_config(chosen.target.config, chosen.variant.task)
    if config is None:  # the original release keeps no config file beside its weights (Mochi)
        return written
    write_config_json(folder / "config.json", config)
    return ["config.json", *written]
