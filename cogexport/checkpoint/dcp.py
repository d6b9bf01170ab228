"""Read a torch.distributed.checkpoint (DCP) save (FSDP1/FSDP2 through accelerate, torchtitan, finetrainers, plain
``dcp.save``) as a lazy mapping of the module's own names to tensors.

Opening reads only ``.metadata`` (restricted unpickler, see dcp_metadata.py) and checks it against the files: every
tensor's chunks lie inside it, do not overlap and fill it; the byte ranges of a file's records fill it exactly, as DCP
writes them (so a file of another rank or save, or a lost record, shows). DCP stores no checksum of its own and no
rank identity: before the first chunk of a file is used, each of its records must end where a zip archive ends, and
no other file of the same layout may hold the same archives (one rank's file copied over another's). Loading a tensor
allocates it once and reads each of its chunks (a small torch.save archive inside a ``.distcp`` file) straight into
its place, so memory holds one tensor (plus one chunk when a chunk's box is not contiguous in the result).
Non-tensor entries (train state, schedulers, RNG, BytesIO) are listed by name and never unpickled.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import CogExportError
from ..lazy import ByteRanges, LazyTensor, joined_ranges
from .base import CheckpointInfo, LazyCheckpoint, ReaderFacts
from .dcp_locate import ACCELERATE_MODEL, DcpLocation, STEP_NUMBER
from .dcp_metadata import METADATA_FILE, BytesEntry, Chunk, DcpMetadata, TensorEntry, read_metadata
from .tiling import overlapping_pair, row_block_order
from .training_state import components, is_optimizer_state, is_training_state_group
from .deepspeed_zero import DTYPE_NAMES
from .torch_archive import StoredTensor, TorchArchive

_END_OF_ARCHIVE = b"PK\x05\x06"  # a zip archive's last 22 bytes (torch.save writes no archive comment)
_TAIL = 4096  # bytes read from the end of each record: its zip directory (every member's CRC-32) and end record

# Module wrappers whose names can stay in saved keys: torch.compile, FSDP1 and activation checkpointing wrappers.
WRAPPER_COMPONENTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})
MODEL_GROUP = "model"
OPTIMIZER_GROUP = "optimizer"


@dataclass
class DcpFacts(ReaderFacts):
    """What a DCP save says of itself: the program that saved it (accelerate, torchtitan, finetrainers, dcp.save), the
    number of ranks that wrote it, what it holds beside the model (optimizer states, schedulers, ...), and its other
    entries by name (never unpickled)."""

    writer: str | None = None
    world_size: int | None = None
    contents: list[str] = field(default_factory=list)
    client_state: dict[str, str] = field(default_factory=dict)


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def module_name(path: tuple) -> str:
    """A saved name as the module calls it: without the wrappers' components and DDP's leading ``module.``."""
    parts = [part for part in ".".join(str(p) for p in path).split(".") if part not in WRAPPER_COMPONENTS]
    if parts[:1] == ["module"] and len(parts) > 1:
        parts = parts[1:]
    return ".".join(parts)


class DcpFiles:
    """One DCP save folder: its metadata, checked against its files, and reads of tensors from its chunks."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.metadata: DcpMetadata = read_metadata(self.folder)
        self.bytes_read: dict[str, int] = {}
        self.sizes = self._check_files()
        self.layouts = self._check_layouts()
        # where each file's tensor chunks start (the other records are pickles of non-tensor entries, never loaded)
        self._chunk_starts = {(where.file, where.offset) for (fqn, _), where in self.metadata.storage.items()
                              if isinstance(self.metadata.entries.get(fqn), TensorEntry)}
        self._fingerprints: dict[str, bytes] = {}  # file -> digest of its records' tails, once its records are checked
        self._verified: set[tuple[str, int]] = set()  # (file, offset) of chunk archives read whole, CRCs checked

    @property
    def files(self) -> list[str]:
        return [str(self.folder / METADATA_FILE), *(str(self.folder / name) for name in sorted(self.sizes))]

    @property
    def world_size(self) -> int | None:
        ranks = [int(name.split("_")[2]) for name in self.sizes if name.count("_") == 3 and name.startswith("__")
                 and name.split("_")[2].isdigit()]
        return max(ranks) + 1 if ranks else None

    def _check_files(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for (fqn, _), where in self.metadata.storage.items():
            if where.file not in sizes:
                path = self.folder / where.file
                if os.path.basename(where.file) != where.file or where.file in ("", ".", ".."):
                    raise CogExportError(f"{self.folder / METADATA_FILE} names {where.file!r} for {fqn}, a path outside "
                                         "the checkpoint folder; the checkpoint is corrupt")
                if not path.is_file():
                    rank = where.file[2:].split("_")[0] if where.file.startswith("__") else None
                    whose = f"rank {rank}'s file" if rank and rank.isdigit() else "file"
                    raise CogExportError(f"{whose} {where.file} is missing from {self.folder} (its .metadata names it, "
                                         f"for {fqn} and others); copy the whole checkpoint folder again")
                sizes[where.file] = path.stat().st_size
            if where.offset + where.length > sizes[where.file]:
                raise CogExportError(f"{self.folder / where.file} is truncated: {fqn} lies at bytes {where.offset}-"
                                     f"{where.offset + where.length} but the file has {sizes[where.file]}; copy it "
                                     "again")
            if where.transforms:
                raise CogExportError(f"{fqn} in {self.folder} is stored through DCP extensions "
                                     f"({', '.join(where.transforms)}), which cogexport does not read")
        return sizes

    def _check_layouts(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """Each file's records as (start, stop), once they are shown to fill the file exactly: DCP writes a file's
        records back to back, so a gap, an overlap or bytes past the last record mean the file or the .metadata is
        not of this save, or damaged."""
        records: dict[str, list[tuple[int, int, str]]] = {}
        for (fqn, _), where in self.metadata.storage.items():
            records.setdefault(where.file, []).append((where.offset, where.offset + where.length, fqn))
        for file, spans in records.items():
            spans.sort()
            for (_, stop, first), (start, _, second) in zip(spans, spans[1:]):
                if start < stop:
                    raise CogExportError(f"{self.folder / METADATA_FILE} places {first} and {second} on the same "
                                         f"bytes of {file} (from byte {start}); the .metadata is corrupt; copy the "
                                         "checkpoint again")
        layouts = {}
        for file, spans in records.items():
            end = 0
            for start, stop, _ in spans:
                if start > end:
                    raise CogExportError(f"{self.folder / file}: bytes {end}-{start} belong to no entry of its "
                                         ".metadata (the file or the .metadata is not of this save, or damaged); copy "
                                         "the checkpoint folder again")
                end = stop
            if end != self.sizes[file]:
                raise CogExportError(f"{self.folder / file} has {self.sizes[file]} bytes but its .metadata accounts "
                                     f"for {end}: it is not the file this .metadata describes (another rank's or "
                                     "save's?); copy the checkpoint folder again")
            layouts[file] = tuple((start, stop) for start, stop, _ in spans)
        return layouts

    def _check_file(self, file: str) -> None:
        """Before a file's chunks are used: every tensor chunk .metadata places in it must end where a zip archive
        ends, and no other file with the same layout may hold the same archives. Nothing inside a .distcp says which
        rank wrote it, so a rank's file copied over another's would otherwise read as that rank's chunks."""
        if file in self._fingerprints:
            return
        same_layout = [other for other, layout in self.layouts.items() if layout == self.layouts[file]]
        for other in same_layout:
            if other not in self._fingerprints:
                self._fingerprints[other] = self._fingerprint(other)
        copies = [other for other in same_layout if other != file
                  and self._fingerprints[other] == self._fingerprints[file]]
        if copies:
            raise CogExportError(f"{self.folder}: {file} and {copies[0]} hold exactly the same chunks, though "
                                 ".metadata gives them different pieces: one rank's file was copied over the "
                                 "other's; copy the checkpoint folder again")

    def _fingerprint(self, file: str) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        path = self.folder / file
        try:
            with open(path, "rb") as handle:
                for start, stop in self.layouts[file]:
                    tail = os.pread(handle.fileno(), min(stop - start, _TAIL), max(start, stop - _TAIL))
                    if (file, start) in self._chunk_starts and stop > start and (
                            len(tail) < 22 or tail[-22:-18] != _END_OF_ARCHIVE or tail[-2:] != b"\0\0"):
                        raise CogExportError(f"{path}: the tensor chunk its .metadata places at bytes {start}-{stop} "
                                             "is not a whole torch.save archive (the file is damaged, or another "
                                             "rank's or save's); copy the checkpoint folder again")
                    digest.update(tail)
        except OSError as error:
            raise CogExportError(f"cannot read {path}: {error.strerror}") from None
        return digest.digest()

    def check_all(self) -> list[str]:
        """Check every file (for ``inspect``): its layout and identity, and every member of every tensor chunk's
        archive against its CRC-32, but for the chunks already read whole; the pickled non-tensor entries are never
        opened. One message per problem."""
        problems = []
        for file, layout in self.layouts.items():
            try:
                self._check_file(file)
            except CogExportError as error:
                problems.append(str(error))
                continue
            for start, stop in layout:
                if (file, start) in self._verified or (file, start) not in self._chunk_starts or stop == start:
                    continue
                try:
                    archive = TorchArchive(self.folder / file, start, stop - start)
                    try:
                        problems += archive.records.check_all()
                    finally:
                        archive.close()
                except CogExportError as error:
                    problems.append(str(error))
        return problems

    def check_chunks(self, key: str, entry: TensorEntry) -> tuple[Chunk, ...]:
        """The tensor's non-empty chunks, once they are shown to tile it exactly and each has its bytes."""
        where = f"{key} in {self.folder / METADATA_FILE}"
        chunks = tuple(dict.fromkeys(c for c in entry.chunks if c.numel))  # replicas of one box are one chunk
        for chunk in chunks:
            if len(chunk.offsets) != len(entry.size) or len(chunk.sizes) != len(entry.size) or any(
                    o + s > d for o, s, d in zip(chunk.offsets, chunk.sizes, entry.size)):
                raise CogExportError(f"{where}: a chunk at {list(chunk.offsets)} of size {list(chunk.sizes)} lies "
                                     f"outside the tensor's shape {list(entry.size)}; the checkpoint is corrupt")
            if (key, chunk.offsets) not in self.metadata.storage:
                raise CogExportError(f"{where}: the chunk at {list(chunk.offsets)} has no stored bytes; the "
                                     "checkpoint is corrupt")
        overlap = overlapping_pair([(c.offsets, c.sizes) for c in chunks])
        if overlap:
            first, second = sorted((chunks[i].offsets for i in overlap))
            raise CogExportError(f"{where}: chunks at {list(first)} and {list(second)} overlap; the checkpoint is "
                                 "corrupt")
        if sum(c.numel for c in chunks) != entry.size.numel():
            raise CogExportError(f"{where}: its chunks hold {sum(c.numel for c in chunks)} of its "
                                 f"{entry.size.numel()} elements; the checkpoint is incomplete or corrupt")
        return chunks

    def lazy(self, key: str, entry: TensorEntry, origin: str) -> LazyTensor:
        chunks = self.check_chunks(key, entry)
        return LazyTensor(entry.size, entry.dtype, lambda: self.assemble(key, entry, chunks), origin,
                          find_source=lambda: self.chunk_ranges(key, entry, chunks))

    def chunk_ranges(self, key: str, entry: TensorEntry, chunks: tuple[Chunk, ...]) -> ByteRanges | None:
        """Where the tensor's bytes lie, chunk after chunk, when its chunks are blocks of whole rows (FSDP's dim-0
        shards); each range carries its chunk record's CRC-32 check. None for any other tiling."""
        order = row_block_order(entry.size, [(chunk.offsets, chunk.sizes) for chunk in chunks])
        if order is None:
            return None
        parts = []
        for index in order:
            archive, stored = self.open_chunk(key, entry, chunks[index])
            archive.close()  # the check of the bytes copied needs no open file
            if not stored.is_contiguous:
                return None
            parts.append(stored.flat_range(0, stored.numel))
        return joined_ranges(parts)

    def open_chunk(self, key: str, entry: TensorEntry, chunk: Chunk) -> tuple[TorchArchive, StoredTensor]:
        """The archive of one chunk and the tensor it holds, once that is the dtype and shape .metadata says."""
        where = self.metadata.storage[(key, chunk.offsets)]
        self._check_file(where.file)
        archive = TorchArchive(self.folder / where.file, where.offset, where.length)
        try:
            stored = archive.load()
            if not isinstance(stored, StoredTensor) or stored.dtype != entry.dtype or \
                    tuple(stored.shape) != chunk.sizes:
                found = f"{tuple(stored.shape)} {stored.dtype}" if isinstance(stored, StoredTensor) else \
                    type(stored).__name__
                raise CogExportError(f"{self.folder / where.file}: the chunk of {key} at {list(chunk.offsets)} "
                                     f"holds {found}, its .metadata says {chunk.sizes} {entry.dtype}; the "
                                     "checkpoint is corrupt")
        except BaseException:
            archive.close()
            raise
        return archive, stored

    def assemble(self, key: str, entry: TensorEntry, chunks: tuple[Chunk, ...]) -> torch.Tensor:
        out = torch.empty(entry.size, dtype=entry.dtype)
        for chunk in chunks:
            where = self.metadata.storage[(key, chunk.offsets)]
            archive, stored = self.open_chunk(key, entry, chunk)
            try:
                box = out[tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))]
                if box.is_contiguous() and stored.is_contiguous:
                    stored.read_flat(0, stored.numel, out=box.view(-1))  # straight into place
                else:
                    box.copy_(stored.read())
                self.bytes_read[where.file] = self.bytes_read.get(where.file, 0) + stored.nbytes
                if all(record.verified for name, record in archive.records.records.items()
                       if name.endswith(("/data.pkl", f"/data/{stored.key}"))):
                    self._verified.add((where.file, where.offset))
            finally:
                archive.close()
        return out

    def read_elements(self, key: str, entry: TensorEntry, chunk: Chunk, start: int, stop: int) -> torch.Tensor:
        """Elements ``start .. stop`` of one chunk, flattened, without the CRC-32 check (for a comparison only: what
        is written is read by ``assemble``, checked)."""
        archive, stored = self.open_chunk(key, entry, chunk)
        try:
            return stored.read_flat(start, stop, check=False)
        finally:
            archive.close()

    def lazy_row(self, key: str, entry: TensorEntry, row: int, origin: str) -> LazyTensor:
        """Row ``row`` of the tensor's leading axis alone (a stacked tensor's one layer), read from the chunks that
        hold it: the rest of the tensor is never loaded."""
        chunks = self.check_chunks(key, entry)
        return LazyTensor(entry.size[1:], entry.dtype, lambda: self.assemble_row(key, entry, chunks, row), origin)

    def assemble_row(self, key: str, entry: TensorEntry, chunks: tuple[Chunk, ...], row: int) -> torch.Tensor:
        out = torch.empty(entry.size[1:], dtype=entry.dtype)
        for chunk in chunks:
            first, count = chunk.offsets[0], chunk.sizes[0]
            if not first <= row < first + count:
                continue
            where = self.metadata.storage[(key, chunk.offsets)]
            archive, stored = self.open_chunk(key, entry, chunk)
            try:
                box = out[tuple(slice(o, o + s) for o, s in zip(chunk.offsets[1:], chunk.sizes[1:]))]
                per_row = stored.numel // count
                if box.is_contiguous() and stored.is_contiguous:  # the row's elements are one run of the chunk's
                    start = (row - first) * per_row
                    stored.read_flat(start, start + per_row, out=box.reshape(-1))
                else:
                    box.copy_(stored.read()[row - first])
                self.bytes_read[where.file] = self.bytes_read.get(where.file, 0) + per_row * entry.dtype.itemsize
            finally:
                archive.close()
        return out


class DcpCheckpoint(LazyCheckpoint):
    """A DCP save opened lazily: ``checkpoint[name]`` is the model weight under the module's own name;
    ``optimizer_tensors[name][state]`` the optimizer's state of that parameter (exp_avg, step, ...)."""

    def __init__(self, location: DcpLocation) -> None:
        super().__init__()
        self.location = location
        self.model_files = DcpFiles(location.model)
        self.optimizer_files = DcpFiles(location.optimizer) if location.optimizer not in (None, location.model) \
            else None
        self.optimizer_tensors: dict[str, dict[str, LazyTensor]] = {}
        self.facts = DcpFacts()
        self.info = CheckpointInfo(format="dcp", paths=[str(location.model)], facts=self.facts,
                                   tag=location.step_dir.name, tags=location.steps or [location.step_dir.name],
                                   step=location.step, notes=list(location.notes))
        self._open()

    def optimizer_states(self, name: str) -> dict[str, LazyTensor]:
        """The optimizer's per-element states of parameter ``name`` (exp_avg, ...), full shape, lazily."""
        return {key: tensor for key, tensor in self.optimizer_tensors.get(name, {}).items() if len(tensor.shape)}

    def bytes_read(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for files in filter(None, (self.model_files, self.optimizer_files)):
            counts.update({str(files.folder / name): count for name, count in files.bytes_read.items()})
        return counts

    def own_folders(self) -> list[Path]:
        return [self.location.step_dir, self.location.model]

    def check_stored_data(self) -> list[str]:
        return [problem for files in filter(None, (self.model_files, self.optimizer_files))
                for problem in files.check_all()]

    # -- opening ------------------------------------------------------------------------------------------------
    def _open(self) -> None:
        info, metadata = self.info, self.model_files.metadata
        groups = {metadata.path_of(key)[0] for key in metadata.entries}
        model_paths = self._model_paths(metadata, groups)
        for key, path in model_paths.items():
            entry = metadata.entries[key]
            name = module_name(path)
            if not name or name in self._tensors:
                raise CogExportError(f"{self.model_files.folder}: two saved entries are both the module's {name!r} "
                                     f"(one is {key}); the checkpoint mixes models")
            self._tensors[name] = self.model_files.lazy(key, entry, f"{name} (DCP chunks of {key})")
        self._read_optimizer(self.optimizer_files or self.model_files)
        self.facts.world_size = self.model_files.world_size
        info.files = self.model_files.files + (self.optimizer_files.files if self.optimizer_files else [])
        self.facts.client_state = self._other_entries(model_paths)
        self.facts.writer = self._writer(groups)
        floating = [t for t in self._tensors.values() if t.dtype.is_floating_point]
        dtypes = sorted({dtype_name(t.dtype) for t in floating})
        if self.optimizer_tensors:
            info.trainable = [n for n in self._tensors if n in self.optimizer_tensors]
            info.frozen = [n for n, t in self._tensors.items()
                           if n not in self.optimizer_tensors and t.dtype.is_floating_point]
            info.buffers = [n for n in self._tensors if not self._tensors[n].dtype.is_floating_point]
            if info.frozen:
                info.notes.append("a DCP save does not tell parameters from buffers: 'frozen' lists the floating "
                                  "tensors that have no optimizer state")
        else:
            info.trainable = list(self._tensors)
        low = [d for d in dtypes if d != "fp32"]
        info.weights_source = f"model weights as saved ({', '.join(dtypes) or 'no floating tensors'}, DCP shards)"
        if low:
            info.notes.append(f"the saved model weights are {'/'.join(low)}, not fp32 (the run kept its model in "
                              f"{'/'.join(low)}); the export is exact to the {'/'.join(low)} values, no finer")
        self.facts.contents = self._contents(groups)

    def _model_paths(self, metadata: DcpMetadata, groups: set) -> dict[str, tuple]:
        """Flat key -> the module path of every model tensor: under the "model" group, else at the top level, where
        training state (training_state.py: optimizer, schedulers, callbacks, ...) is never a weight and several sets
        of weights (groups of their own, as FastVideo's roles.<role>.transformer) are refused, never merged."""
        # planner_data keeps the saved state dict's own order (the module's state_dict order); the entries do not.
        order = [*metadata.paths, *(key for key in metadata.entries if key not in metadata.paths)]
        tensors = {key: metadata.path_of(key) for key in order if isinstance(metadata.entries.get(key), TensorEntry)}
        if MODEL_GROUP in groups:
            return {key: path[1:] for key, path in tensors.items() if path[0] == MODEL_GROUP and len(path) > 1}
        top = {key: path for key, path in tensors.items()
               if not is_training_state_group(str(path[0])) and not is_optimizer_state(components(path))}
        if not top:
            raise CogExportError(f"{self.model_files.folder} holds no model weights (its top-level entries are "
                                 f"{', '.join(sorted(map(str, groups)))}); point at the model's save, e.g. "
                                 "pytorch_model_fsdp_0")
        self._refuse_several_sets(top)
        return top

    def _refuse_several_sets(self, top: dict[str, tuple]) -> None:
        """Weights at the top level are one model's (torchtitan's flat keys) or one group's; two groups of tensors,
        or a group beside flat keys, are two sets of weights, which no rule here may pick between or merge."""
        sets = sorted({str(path[0]) for path in top.values() if len(path) > 1})
        flat = [str(path[0]) for path in top.values() if len(path) == 1]
        named = sets + ([f"the top-level tensors ({flat[0]}, ...)"] if flat else [])
        if len(named) > 1:
            raise CogExportError(f"{self.model_files.folder} holds several sets of weights ({', '.join(named)}): "
                                 "cogexport reads one model and will not guess which, nor merge them; point at a "
                                 "save of one model (a FastVideo step: the checkpoint-N folder beside its "
                                 "metadata.json, whose reader takes --role)")

    def _read_optimizer(self, files: DcpFiles) -> None:
        metadata = files.metadata
        for key, entry in metadata.entries.items():
            path = metadata.path_of(key)
            if path[0] != OPTIMIZER_GROUP or not isinstance(entry, TensorEntry):
                continue
            joined = ".".join(str(p) for p in path[1:])
            if not joined.startswith("state.") or "." not in joined[len("state."):]:
                continue
            fqn, state = joined[len("state."):].rsplit(".", 1)
            self.optimizer_tensors.setdefault(module_name((fqn,)), {})[state] = files.lazy(
                key, entry, f"{state} of {module_name((fqn,))} (DCP chunks of {key})")

    def _other_entries(self, model_paths: dict) -> dict[str, str]:
        """Everything that is neither a model weight nor an optimizer state, by name (never unpickled)."""
        metadata = self.model_files.metadata
        described = {}
        for key, entry in metadata.entries.items():
            path = metadata.path_of(key)
            if key in model_paths or path[0] == OPTIMIZER_GROUP:
                continue
            described[key] = "pickle, not loaded" if isinstance(entry, BytesEntry) else \
                f"tensor {tuple(entry.size)} {dtype_name(entry.dtype)}"
        return described

    def _contents(self, groups: set) -> list[str]:
        held = [f"model ({len(self._tensors)} tensors)"]
        if self.optimizer_tensors:
            states = sorted({s for states in self.optimizer_tensors.values() for s in states})
            where = f" in {self.optimizer_files.folder.name}/" if self.optimizer_files else ""
            held.append(f"optimizer states {', '.join(states)} of {len(self.optimizer_tensors)} parameters{where}")
        named = {"lr_scheduler": "lr scheduler", "lr_schedulers": "lr schedulers", "scheduler": "scheduler",
                 "dataloader": "dataloader state", "train_state": "train state"}
        # finetrainers numbers its schedulers: lr_scheduler_0, lr_scheduler_1, ...
        held += sorted({named[g] if g in named else "lr schedulers" for g in map(str, groups)
                        if g in named or g.startswith("lr_scheduler_")})
        siblings = self.location.step_dir
        extra = sorted(p.name for p in siblings.iterdir() if p.is_file() and p.suffix in (".pkl", ".bin", ".pt")) \
            if siblings != self.location.model else []
        if extra:
            held.append(f"beside it (not read): {', '.join(extra)}")
        return held

    def _writer(self, groups: set) -> str:
        location = self.location
        if ACCELERATE_MODEL.match(location.model.name):
            return "accelerate FSDP (SHARDED_STATE_DICT; FSDP1 and FSDP2 save alike)"
        name = location.step_dir.name
        if name.startswith("finetrainers_step_"):
            return "finetrainers (ptd backend)"
        if name.startswith("step-") and STEP_NUMBER.match(name) and MODEL_GROUP not in groups:
            return "torchtitan"
        return "torch.distributed.checkpoint (dcp.save)"
