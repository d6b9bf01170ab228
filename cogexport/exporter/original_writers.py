"""The original layouts a family's models are written back in, as a table of writers: each takes one model (its
tensors already in original names and cast) and plans the files its family's own code reads. The names are the
``writer`` values of family.toml's ``original`` entries (checked against ORIGINAL_WRITERS when families load).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..lazy import LazyTensor
from ..models.family import ModelFamily, OriginalLayout, Variant
from ..precision import PrecisionPolicy
from ..write.folder_plan import PlannedFile, TensorFile, TextFile, json_text, shard_files
from ..write.model_states_file import model_states_file
from ..write.sat_file import sat_files
from ..write.shards import plan_shards


@dataclass
class OriginalPart:
    """One model to write back: its layout and its tensors in original names."""

    component: str  # the pipeline component it came from (transformer, transformer_2, vae, ...)
    family: ModelFamily
    layout: OriginalLayout
    label: str
    config: dict  # its Diffusers config
    task: str | None
    tensors: dict[str, LazyTensor]
    policy: PrecisionPolicy
    beside: dict[str, LazyTensor] = field(default_factory=dict)  # other models' tensors in the same file, prefixed
    beside_components: tuple[str, ...] = ()  # which models those are
    beside_configs: dict[str, dict] = field(default_factory=dict)  # their Diffusers configs, by component
    notes: list[str] = field(default_factory=list)  # what the user should know about what was written
    read_as: dict[str, LazyTensor] = field(default_factory=dict)  # the tensors as read, not cast (original names)
    variant: Variant | None = None  # the published variant it is built like
    # the Diffusers model it was made from, as read (verify asks Diffusers' converter to read the file back as it)
    diffusers: dict[str, LazyTensor] = field(default_factory=dict)
    published: bool = False  # the model is that published variant (not a custom size in its layout)
    fused: bool = False  # a LoRA run's adapter was fused into it (so it was trained)
    config_json: str = ""  # its Diffusers config as save_pretrained writes it (a loader's config for a custom size)

    def prefixed(self) -> dict[str, LazyTensor]:
        return {self.layout.prefix + name: tensor for name, tensor in self.tensors.items()}


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _safetensors(folder: str, part: OriginalPart, max_shard_size: str | int) -> list[PlannedFile]:
    """Single or sharded safetensors (cut as save_pretrained cuts them), and the family's config.json if it has one."""
    files: list[PlannedFile] = []
    config = part.family.shapes.original_config(part.config, part.task)
    if config is not None:
        files.append(TextFile(_join(folder, "config.json"), json_text(config)))
    # shards are cut greedily in order: the original code's order, so that they are cut where its save cuts them
    tensors = {name: part.tensors[name] for name in part.family.shapes.original_order(list(part.tensors))}
    return files + shard_files(folder, tensors, plan_shards(tensors, part.layout.file, max_shard_size))


def _sat(folder: str, part: OriginalPart, max_shard_size: str | int) -> list[PlannedFile]:
    return sat_files(folder, part.prefixed())


def _model_states(folder: str, part: OriginalPart, max_shard_size: str | int) -> list[PlannedFile]:
    return [model_states_file(_join(folder, part.layout.file), part.prefixed())]


def _torch(folder: str, part: OriginalPart, max_shard_size: str | int) -> list[PlannedFile]:
    """One plain state dict, as torch.save(model.state_dict()) writes it, or that dict under the entry the layout
    names (torch.save({"state_dict": ...})); from a pipeline, with the models the network holds beside the
    transformer (Cosmos Transfer's control branch)."""
    return [TensorFile(_join(folder, part.layout.file), {**part.prefixed(), **part.beside}, container="torch",
                       under=part.layout.under or None)]


def _single_file(folder: str, part: OriginalPart, max_shard_size: str | int) -> list[PlannedFile]:
    """One safetensors file: the model under its prefix, the other components the release keeps in the same file
    under theirs, and the release's header metadata."""
    metadata = part.family.shapes.original_metadata(part.config, part.task, part.beside_configs)
    return [TensorFile(_join(folder, part.layout.file), {**part.prefixed(), **part.beside}, metadata=metadata)]


def _alone(folder: str, part: OriginalPart, max_shard_size: str | int) -> list[PlannedFile]:
    """A model the release keeps in the transformer's file, asked for alone: one safetensors file of its tensors under
    their release names (prefix included), named after the component."""
    return [TensorFile(_join(folder, f"{part.component}.safetensors"), part.prefixed())]


ORIGINAL_WRITERS: dict[str, Callable[[str, OriginalPart, str | int], list[PlannedFile]]] = {
    "": _alone,
    "safetensors": _safetensors,
    "sat": _sat,
    "model_states": _model_states,
    "torch": _torch,
    "single_file": _single_file,
}


# the writers of a file that keeps, from a pipeline, the models the release holds beside the transformer (each
# component whose own `original` names no writer)
WRITES_BESIDE = frozenset({"single_file", "torch"})


def original_files(folder: str, part: OriginalPart, max_shard_size: str | int) -> list[PlannedFile]:
    return ORIGINAL_WRITERS[part.layout.writer](folder, part, max_shard_size)
