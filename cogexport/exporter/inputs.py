"""Opening what an export reads: the checkpoint (one per expert when the input holds several, as Wan 2.2 A14B
releases and runs do), --base, and the files each was read from (so the output can never overlap them).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from ..checkpoint import LazyCheckpoint, as_paths, open_checkpoint
from ..checkpoint import open_weights as open_chosen
from ..errors import CogExportError
from ..lora.experts import expert_pairs
from ..models.base_folder import BaseFolder, open_base
from ..models.family import ModelFamily, families
from ..models.recognize import expert_folders, lora_key
from ..models.release_root import ReleaseRoot, release_root
from .options import PIPELINE, ExportOptions, default_component


def open_weights(paths: Sequence[Path], options: ExportOptions) -> LazyCheckpoint:
    """The checkpoint's weights the options ask for: the trained ones, ``--role``'s or ``--ema``'s."""
    return open_chosen(list(paths), options.tag, ema=options.ema, role=options.role)


def search_folders(paths: Sequence[Path], source: LazyCheckpoint) -> list[Path]:
    """Where a run may have saved its configs: the folders given, and above each checkpoint folder."""
    folders = [p if p.is_dir() else p.parent for p in paths]
    for folder in source.own_folders():
        folders += [folder, folder.parent]
    return list(dict.fromkeys(folders))


@dataclass
class ExportInputs:
    paths: list[Path]
    base: BaseFolder | None
    experts: dict[str, Path]  # pipeline component -> the expert's folder or file; empty for one ordinary model
    sources: dict[str, LazyCheckpoint]  # pipeline component -> its checkpoint (transformer alone when no experts)
    stack: ExitStack
    extra: list[LazyCheckpoint] = field(default_factory=list)  # other checkpoints read (a --vae)
    # pipeline component -> the release's subfolder for that expert (high_noise_model, ...), when there are experts
    expert_folders: dict[str, str] = field(default_factory=dict)
    # a release folder of partitions (models/release_root.py): pipeline component -> the task of its transformer, the
    # models the partitions share (the VAEs), and where in the folder each model was read
    tasks: dict[str, str] = field(default_factory=dict)
    models: dict[str, LazyCheckpoint] = field(default_factory=dict)
    located: dict[str, Path] = field(default_factory=dict)
    release_notes: list[str] = field(default_factory=list)
    release_family: ModelFamily | None = None  # the family whose release folder a way back writes whole

    @property
    def where(self) -> str:
        return ", ".join(str(p) for p in self.paths)

    @property
    def source(self) -> LazyCheckpoint:
        """The first (or only) model's checkpoint: what the run saved for the transformer."""
        return self.sources.get("transformer") or next(iter(self.sources.values()))

    @property
    def expert_names(self) -> tuple[str, ...]:
        """The release's expert subfolders read (high_noise_model, ...), empty for one ordinary model."""
        return tuple(self.expert_folders.get(component, path.name) for component, path in self.experts.items())

    @property
    def lora_marker(self) -> str | None:
        return lora_key(list(self.source))

    def where_of(self, component: str) -> str:
        """What messages call one expert's part of the input (the whole input for an ordinary model)."""
        if component in self.located:
            return str(self.located[component])
        return str(self.experts[component]) if self.experts else self.where

    def paths_of(self, component: str) -> list[Path]:
        """Where one expert's files are (its own config.json sits in its subfolder); the input for an ordinary
        model."""
        if component in self.located:
            return [self.located[component]]
        return [self.experts[component]] if self.experts else self.paths

    def search_folders(self, component: str | None = None) -> list[Path]:
        """Where the model's run may keep its config (the first transformer's, by default)."""
        if component is None:
            component = "transformer" if "transformer" in self.sources else next(iter(self.sources))
        return search_folders(self.paths_of(component), self.sources.get(component) or self.models[component])

    def model_source(self, component: str) -> LazyCheckpoint:
        """The checkpoint a model other than the transformer is read from: its own file in a release folder of
        partitions, else the transformer's (a release file holding both)."""
        return self.models.get(component) or self.source

    def open_more(self, paths: Sequence[Path], tag: str | None = None) -> LazyCheckpoint:
        """Another checkpoint the export reads (a --vae), closed with the rest."""
        opened = self.stack.enter_context(open_checkpoint(list(paths), tag))
        self.extra.append(opened)
        return opened

    def notes_of_others(self) -> list[str]:
        """What opening the other checkpoints read found out (--base's weights, a --vae: weight files left alone beside
        a model folder's own): the user hears of these as of the checkpoint's."""
        return [*self.release_notes, *(note for each in self.extra for note in each.info.notes)]

    def read_paths(self, options: ExportOptions) -> list[Path]:
        """Every path read: the output may neither be inside nor contain one."""
        read = [file for each in (*self.sources.values(), *self.extra) for file in each.info.files]
        return [*self.paths, *read, *options.vae, *([self.base.path] if self.base else [])]

    def own_folders(self) -> list[Path]:
        return [folder for each in (*self.sources.values(), *self.extra) for folder in each.own_folders()]


def side_by_side_experts(paths: list[Path]) -> tuple[dict[str, Path], dict[str, str]]:
    """One folder holding one adapter file per expert side by side (ai-toolkit saves a two-expert run as
    NAME_high_noise and NAME_low_noise): component -> file, and component -> the release's subfolder name. Empty
    when the folder is no such pair; several pairs (one per saved step) are refused, each named."""
    folder = paths[0] if len(paths) == 1 else None
    files = sorted(folder.glob("*.safetensors")) if folder is not None and folder.is_dir() else []
    if len(files) < 2:
        return {}, {}
    for family in families():
        for layout in {tuple(v.experts.items()) for v in family.variants if v.experts}:
            pairs = expert_pairs(files, dict(layout))
            if len(pairs) > 1:
                listing = "; ".join(" and ".join(p.name for p in pair.values()) for pair in pairs.values())
                raise CogExportError(f"{folder} holds {len(pairs)} sets of expert adapters ({listing}); point at the "
                                     "files of one set")
            if pairs:
                return next(iter(pairs.values())), dict(layout)
    return {}, {}


def _experts(paths: list[Path]) -> tuple[dict[str, Path], dict[str, str]]:
    """The input's experts, if it holds several: the release's subfolders, or adapter files side by side."""
    folders = expert_folders(paths)
    if folders:
        return folders, {component: folder.name for component, folder in folders.items()}
    return side_by_side_experts(paths)


def _release_inputs(root: ReleaseRoot, paths: list[Path], base: BaseFolder | None, options: ExportOptions,
                    stack: ExitStack) -> ExportInputs:
    """A release folder of partitions: every partition's transformer (only --model-type's, when given), each into its
    task's pipeline folder, and the models the partitions share when the export writes them."""
    transformers = {folder: (task, where) for folder, (task, where) in root.transformers().items()
                    if options.model_type in (None, task)}
    if not transformers:
        held = ", ".join(f"{folder.name}/ ({task})" for task, folder in root.partitions.items())
        raise CogExportError(f"--model-type {options.model_type}: {root.path} holds no such partition (it holds "
                             f"{held}); pass one of those, or none to export them all")
    sources = {folder: stack.enter_context(open_weights([where], options)) for folder, (_, where) in
               transformers.items()}
    inputs = ExportInputs(paths, base, {}, sources, stack, tasks={f: task for f, (task, _) in transformers.items()},
                          located={f: where for f, (_, where) in transformers.items()}, release_notes=root.notes())
    component = default_component(options)
    if component == PIPELINE or (component != "transformer" and component in root.family.release_models):
        for name, where in root.shared().items():
            inputs.models[name], inputs.located[name] = inputs.open_more([where], options.tag), where
    elif component == "transformer":
        others = [name for name in root.family.release_models if name != "transformer"]
        inputs.release_notes.append(f"{root.path}'s {', '.join(others)} are not exported with the transformers: "
                                    f"a pipeline export (--base PIPELINE) takes them from the release, or export "
                                    f"each with --component")
    return inputs


@contextmanager
def open_inputs(checkpoint, options: ExportOptions) -> Iterator[ExportInputs]:
    paths = as_paths(checkpoint)
    base = open_base(options.base) if options.base else None
    root = release_root(paths)
    if root is not None:
        with ExitStack() as stack:
            yield _release_inputs(root, paths, base, options, stack)
        return
    experts, subfolders = _experts(paths)
    with ExitStack() as stack:
        sources = {component: stack.enter_context(open_weights([path], options))
                   for component, path in experts.items()} or \
            {"transformer": stack.enter_context(open_weights(paths, options))}
        yield ExportInputs(paths, base, experts, sources, stack, expert_folders=subfolders)
