"""Layouts that only the input's files tell apart: two key-map tables with the same names and shapes whose values
differ (a fused qkv whose rows one layout stacks [q; k; v] and another interleaves per head). The tensors cannot say
which is meant, and a wrong guess is a silently wrong model, so each such table declares what beside the tensors
says it (``told_apart`` in its ``[table]``: a config.json naming a class, or one safetensors file), and an input
showing none of it is refused with what to add.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence, TypeVar

from ..errors import CogExportError
from ..keymap.table_fields import ToldApart
from ..lazy import LazyTensor
from .base_folder import read_json

Pair = TypeVar("Pair", bound=tuple)


def told_apart(fitting: Sequence[Pair], source: Mapping[str, LazyTensor], where: str) -> list[Pair]:
    """Of several fitting (family, table) pairs that all declare ``told_apart``, those whose evidence the input shows:
    a config.json naming the table's class first, else one safetensors file. Pairs that do not all declare it are
    returned as they are (the caller names the ambiguity)."""
    if len({table.name for _, table in fitting}) < 2 or not all(table.told_apart for _, table in fitting):
        return list(fitting)
    classes = _config_classes(source)
    by_config = [pair for pair in fitting if pair[1].told_apart.config_class in classes]
    if by_config:
        return by_config
    if _is_one_safetensors_file(source):
        by_file = [pair for pair in fitting if pair[1].told_apart.single_file]
        if by_file:
            return by_file
    layouts = "; ".join(f"{table.source}: {_evidence(table.told_apart)}" for _, table in dict(
        (table.name, (family, table)) for family, table in fitting).values())
    raise CogExportError(f"{where} has names and shapes that {len(fitting)} layouts share, whose values differ "
                         f"({layouts}), and nothing beside it says which; add what says it (the config.json, or the "
                         "single file as published) and run again")


def _evidence(told: ToldApart) -> str:
    said = []
    if told.config_class:
        said.append(f"a config.json of {told.config_class} beside the weights")
    if told.single_file:
        said.append("one safetensors file")
    return " or ".join(said)


def input_folders(source: Mapping[str, LazyTensor]) -> list[Path]:
    """Where the input may keep its config: the folder of each path it was read from, and a training checkpoint's own
    folders with the folder above each (the run's)."""
    info = getattr(source, "info", None)
    if info is None:
        return []
    folders = [Path(path) if Path(path).is_dir() else Path(path).parent for path in info.paths]
    for folder in source.own_folders():
        folders += [folder, folder.parent]
    return list(dict.fromkeys(folders))


def _config_classes(source: Mapping[str, LazyTensor]) -> set[str]:
    found = set()
    for folder in input_folders(source):
        path = folder / "config.json"
        if path.is_file():
            config = read_json(path)
            if isinstance(config, dict):
                found |= config_classes(config)
    return found


def config_classes(config: dict) -> set[str]:
    """The classes a config.json names: Diffusers' ``_class_name``, or transformers' ``architectures``."""
    named = [config.get("_class_name"), *(config.get("architectures") or [])]
    return {name for name in named if isinstance(name, str)}


def _is_one_safetensors_file(source: Mapping[str, LazyTensor]) -> bool:
    info = getattr(source, "info", None)
    return info is not None and info.format == "safetensors" and len(info.files) == 1
