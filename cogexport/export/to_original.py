"""The way back (``--to original``): Diffusers weights of a family's transformer (or another component) written in the
family's original layout, by running the same key-map table backwards: the files the family's own repository and
ComfyUI load (each family's layouts: key_maps/<family>/family.toml, ``original``).

open (a save_pretrained folder, a pipeline's models, or a training checkpoint in Diffusers names) -> check it against
the Diffusers model it claims to be (every tensor present, every shape right) -> cast (the family's dtype policy,
decided on the Diffusers names) -> the original table inverted -> plan the files (original_writers.py) -> publish.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path
from typing import Mapping

from ..checkpoint import LazyCheckpoint, as_paths
from ..errors import CogExportError
from ..keymap.plan import plan_translation
from ..keymap.table import KeyMapTable, load_table
from ..lazy import LazyTensor
from ..models.base_folder import open_base, read_json
from ..models.family import ModelFamily, ModelSpec, OriginalLayout, component_title
from ..models.recognize import choose_table, family_beside, recognise
from ..models.target_choice import choose_transformer
from ..write.folder_plan import FolderPlan
from .inputs import ExportInputs, open_weights, search_folders
from .options import ExportOptions, check_options
from .original_writers import OriginalPart, original_files
from .parts import family_hint, plan_component, precision, target_request
from .publish import publish
from .result import ExportResult

_EXPERTS = ("transformer", "transformer_2")  # the pipeline components a transformer may be split into


def export_original(checkpoint, output, options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer (or with component="vae" ... another component) of ``checkpoint`` (Diffusers names)
    into ``output`` in its family's original layout."""
    options = replace(options or ExportOptions(), **overrides)
    check_options(options, "original")
    component = options.component or "transformer"
    paths, output = as_paths(checkpoint), Path(output)
    with ExitStack() as stack:
        folders = _model_folders(paths, component)
        sources = {name: stack.enter_context(open_weights(where, options.tag, options.ema))
                   for name, where in folders.items()}
        # a pipeline folder's models are read from their own subfolders (messages name those)
        experts = {} if folders == {component: paths} else {name: where[0] for name, where in folders.items()}
        inputs = ExportInputs(paths, open_base(options.base) if options.base else None, experts, sources, stack)
        parts = [_plan_part(inputs, name, component, options) for name in sources]
        if component == "transformer" and parts[0].layout.writer == "single_file":
            _add_components_beside(parts[0], paths, options, inputs)
        folder = FolderPlan()
        for part in parts:
            folder.add(*original_files(_release_folder(part, len(parts)), part, options.max_shard_size))
        folder.check()
        return publish(folder, _result(parts, folder, component, inputs, str(output)), output, inputs, options)


def _model_folders(paths: list[Path], component: str) -> dict[str, list[Path]]:
    """A pipeline folder stands for its transformer(s) or its ``component``; anything else is the model's own
    checkpoint."""
    if len(paths) != 1 or not (paths[0] / "model_index.json").is_file():
        return {component: paths}
    index = read_json(paths[0] / "model_index.json")
    wanted = _EXPERTS if component == "transformer" else (component,)
    found = {name: [paths[0] / name] for name in wanted if isinstance(index.get(name), list) and index[name][0]}
    if not found:
        raise CogExportError(f"{paths[0]}/model_index.json names no {component} to write back")
    return found


def _release_folder(part: OriginalPart, experts: int) -> str:
    return "" if experts == 1 else _release_folder_of(part.family, part.component, experts)


def _release_folder_of(family: ModelFamily, component: str, experts: int) -> str:
    """Where the original release keeps this expert (Wan 2.2 A14B: high_noise_model/, low_noise_model/)."""
    layouts = [v.experts for v in family.variants if v.experts and len(v.experts) == experts]
    if not layouts:
        raise CogExportError(f"{family.name} has no release with {experts} experts")
    return layouts[0][component]


def _original_tensors(spec: ModelSpec, tensors: Mapping[str, LazyTensor], counts: dict,
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


def _check_layouts(spec: ModelSpec, table: KeyMapTable, family: ModelFamily, where: str) -> None:
    if not spec.originals:
        raise CogExportError(f"cogexport knows no original layout for the {family.name} {spec.class_name}")
    if table.name in {layout.table for layout in spec.originals}:
        raise CogExportError(f"{where} is already in the original {family.name} layout ({table.name}); export it "
                             "without --to original to get Diffusers weights")


def _plan_part(inputs: ExportInputs, name: str, component: str, options: ExportOptions) -> OriginalPart:
    if component == "transformer":
        return _plan_transformer(inputs, name, options)
    return _plan_component(inputs.sources[name], component, inputs, options, inputs.where_of(name),
                           inputs.search_folders(name))


def _plan_transformer(inputs: ExportInputs, name: str, options: ExportOptions) -> OriginalPart:
    source, where = inputs.sources[name], inputs.where_of(name)
    search = [*inputs.paths_of(name), *inputs.search_folders(name)]
    hint = family_hint(inputs.base, options) or family_beside(search)
    family, table = choose_table(source, "transformer", "transformer", where, hint)
    spec = family.transformer
    _check_layouts(spec, table, family, where)
    # the release's expert subfolders (high_noise_model/, ...) when writing several experts
    experts = tuple(_release_folder_of(family, each, len(inputs.sources)) for each in inputs.sources) \
        if len(inputs.sources) > 1 else ()
    recognised = recognise(source, table, family, experts, source.info.metadata)
    chosen = choose_transformer(recognised, family, target_request(options, inputs.base, name, experts), where, search)
    diffusers = plan_translation(table, source, chosen.target.schema, chosen.target.counts, what=where)
    policy = precision(spec.keep_fp32, options)
    layout, tensors = _original_tensors(spec, policy.apply(diffusers.tensors), chosen.target.counts, where)
    return OriginalPart(name, family, layout, chosen.label, chosen.target.config, chosen.variant.task, tensors, policy)


def _plan_component(source: LazyCheckpoint, component: str, inputs: ExportInputs, options: ExportOptions,
                    where: str, folders: list[Path]) -> OriginalPart:
    title = component_title(component)
    family, table = choose_table(source, component, title, where, family_hint(inputs.base, options))
    spec = family.components[component]
    _check_layouts(spec, table, family, where)
    part = plan_component(source, component, family, None, inputs.base, options, where, folders)
    layout, tensors = _original_tensors(spec, part.tensors, part.target.counts, where)
    return OriginalPart(component, family, layout, part.label.removesuffix(f" {title}"), part.target.config, None,
                        tensors, part.policy)


def _add_components_beside(transformer: OriginalPart, paths: list[Path], options: ExportOptions,
                           inputs: ExportInputs) -> None:
    """From a pipeline folder: its other models in the family's original names, each under its prefix, in the
    transformer's file, for a layout that keeps them there (LTX-Video's VAE). Each model's version is the layout
    under which every name translates."""
    if len(paths) != 1 or not (paths[0] / "model_index.json").is_file():
        return
    for component, spec in transformer.family.components.items():
        folder = paths[0] / component
        written_beside = spec.originals and not any(layout.writer for layout in spec.originals)
        if component == "transformer" or not written_beside or not (folder / "config.json").is_file():
            continue
        source = inputs.open_more([folder], options.tag)
        part = _plan_component(source, component, inputs, options, str(folder), search_folders([folder], source))
        transformer.beside.update(part.prefixed())
        transformer.beside_components += (component,)


def _result(parts: list[OriginalPart], folder: FolderPlan, component: str, inputs: ExportInputs,
            output: str) -> ExportResult:
    first = parts[0]
    what = component_title(component) if component != "transformer" else \
        " and ".join(component_title(name) for name in ("transformer", *first.beside_components))
    source = next(iter(inputs.sources.values()))
    return ExportResult(output, f"original {what}", first.label, folder.written_paths, folder.tensors,
                        folder.total_bytes, first.policy.describe(), family=first.family.name,
                        source=asdict(source.info), notes=list(source.info.notes))
