"""The way back (``--to original``): Diffusers weights of a family's transformer (or VAE) written in the family's
original layout, by running the same key-map table backwards. For Wan, the single or sharded safetensors (with the
WanModel config.json) that the Wan repo and ComfyUI load, and the VAE's .pth; for CogVideoX, the SAT model-states
file SAT's loader reads; for LTX-Video, the single release file (from a pipeline, with its VAE in the same file); for
Mochi, dit.safetensors; for HunyuanVideo, the release's mp_rank_00_model_states.pt.

read (a save_pretrained folder, a pipeline's transformer or VAE, or a training checkpoint in Diffusers names) -> check
it against the Diffusers model it claims to be (every tensor present, every shape right) -> cast (the family's dtype
policy, decided on the Diffusers names) -> the original table inverted -> write, a tensor at a time, staged.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

from .checkpoint import as_paths
from .errors import CogExportError
from .keymap.plan import plan_translation
from .keymap.table import load_table
from .lazy import LazyTensor
from .models.base_folder import BaseFolder, open_base, read_json
from .models.family import ModelFamily, ModelSpec, OriginalLayout
from .models.recognize import choose_table
from .precision import PrecisionPolicy
from .progress import byte_progress
from .to_diffusers import (ExportOptions, ExportResult, _family_hint, _policy, _recognise, _search_folders,
                           _transformer_target, open_source, plan_vae)
from .write.diffusers_folders import write_config_json
from .write.model_states_file import write_model_states
from .write.safetensors_file import write_safetensors
from .write.sat_file import write_sat_model_states
from .write.shards import plan_shards, write_shards
from .write.staging import check_destination, staged_folder
from .write.torch_archive import write_torch_archive

# pipeline components a --to original run reads from a pipeline folder, per --component
_PIPELINE_PARTS = {"transformer": ("transformer", "transformer_2"), "vae": ("vae",)}


@dataclass
class _Part:
    """One model to write back: where it goes, its layout and its tensors in original names."""

    component: str  # the pipeline component it came from (transformer, transformer_2, vae)
    family: ModelFamily
    layout: OriginalLayout
    label: str
    config: dict  # its Diffusers config
    task: str | None
    tensors: dict[str, LazyTensor]
    policy: PrecisionPolicy
    beside: dict[str, LazyTensor] = field(default_factory=dict)  # another model's tensors in the same file (a VAE)


def _model_folders(paths: list[Path], component: str) -> dict[str, list[Path]]:
    """A pipeline folder stands for its transformer(s) or VAE; anything else is the model's checkpoint itself."""
    if len(paths) == 1 and (paths[0] / "model_index.json").is_file():
        index = read_json(paths[0] / "model_index.json")
        found = {name: [paths[0] / name] for name in _PIPELINE_PARTS[component]
                 if isinstance(index.get(name), list) and index[name][0] is not None}
        if not found:
            raise CogExportError(f"{paths[0]}/model_index.json names no {component} to write back")
        return found
    return {component: paths}


def _expert_folder(family: ModelFamily, component: str, experts: int) -> str:
    """Where the original release keeps this expert (Wan 2.2 A14B: high_noise_model/, low_noise_model/)."""
    if experts == 1:
        return ""
    layouts = [v.experts for v in family.variants if v.experts and len(v.experts) == experts]
    if not layouts:
        raise CogExportError(f"{family.name} has no release with {experts} experts")
    return layouts[0][component]


def _original_tensors(spec: ModelSpec, tensors: dict[str, LazyTensor], counts: dict,
                      where: str) -> tuple[OriginalLayout, dict[str, LazyTensor]]:
    """The first of the model's original layouts whose table, run backwards, takes every tensor."""
    failures = []
    for layout in spec.originals:
        try:
            return layout, plan_translation(load_table(layout.table).inverted(), tensors, None, counts,
                                            what=where).tensors
        except CogExportError as error:
            failures.append(str(error))
    raise CogExportError(failures[0])


def _plan_transformer(source, sources: list[Path], component: str, components: tuple[str, ...],
                      base: BaseFolder | None, options: ExportOptions, where: str) -> _Part:
    family, table = choose_table(source, "transformer", "transformer", where, _family_hint(base, options))
    spec = family.transformer
    _check_layouts(spec, table, family, where)
    # the release's expert subfolders (high_noise_model/, ...) when writing several experts
    experts = tuple(_expert_folder(family, name, len(components)) for name in components) \
        if len(components) > 1 else ()
    recognised = _recognise(source, table, family, experts)
    if recognised is None:
        raise CogExportError(f"{where} holds no transformer weights to write back (a LoRA adapter alone?)")
    search = [*sources, *_search_folders(sources, source)]
    chosen = _transformer_target(recognised, family, base, options, where, search, component, experts)
    diffusers = plan_translation(table, source, chosen.target.schema, chosen.target.counts, what=where)
    policy = _policy(spec.keep_fp32, options)
    layout, tensors = _original_tensors(spec, policy.apply(diffusers.tensors), chosen.target.counts, where)
    return _Part(component, family, layout, chosen.label, chosen.target.config, chosen.variant.task, tensors, policy)


def _plan_vae(source, sources: list[Path], base: BaseFolder | None, options: ExportOptions, where: str) -> _Part:
    family, table = choose_table(source, "vae", "VAE", where, _family_hint(base, options))
    _check_layouts(family.vae, table, family, where)
    part = plan_vae(source, base, family, None, options, where, [*sources, *_search_folders(sources, source)])
    layout, tensors = _original_tensors(family.vae, part.tensors, part.target.counts, where)
    return _Part("vae", family, layout, part.label.removesuffix(" VAE"), part.target.config, None, tensors,
                 part.policy)


def _pipeline_vae(paths: list[Path], family: ModelFamily, options: ExportOptions, stack: ExitStack
                  ) -> dict[str, LazyTensor]:
    """A pipeline's VAE in the family's original names, under its prefix, for a layout that keeps the VAE in the
    transformer's file (LTX-Video): the version's layout is the one under which every name translates."""
    folder = paths[0] / "vae" if len(paths) == 1 and (paths[0] / "model_index.json").is_file() else None
    if folder is None or not (folder / "config.json").is_file() or family.vae is None or not family.vae.originals:
        return {}
    source = stack.enter_context(open_source([folder], options))
    part = _plan_vae(source, [folder], None, options, str(folder))
    return {part.layout.prefix + name: tensor for name, tensor in part.tensors.items()}


def _check_layouts(spec: ModelSpec, table, family: ModelFamily, where: str) -> None:
    if not spec.originals:
        raise CogExportError(f"cogexport knows no original layout for the {family.name} {spec.class_name}")
    if table.name in {layout.table for layout in spec.originals}:
        raise CogExportError(f"{where} is already in the original {family.name} layout ({table.name}); export it "
                             "without --to original to get Diffusers weights")


def export_original(checkpoint: str | Path | Sequence[str | Path], output: str | Path,
                    options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer (or with component="vae" the VAE) of ``checkpoint`` (Diffusers names) into ``output`` in
    its family's original layout."""
    options = replace(options or ExportOptions(), **overrides)
    component = options.component or "transformer"
    if component not in _PIPELINE_PARTS:
        raise CogExportError(f"--to original writes a transformer or a VAE; --component {component} has no original "
                             "layout")
    if options.lora or options.vae or options.push_to_hub:
        raise CogExportError("--to original writes a full model; it takes no --lora, --vae or --push-to-hub")
    paths, output = as_paths(checkpoint), Path(output)
    base = open_base(options.base) if options.base else None
    with ExitStack() as stack:
        parts: list[_Part] = []
        inputs, own = [*paths, *([base.path] if base else [])], []
        folders = _model_folders(paths, component)
        for name, sources in folders.items():
            source = stack.enter_context(open_source(sources, options))
            where = ", ".join(map(str, sources))
            parts.append(_plan_vae(source, sources, base, options, where) if component == "vae" else
                         _plan_transformer(source, sources, name, tuple(folders), base, options, where))
            inputs += source.info.files
            own += source.own_folders()
        if component == "transformer" and parts[0].layout.writer == "single_file":
            parts[0].beside = _pipeline_vae(paths, parts[0].family, options, stack)
        check_destination(output, own, inputs, options.overwrite)
        first = parts[0]
        total = sum(t.nbytes for part in parts for t in (*part.tensors.values(), *part.beside.values()))
        what = "VAE" if component == "vae" else component + (" and VAE" if first.beside else "")
        result = ExportResult(str(output), f"original {what}", first.label, [],
                              sum(len(p.tensors) + len(p.beside) for p in parts), total, first.policy.describe(),
                              family=first.family.name, source=asdict(source.info), notes=list(source.info.notes))
        with staged_folder(output, total) as staging, byte_progress(total, "export", options.progress) as bar:
            for part in parts:
                folder = staging / (_expert_folder(part.family, part.component, len(parts))
                                    if component == "transformer" else "")
                folder.mkdir(parents=True, exist_ok=True)
                written = _write(folder, part, options, lambda _n, size: bar.update(size))
                result.files += [str((folder / name).relative_to(staging)) for name in written]
        return result


def _write(folder: Path, part: _Part, options: ExportOptions, on_tensor) -> list[str]:
    layout = part.layout
    if layout.writer == "sat":
        return write_sat_model_states(folder, {layout.prefix + name: t for name, t in part.tensors.items()},
                                      on_tensor)
    if layout.writer == "model_states":
        return write_model_states(folder / layout.file, {layout.prefix + name: t for name, t in part.tensors.items()},
                                  on_tensor)
    if layout.writer == "single_file":  # one file: the transformer under its prefix, the VAE (if any) under its own
        everything = {**{layout.prefix + name: t for name, t in part.tensors.items()}, **part.beside}
        metadata = part.family.shapes.original_metadata(part.config, part.task)
        write_safetensors(folder / layout.file, everything, metadata, on_tensor)
        return [layout.file]
    if layout.writer == "torch":  # one plain state dict, as torch.save(model.state_dict()) writes it
        write_torch_archive(folder / layout.file, {layout.prefix + name: t for name, t in part.tensors.items()},
                            on_tensor)
        return [layout.file]
    plan = plan_shards(part.tensors, layout.file, options.max_shard_size)
    written = write_shards(folder, part.tensors, plan, on_tensor)
    config = part.family.shapes.original_config(part.config, part.task)
    if config is None:
        return written
    write_config_json(folder / "config.json", config)
    return ["config.json", *written]
