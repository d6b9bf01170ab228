"""A release folder of partitions, one per task (family.toml's ``[release]``: MiniMax-H3's FL2VA/ and Ref2VA/, each
holding the pipeline's models), read as one input: which partitions it holds, where each keeps each model, and the
models they share, checked equal in every partition (two different copies are refused, never one picked). Exports
read every partition's transformer and the shared models once; the way back writes the same folder."""

from __future__ import annotations

import filecmp
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import CogExportError
from .family import ModelFamily, families


@dataclass(frozen=True)
class ReleaseRoot:
    family: ModelFamily
    path: Path
    partitions: dict[str, Path]  # task -> its partition folder: those present, in the family's order
    one_partition: bool = False  # the input is one partition's folder (FL2VA/), not the release folder above it

    @property
    def missing(self) -> list[str]:
        """The family's partition subfolders the release folder given does not hold."""
        if self.one_partition:
            return []
        return [sub for task, sub in self.family.release_partitions.items() if task not in self.partitions]

    def transformers(self) -> dict[str, tuple[str, Path]]:
        """Pipeline folder (the task's transformer_folder) -> (task, the partition's transformer)."""
        where = self.family.release_models["transformer"]
        return {self.family.task(task).transformer_folder: (task, folder / where)
                for task, folder in self.partitions.items()}

    def shared(self) -> dict[str, Path]:
        """Every other model the partitions hold -> its path in the first partition holding it, once every other
        partition's copy is checked equal to it byte for byte."""
        found: dict[str, Path] = {}
        transformer = self.family.release_models["transformer"]
        for component, where in self.family.release_models.items():
            copies = [folder / where for folder in self.partitions.values() if (folder / where).exists()]
            if component == "transformer" or not copies:
                continue
            for other in copies[1:]:
                differing = _first_difference(copies[0], other)
                if differing is not None:
                    raise CogExportError(
                        f"{self.path}: the partitions' {component} differ ({differing}), but the pipeline holds one "
                        f"{component}; export each partition alone (point at its {transformer}/ with --base), or "
                        "make the copies equal")
            found[component] = copies[0]
        return found

    def notes(self) -> list[str]:
        if not self.missing:
            return []
        present = ", ".join(f"{folder.name}/" for folder in self.partitions.values())
        return [f"{self.path} holds no {', '.join(f'{sub}/' for sub in self.missing)}: only {present} exported "
                "(a pipeline export keeps --base's transformer for the missing partition)"]


def release_root(paths: Sequence[Path]) -> ReleaseRoot | None:
    """The release folder of partitions the input is, when it is one folder holding the transformer of at least one
    partition of a family's ``[release]``, or one partition's own folder (named as the release names it)."""
    if len(paths) != 1 or not Path(paths[0]).is_dir():
        return None
    root = Path(paths[0])
    for family in families():
        where = family.release_models.get("transformer")
        present = {task: root / sub for task, sub in family.release_partitions.items()
                   if where and (root / sub / where).exists()}
        if present:
            return ReleaseRoot(family, root, present)
        alone = [task for task, sub in family.release_partitions.items() if where and root.name == sub
                 and (root / where).exists()]
        if alone:
            return ReleaseRoot(family, root, {alone[0]: root}, one_partition=True)
    return None


def single_file(family: ModelFamily, component: str) -> str | None:
    """The file name a release keeps the model as, when its ``[release] models`` path names one file."""
    where = family.release_models.get(component, "")
    return Path(where).name if where.endswith(".safetensors") else None


def _first_difference(one: Path, other: Path) -> str | None:
    """Where two copies of a model (files, or folders of files) first differ, in words; None when equal."""
    if one.is_file() and other.is_file():
        return None if filecmp.cmp(one, other, shallow=False) else f"{one} and {other} are not the same bytes"
    names = {path.relative_to(one) for path in one.rglob("*") if path.is_file()} if one.is_dir() else set()
    others = {path.relative_to(other) for path in other.rglob("*") if path.is_file()} if other.is_dir() else set()
    if not one.is_dir() or names != others:
        return f"{one} and {other} do not hold the same files"
    return next((f"{one / name} and {other / name} are not the same bytes" for name in sorted(names)
                 if not filecmp.cmp(one / name, other / name, shallow=False)), None)

