"""Every file of an output folder, planned before the folder is opened: tensor files (safetensors, torch.save
archives) with their tensors known by shape and dtype, small files as their final text, and folders taken as they
are from ``--base``. Making the plan runs every check (a family's config that does not build, a scheduler that
does not take its config, two files at one path); writing it is I/O only, a tensor at a time.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping, Protocol

from ..errors import CogExportError
from ..lazy import LazyTensor
from .safetensors_file import write_safetensors
from .shards import ShardPlan
from .torch_archive import write_torch_archive

OnTensor = Callable[[str, int], None]
SAFETENSORS_METADATA = {"format": "pt"}


@dataclass
class TensorFile:
    """One file of tensors. ``container`` is "safetensors" (``metadata`` in its header) or "torch" (a torch.save
    archive: the state dict itself, or under the key ``under`` beside the plain values ``extra``)."""

    path: str
    tensors: Mapping[str, LazyTensor]
    container: str = "safetensors"
    metadata: Mapping[str, str] = field(default_factory=dict)
    under: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors.values())

    @property
    def tensor_count(self) -> int:
        return len(self.tensors)

    def write(self, root: Path, on_tensor: OnTensor | None) -> None:
        path = root / self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.container == "safetensors":
            write_safetensors(path, self.tensors, self.metadata, on_tensor)
        else:
            tree = {self.under: dict(self.tensors), **self.extra} if self.under else dict(self.tensors)
            write_torch_archive(path, tree, on_tensor)


@dataclass
class TextFile:
    path: str
    text: str

    nbytes = 0  # next to the tensors, nothing
    tensor_count = 0

    def write(self, root: Path, on_tensor: OnTensor | None) -> None:
        path = root / self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text, encoding="utf-8")


@dataclass
class LinkedFolder:
    """A folder taken as it is (a base pipeline's text encoder): hard links where the file system allows, else
    copies. ``how`` says which, once written."""

    path: str
    source: Path
    how: str = ""

    nbytes = 0  # usually links; copies are counted by the free-space check of the caller when it cannot link
    tensor_count = 0

    def write(self, root: Path, on_tensor: OnTensor | None) -> None:
        self.how = link_or_copy_tree(self.source, root / self.path)


class PlannedFile(Protocol):
    """A file of an output folder: where it goes, the bytes of tensor data it holds, and how it is written (a
    TensorFile, TextFile or LinkedFolder here; other containers such as GGUF, beside their writers)."""

    path: str

    @property
    def nbytes(self) -> int: ...

    @property
    def tensor_count(self) -> int: ...

    def write(self, root: Path, on_tensor: OnTensor | None) -> None: ...


@dataclass
class FolderPlan:
    files: list[PlannedFile] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(planned.nbytes for planned in self.files)

    @property
    def tensors(self) -> int:
        return sum(planned.tensor_count for planned in self.files)

    @property
    def paths(self) -> list[str]:
        return [planned.path for planned in self.files]

    @property
    def written_paths(self) -> list[str]:
        """The files written (not the folders taken as they are)."""
        return [planned.path for planned in self.files if not isinstance(planned, LinkedFolder)]

    def add(self, *planned: PlannedFile) -> None:
        self.files.extend(planned)

    def check(self) -> None:
        """Every path relative, inside the folder, and used once."""
        seen = set()
        for path in self.paths:
            pure = PurePosixPath(path)
            if pure.is_absolute() or ".." in pure.parts or not pure.parts:
                raise CogExportError(f"output file {path!r} would not be inside the output folder")
            if path in seen:
                raise CogExportError(f"two outputs would be written to {path}")
            seen.add(path)

    def linked(self) -> dict[str, str]:
        return {planned.path: planned.how for planned in self.files if isinstance(planned, LinkedFolder)}


def write_folder(root: Path, plan: FolderPlan, on_tensor: OnTensor | None = None) -> None:
    """Write every planned file under ``root`` (I/O only: the plan was checked when it was made)."""
    for planned in plan.files:
        planned.write(root, on_tensor)


def json_text(config: Mapping[str, object]) -> str:
    """A JSON config in Diffusers' own layout (sorted keys, two-space indent, final newline)."""
    return json.dumps(dict(config), indent=2, sort_keys=True) + "\n"


def shard_files(folder: str, tensors: Mapping[str, LazyTensor], plan: ShardPlan) -> list[PlannedFile]:
    """A sharded (or single-file) safetensors save as ``save_pretrained`` writes it: the shards, and the index."""
    prefix = f"{folder}/" if folder else ""
    files: list[PlannedFile] = [TensorFile(prefix + name, {key: tensors[key] for key in keys},
                                           metadata=SAFETENSORS_METADATA) for name, keys in plan.files.items()]
    if plan.index is not None:
        files.append(TextFile(prefix + plan.index_name, json_text(plan.index)))
    return files


def link_or_copy_tree(source: Path, destination: Path) -> str:
    """Mirror ``source`` into ``destination`` with hard links, falling back to copies; says which it used."""
    how = "linked"
    for path in sorted(source.rglob("*")):
        target = destination / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
            how = "copied"
    return how
