"""The models of an export back to a family's original names (``--to original``, ``--to gguf``, fp8): each model of
the input read into its Diffusers model as any export reads it (a LoRA run fused first), checked against that model,
then run backwards through the family's original table. Each part holds its tensors cast by the family's dtype
policy and, for the quantized outputs, as read (not cast), both in original names.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping

import torch

from ..checkpoint import LazyCheckpoint, as_paths
from ..errors import CogExportError
from ..keymap.plan import plan_translation
from ..keymap.table import load_table
from ..lazy import LazyTensor
from ..lora import LoraAdapter
from ..models.base_folder import MODULAR_INDEX, open_base, read_json
from ..models.family import ModelFamily, ModelSpec, OriginalLayout, component_title, families
from ..models.recognize import choose_table
from ..models.release_root import release_root, single_file
from .adapters import adapters_to_fuse
from .inputs import ExportInputs, open_weights, search_folders
from .options import ExportOptions
from .original_writers import OriginalPart
from .parts import ModelExport, family_hint, model_family, plan_component, plan_fused_transformer, plan_transformer

# A format's check of the family of each transformer it writes, made as soon as the family is known (before --base
# may be asked for): raises CogExportError for a family the format cannot write.
FamilyCheck = Callable[[ModelFamily, str], None]
# A format's choice of the table (its full name) a family's transformer is written in, where the format's files are
# not in the way back's layout; None: the way back's.
LayoutChoice = Callable[[ModelFamily], "str | None"]

_EXPERTS = ("transformer", "transformer_2")  # the pipeline components a transformer may be split into


def open_way_back(checkpoint, options: ExportOptions, component: str, stack,
                  whole_release: bool = False) -> ExportInputs:
    """The input: a pipeline folder stands for its transformer(s) or its ``component``; anything else is the model's
    own checkpoint (a training run, a model folder, a LoRA run). ``whole_release``: a pipeline of a family whose
    release is a folder of partitions stands, without --model-type, for every model that folder holds."""
    paths = as_paths(checkpoint)
    root = release_root(paths) if whole_release else None
    if root is not None:
        raise CogExportError(f"{root.path} is a {root.family.name} release folder, the original layout already; export "
                             "it without --to original to get Diffusers weights")
    release = _release_models(paths, options) if whole_release and component == "transformer" else None
    if release is not None:
        return _open_release_models(paths, release, options, stack)
    folders = _model_folders(paths, component, options.model_type)
    sources = {name: stack.enter_context(open_weights(where, options))
               for name, where in folders.items()}
    # a pipeline folder's models are read from their own subfolders (messages name those)
    experts = {} if folders == {component: paths} else {name: where[0] for name, where in folders.items()}
    return ExportInputs(paths, open_base(options.base) if options.base else None, experts, sources, stack)


def _model_folders(paths: list[Path], component: str, task: str | None) -> dict[str, list[Path]]:
    # a classic pipeline's model_index.json, or a modular pipeline's index (Diffusers' own conversion of MiniMax-H3
    # writes modular_model_index.json alone)
    index_file = next((paths[0] / name for name in ("model_index.json", MODULAR_INDEX)
                       if len(paths) == 1 and (paths[0] / name).is_file()), None)
    if index_file is None:
        return {component: paths}
    index = read_json(index_file)
    held = _task_transformer_folder(index, task) if component == "transformer" else None
    if held is not None:  # the pipeline holds several tasks' transformers: the one --model-type names is written
        found = {component: [paths[0] / held]} if _names(index, held) else {}
    else:
        found = {name: [paths[0] / name] for name in (_EXPERTS if component == "transformer" else (component,))
                 if _names(index, name)}
    if not found:
        raise CogExportError(f"{index_file} names no {held or component} to write back")
    return found


def _release_models(paths: list[Path], options: ExportOptions) -> tuple[ModelFamily, dict[str, str]] | None:
    """A pipeline folder (no --model-type, no LoRA) of a family whose release is a folder of partitions: the family,
    and every pipeline folder it holds that the release does -> that model's task ("" for a model the partitions
    share)."""
    index_file = next((paths[0] / name for name in ("model_index.json", MODULAR_INDEX)
                       if len(paths) == 1 and (paths[0] / name).is_file()), None)
    if index_file is None or options.model_type or options.lora:
        return None
    index = read_json(index_file)
    for family in families():
        if not family.release_partitions or index.get("_class_name") not in \
                {family.task(task).pipeline for task in family.release_partitions}:
            continue
        held = {family.task(task).transformer_folder: task for task in family.release_partitions}
        held.update({name: "" for name in family.release_models if name != "transformer"})
        return family, {name: task for name, task in held.items() if _names(index, name)}
    return None


def _open_release_models(paths: list[Path], release: tuple[ModelFamily, dict[str, str]], options: ExportOptions,
                         stack) -> ExportInputs:
    """The pipeline's models the release holds: the partitions' transformers (each with its task) and the models
    they share, each read from its own folder."""
    family, held = release
    located = {name: paths[0] / name for name in held}
    sources = {name: stack.enter_context(open_weights([located[name]], options)) for name, task in held.items()
               if task}
    if not sources:
        raise CogExportError(f"{paths[0]} holds no {family.name} transformer to write back")
    inputs = ExportInputs(paths, open_base(options.base) if options.base else None, {}, sources, stack,
                          tasks={name: task for name, task in held.items() if task}, located=located,
                          release_family=family)
    for name, task in held.items():
        if not task:
            inputs.models[name] = inputs.open_more([located[name]], options.tag)
    return inputs


def _names(index: dict, component: str) -> bool:
    return isinstance(index.get(component), list) and bool(index[component][0])


def _task_transformer_folder(index: dict, task: str | None) -> str | None:
    """The folder of a pipeline holding several tasks' transformers (MiniMax-H3's transformer_ref/ for Ref2VA) where
    ``task``'s is, when not transformer/: the family's task of the index's pipeline class says."""
    pipeline = index.get("_class_name")
    folders = {spec.transformer_folder for family in families() for spec in family.tasks.values()
               if spec.pipeline == pipeline and spec.name == task}
    return next((folder for folder in folders if folder != "transformer"), None)


def release_folder(part: OriginalPart, experts: int) -> str:
    return "" if experts == 1 else release_folder_of(part.family, part.component, experts)


# the shard size of a model the release keeps as one file: never cut
_ONE_FILE = 1 << 62


def destinations(part: OriginalPart, inputs: ExportInputs, count: int,
                 max_shard_size: str | int) -> list[tuple[str, OriginalPart, str | int]]:
    """Where a part is written, as (folder, part, shard size): a release folder of partitions written whole puts each
    transformer into its task's partition, and each model the partitions share into every partition written, as the
    one file the release keeps it as; else the expert's folder (or the output itself)."""
    family = inputs.release_family
    if family is None:
        return [(release_folder(part, count), part, max_shard_size)]
    if part.component in inputs.tasks:
        partition = family.release_partitions[inputs.tasks[part.component]]
        return [(f"{partition}/{family.release_models['transformer']}", part, max_shard_size)]
    where, name = Path(family.release_models[part.component]), single_file(family, part.component)
    if name is not None:
        part, max_shard_size, where = replace(part, layout=replace(part.layout, file=name)), _ONE_FILE, where.parent
    partitions = [family.release_partitions[task] for task in family.release_partitions
                  if task in inputs.tasks.values()]
    return [(str(Path(partition) / where), part, max_shard_size) for partition in partitions]


def release_folder_of(family: ModelFamily, component: str, experts: int) -> str:
    """Where the original release keeps this expert (high_noise_model/, low_noise_model/)."""
    layout = family.expert_layout(experts)
    if not layout:
        raise CogExportError(f"{family.name} has no release with {experts} experts")
    return layout[component]


def plan_way_back(inputs: ExportInputs, component: str, options: ExportOptions,
                  refuse_original: bool = True, family_check: FamilyCheck | None = None,
                  layout_of: LayoutChoice | None = None) -> list[OriginalPart]:
    """Every part to write back: the transformer (each expert; with a LoRA run's adapter fused in), or the one
    ``component``. ``refuse_original``: an input already in the original layout is refused (--to original);
    ``family_check``: the format's check of each transformer's family; ``layout_of``: the format's own choice of a
    family's table to write the transformer in, where it is not the way back's (None: the way back's)."""
    if component != "transformer":
        return [_component_part(inputs.sources[name], component, inputs, options, inputs.where_of(name),
                                inputs.search_folders(name), _own_folder(inputs, name), refuse_original)
                for name in inputs.sources]
    adapters = adapters_to_fuse(inputs, options)  # the original layout holds a full model: a LoRA run is fused
    names = tuple(adapters) or tuple(inputs.sources)
    parts = [_transformer_part(inputs, name, names, options, adapters.get(name), refuse_original,
                               family_check or (lambda family, where: None), layout_of) for name in names]
    # a release folder of partitions written whole: the models the partitions share, once
    return parts + [_component_part(source, name, inputs, options, inputs.where_of(name), inputs.search_folders(name),
                                    _own_folder(inputs, name), refuse_original)
                    for name, source in inputs.models.items()]


def _transformer_part(inputs: ExportInputs, name: str, names: tuple[str, ...], options: ExportOptions,
                      adapter: LoraAdapter | None, refuse_original: bool, family_check: FamilyCheck,
                      layout_of: LayoutChoice | None) -> OriginalPart:
    if adapter is not None:
        family_check(model_family(adapter, inputs.base, options), inputs.where_of(name))
        part = plan_fused_transformer(adapter, inputs, name, options)
    else:
        source, where = inputs.sources[name], inputs.where_of(name)
        search = [*inputs.paths_of(name), *inputs.search_folders(name)]
        family, table = choose_table(source, "transformer", "transformer", where,
                                     family_hint(inputs.base, options, search))
        family_check(family, where)
        _check_layouts(_as_written(family.transformer, family, layout_of), table.name, family, where, refuse_original)
        # the release's expert subfolders (high_noise_model/, ...) when writing several experts (not partitions,
        # each a model of its own task)
        experts = tuple(release_folder_of(family, each, len(names)) for each in names) \
            if len(names) > 1 and not inputs.tasks else ()
        task = inputs.tasks.get(name)
        part = plan_transformer(source, replace(options, model_type=task) if task else options, where, inputs.base,
                                name, experts, search)
    written = _written_back(part, inputs.where_of(name), refuse_original and adapter is None, layout_of)
    written.fused = adapter is not None
    if adapter is None and _keeps_beside(written.layout):  # a release's tensors its Diffusers class has no place for
        computed = {key: _computed(tensor, written.policy.target_dtype(key, tensor.dtype))
                    for key, tensor in written.family.shapes.original_buffers(written.config).items()}
        kept, notes = kept_beside(written.layout, _own_folder(inputs, name), inputs, computed)
        written.tensors, written.notes = {**written.tensors, **kept}, [*written.notes, *notes]
        written.read_as = {**written.read_as, **kept}  # as read: verify expects them where they were written
    return written


def _keeps_beside(layout: OriginalLayout) -> bool:
    return any(drop.keep for drop in load_table(layout.table).drops)


def _computed(tensor: torch.Tensor, dtype: torch.dtype) -> LazyTensor:
    """A tensor the config decides, in the dtype the part's policy gives it."""
    return LazyTensor(tensor.shape, dtype, lambda: tensor.to(dtype), "computed from the model's config")


def _written_back(part: ModelExport, where: str, refuse_original: bool,
                  layout_of: LayoutChoice | None = None) -> OriginalPart:
    spec = part.family.components[part.component if part.component in part.family.components else "transformer"]
    spec = _as_written(spec, part.family, layout_of)
    _check_layouts(spec, part.table.name, part.family, where, refuse_original)
    layout, tensors = original_tensors(spec, part.tensors, part.target.counts, where)
    read_as = plan_translation(load_table(layout.table).inverted(), part.plan.tensors, None, part.target.counts,
                               what=where).tensors
    return OriginalPart(part.component, part.family, layout, part.label, part.target.config,
                        part.variant.task if part.variant else None, tensors, part.policy, read_as=read_as,
                        variant=part.variant, diffusers=dict(part.plan.tensors), published=part.published,
                        config_json=part.target.config_json)


def _as_written(spec: ModelSpec, family: ModelFamily, layout_of: LayoutChoice | None) -> ModelSpec:
    """The model's layouts as the format writes it: the format's own table where it chooses one (written as the way
    back's first layout would be; for a family with no way back, whose release is Diffusers' own names, a layout of
    that table alone), else the way back's."""
    chosen = layout_of(family) if layout_of else None
    if not chosen:
        return spec
    first = spec.originals[0] if spec.originals else OriginalLayout(table=chosen)
    return replace(spec, originals=(replace(first, table=chosen),))


def original_tensors(spec: ModelSpec, tensors: Mapping[str, LazyTensor], counts: dict,
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


def _check_layouts(spec: ModelSpec, table: str, family: ModelFamily, where: str, refuse_original: bool) -> None:
    if not spec.originals:
        raise CogExportError(f"cogexport knows no original layout for the {family.name} {spec.class_name}")
    if refuse_original and table in {layout.table for layout in spec.originals}:
        raise CogExportError(f"{where} is already in the original {family.name} layout ({table}); export it "
                             "without --to original to get Diffusers weights")


def _own_folder(inputs: ExportInputs, name: str) -> Path | None:
    """The model's own folder, when it was given as one (where an export kept the tensors its class has no place
    for)."""
    where = inputs.paths_of(name)
    return where[0] if len(where) == 1 and where[0].is_dir() else None


def _component_part(source: LazyCheckpoint, component: str, inputs: ExportInputs, options: ExportOptions,
                    where: str, folders: list[Path], folder: Path | None = None,
                    refuse_original: bool = True) -> OriginalPart:
    """A model other than the transformer in its original names, with the tensors an export kept in ``folder``."""
    title = component_title(component)
    family, table = choose_table(source, component, title, where, family_hint(inputs.base, options, folders))
    _check_layouts(family.components[component], table.name, family, where, refuse_original)
    part = plan_component(source, component, family, None, inputs.base, options, where, folders)
    written = _written_back(part, where, refuse_original)
    written.label = part.label.removesuffix(f" {title}")
    kept, written.notes = kept_beside(written.layout, folder, inputs)
    written.tensors = {**written.tensors, **kept}
    written.read_as = {**written.read_as, **kept}  # as read: verify expects them where they were written
    return written


def kept_beside(layout: OriginalLayout, folder: Path | None, inputs: ExportInputs,
                computed: Mapping[str, LazyTensor] | None = None) -> tuple[dict[str, LazyTensor], list[str]]:
    """The tensors an export kept beside the model folder (the table's drop rules with ``keep``), as they were: every
    key must be one those rules name. Without the file, the original is written with those of them the config
    decides (``computed``) and without the others, and the user told."""
    files: dict[str, list] = {}
    for drop in load_table(layout.table).drops:
        if drop.keep:
            files.setdefault(drop.keep, []).append(drop)
    kept: dict[str, LazyTensor] = {}
    notes: list[str] = []
    for name, drops in files.items():
        path = folder / name if folder is not None else None
        if path is None or not path.is_file():
            made = {key: t for key, t in (computed or {}).items() if any(drop.matches(key) for drop in drops)}
            kept.update(made)
            names = ", ".join(name for drop in drops for name in drop.names() if name not in made)
            notes.append(f"{folder or 'the input'} has no {name} (the tensors its Diffusers model has no place for, "
                         f"which cogexport keeps there when it exports a release), so {names} are not written"
                         + (f" ({', '.join(made)} are computed from the config)" if made else ""))
            continue
        for key, tensor in inputs.open_more([path]).items():
            if not any(drop.matches(key) for drop in drops):
                raise CogExportError(f"{path} holds {key}, which is none of the tensors kept beside the model "
                                     f"({', '.join(name for drop in drops for name in drop.names())})")
            kept[key] = tensor
    return kept, notes


def _not_written_twice(transformer: OriginalPart, part: OriginalPart, folder: Path) -> dict[str, LazyTensor]:
    """The model's tensors for the transformer's file, less the names the transformer writes itself: where the
    original network has one module that Diffusers gives both models a copy of (Cosmos Transfer's embedders, which
    its control net holds too), the file keeps one, and both copies must be equal or one of them would be lost."""
    own, written = transformer.prefixed(), {}
    for name, tensor in part.prefixed().items():
        if name not in own:
            written[name] = tensor
        elif not torch.equal(tensor.load(), own[name].load()):
            raise CogExportError(f"{folder} holds its own copy of {name}, which differs from the transformer's; the "
                                 f"original layout keeps one: make the {component_title(part.component)}'s copy "
                                 "equal to the transformer's (or write the transformer alone, --component "
                                 "transformer)")
    return written


def add_components_beside(transformer: OriginalPart, options: ExportOptions, inputs: ExportInputs) -> None:
    """From a pipeline folder: its other models in the family's original names, each under its prefix, in the
    transformer's file, for a layout that keeps them there (LTX-Video's VAE, LTX-2's four other models). Each model's
    version is the layout under which every name translates."""
    paths = inputs.paths
    if len(paths) != 1 or not (paths[0] / "model_index.json").is_file():
        return
    for component, spec in transformer.family.components.items():
        folder = paths[0] / component
        written_beside = spec.originals and not any(layout.writer for layout in spec.originals)
        if component == "transformer" or not written_beside or not (folder / "config.json").is_file():
            continue
        found = read_json(folder / "config.json").get("_class_name")
        if found not in spec.classes:  # not a class of the family's: no original layout known
            transformer.notes.append(f"{folder} is a {found}, whose original layout cogexport does not know; the "
                                     f"release file is written without the {component_title(component)}")
            continue
        source = inputs.open_more([folder], options.tag)
        part = _component_part(source, component, inputs, options, str(folder), search_folders([folder], source),
                               folder)
        transformer.beside.update(_not_written_twice(transformer, part, folder))
        transformer.beside_components += (component,)
        transformer.beside_configs[component] = part.config
        transformer.notes += part.notes
