"""Every file of an output folder, planned before the folder is opened: tensor files (safetensors, torch.save
archives) with their tensors known by shape and dtype, small files as their final text, and folders taken as they
are from ``--base``. Making the plan runs every check (a family's config that does not build, a scheduler that
does not take its config, two files at one path); writing it is I/O only, a tensor at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Mapping, Protocol

from ..errors import CogExportError
from ..lazy import ByteRange, LazyTensor
from .byte_copy import copy_range
from .file_parts import FileLayout
from .io_engine import SERIAL, IOSettings, Payload, TensorFeed
from .safetensors_file import safetensors_layout, write_safetensors
from .safetensors_file import storage_order, write_order as safetensors_write_order
from .shards import ShardPlan
from .torch_archive import lazy_leaves, leaf_names, write_torch_archive
from .torch_file import save_torch_file
from .value_watch import ValueWatch

OnTensor = Callable[[str, int], None]
SAFETENSORS_METADATA = {"format": "pt"}


@dataclass
class TensorFile:
    """One file of tensors. ``container`` is "safetensors" (``metadata`` in its header) or "torch" (a torch.save
    archive: the state dict itself, or under the key ``under`` beside the plain values ``extra``; without ``under``,
    ``extra``'s values follow the tensors in the same dict; ``single``: the file holds its one tensor alone)."""

    path: str
    tensors: Mapping[str, LazyTensor]
    container: str = "safetensors"
    metadata: Mapping[str, str] = field(default_factory=dict)
    under: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    single: bool = False

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors.values())

    @property
    def tensor_count(self) -> int:
        return len(self.tensors)

    def tree(self) -> Any:
        """What a torch.save of this file saves, LazyTensor leaves for its tensors."""
        if self.single:
            (tensor,) = self.tensors.values()
            return tensor
        return {self.under: dict(self.tensors), **self.extra} if self.under else {**self.tensors, **self.extra}

    def write_order(self) -> list[LazyTensor]:
        """The tensors in the order their data is written (the payloads ``write`` takes)."""
        if self.container == "safetensors":
            return safetensors_write_order(self.tensors)
        return lazy_leaves(self.tree())

    def write_names(self) -> list[str]:
        """The names of ``write_order``'s tensors in the file (a torch.save archive's: their keys joined by dots)."""
        if self.container == "safetensors":
            return storage_order(self.tensors)
        return leaf_names(self.tree(), next(iter(self.tensors)) if self.single else "")

    def layout(self) -> FileLayout | None:
        """Where the header and each tensor lie in a safetensors file (a torchrun job's ranks may write runs of it);
        None for a torch.save archive, whose directory needs every record's CRC-32."""
        return safetensors_layout(self.tensors, self.metadata) if self.container == "safetensors" else None

    def write(self, root: Path, on_tensor: OnTensor | None, payloads: Iterator[Payload] | None = None) -> None:
        path = root / self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.container == "safetensors":
            write_safetensors(path, self.tensors, self.metadata, on_tensor, payloads)
        else:
            write_torch_archive(path, self.tree(), on_tensor, payloads)


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
class ObjectFile:
    """A small torch.save file of plain values (and stand-ins of classes cogexport never imports, written back as
    those classes: see torch_file.py), such as an optimizer's param_groups."""

    path: str
    value: Any

    nbytes = 0
    tensor_count = 0

    def write(self, root: Path, on_tensor: OnTensor | None) -> None:
        path = root / self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        save_torch_file(self.value, path)


@dataclass
class CopiedFile:
    """An input file taken into the output as it is, copied in the kernel (byte_copy.py), and hard-linked under the
    further names ``links`` (a copy where the file system has no links)."""

    path: str
    source: Path
    links: tuple[str, ...] = ()

    tensor_count = 0  # bytes taken whole, not tensors planned one by one

    @property
    def nbytes(self) -> int:
        return Path(self.source).stat().st_size

    def write(self, root: Path, on_tensor: OnTensor | None) -> None:
        target = root / self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb", buffering=0) as handle:
            copy_range(ByteRange(str(self.source), 0, self.nbytes), handle.fileno(), 0)
        for link in self.links:
            (root / link).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(target, root / link)
            except OSError:
                shutil.copyfile(target, root / link)


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
    TensorFile, TextFile, ObjectFile, CopiedFile or LinkedFolder here; other containers such as GGUF, beside their writers)."""

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

    @property
    def data_files(self) -> list[PlannedFile]:
        """The files that hold the model's bytes (tensors, copied inputs), in plan order: what the ranks of a
        torchrun job share (rank_shares.py)."""
        return [planned for planned in self.files if is_data_file(planned)]

    @property
    def other_files(self) -> list[PlannedFile]:
        """Configs, indexes, cards and folders from --base: written once the data files are."""
        return [planned for planned in self.files if not is_data_file(planned)]

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


def is_data_file(planned: PlannedFile) -> bool:
    """Tensors or copied bytes: any planned kind that holds tensors (other writers' kinds, such as GGUF, included)."""
    return isinstance(planned, CopiedFile) or planned.tensor_count > 0


def write_data_files(root: Path, files: list, on_tensor: OnTensor | None, settings: IOSettings = SERIAL,
                     watch: ValueWatch | None = None) -> None:
    """Write ``files`` (data files, or a torchrun rank's parts of them: rank_shares.py) under ``root``, I/O only (the
    plan was checked when it was made), with one feed for all their tensors, so that reading ahead as ``settings``
    say runs on across file boundaries. ``watch``: where their NaN and infinite values are counted (value_watch.py)."""
    fed = [planned for planned in files if hasattr(planned, "write_order")]
    with TensorFeed([tensor for planned in fed for tensor in _fed_tensors(planned, watch)], settings) as feed:
        payloads = iter(feed)
        for planned in files:
            if hasattr(planned, "write_order"):
                planned.write(root, on_tensor, payloads)
            else:  # a kind that loads its own tensors
                planned.write(root, on_tensor)


def _fed_tensors(planned: Any, watch: ValueWatch | None) -> list[LazyTensor]:
    """A file's tensors in write order, each watched by ``watch`` under its name in the file (by its place there
    for a kind that does not name them)."""
    order = planned.write_order()
    if watch is None:
        return order
    names = planned.write_names() if hasattr(planned, "write_names") else [f"#{i}" for i in range(len(order))]
    return [watch.watched(tensor, name, planned.path) for name, tensor in zip(names, order)]


def plan_digest(plan: FolderPlan) -> str:
    """What the plan will write, as a hash: every file's kind, path and settings, its tensors' names, shapes and
    dtypes, its text. Where inputs lie is left out (another machine of a job may mount them elsewhere)."""
    described = [(type(planned).__name__, tuple((item.name, _fingerprint(getattr(planned, item.name)))
                                                 for item in dataclasses.fields(planned) if what_is_written(item)))
                 for planned in plan.files]
    return hashlib.sha256(repr(described).encode()).hexdigest()


def what_is_written(item: dataclasses.Field) -> bool:
    """Whether a planned file's field says what it writes (its digest's part), not how this process writes it
    (``metadata={"how": True}``: a pool of worker processes, which each rank of a job makes its own)."""
    return not item.metadata.get("how", False)


def _fingerprint(value: Any) -> Any:
    if isinstance(value, LazyTensor):
        return "tensor", tuple(value.shape), str(value.dtype)
    if isinstance(value, Mapping):
        return tuple((str(key), _fingerprint(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_fingerprint(item) for item in value)
    if isinstance(value, Path):
        return "path", value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a GGUF plan, its tensors, ...: field by
        # field, as a file's own fields, so that the tensors in it count by shape and dtype (their reprs name
        # their loaders, at addresses of this process, and no two ranks would agree)
        return type(value).__name__, tuple((item.name, _fingerprint(getattr(value, item.name)))
                                           for item in dataclasses.fields(value) if what_is_written(item))
    return repr(value)


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
