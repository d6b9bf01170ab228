"""Read the saves of PyTorch's Hugging Face storage writer (``torch.distributed.checkpoint.HuggingFaceStorageWriter``:
torchtitan's last-step Hugging Face save, and any ``dcp.save`` to Hugging Face format).

Two layouts:

- per rank (``save_distributed=True``): ``shard-{R}-model-{K}-of-{N}.safetensors`` with R = rank + 1 and K = 1..N the
  file ``fqn_to_index_mapping`` gives a tensor (N = 1 without a mapping). Each holds that rank's piece of each tensor
  under the tensor's full name, the piece's position in the header metadata entry ``DCP_SHARDING_INFO``
  (``{name: {"saved_offsets": [...]}}``). There is no index and no ``.metadata``: a tensor's full shape is where its
  pieces end, and nothing records how many ranks wrote the save.
- consolidated (``enable_consolidation=True``, or torchtitan's consolidation on every rank): whole tensors in
  ``model-{K}-of-{N}.safetensors`` with ``model.safetensors.index.json``, read as any sharded safetensors save; the
  per-rank files it was made from stay in ``sharded/`` beside it, and are left alone.

The per-rank reader is as strict as the DCP reader: every file's header is checked (``read_header``), every tensor's
pieces must agree on dtype and rank and tile the tensor exactly (no gap, no overlap; empty pieces allowed), and a
rank numbered below the highest one must have its files. A tensor is assembled when loaded, by ``pread`` of exactly
its pieces' bytes straight into their place in the result: memory holds one tensor.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import CogExportError, quoted
from ..lazy import ByteRange, ByteRanges, LazyTensor, joined_ranges
from ..tensor_bytes import pread_into, tensor_buffer
from .base import CheckpointInfo, HeaderFacts, LazyCheckpoint
from .deepspeed_zero import DTYPE_NAMES
from .locate import natural_sorted
from .safetensors_files import RANK_FILE, SHARDING_INFO, SafetensorsCheckpoint, read_header
from .tiling import overlapping_pair, row_block_order

SAVED_OFFSETS = "saved_offsets"
SHARDED_FOLDER = "sharded"  # where a consolidated save keeps the per-rank files it was made from
INDEX = "model.safetensors.index.json"


@dataclass
class HfWriterFacts(HeaderFacts):
    """What a Hugging Face writer save says of itself: the layout it was written in, the number of ranks that wrote it
    (per rank: the highest rank's files), what it holds, and the consolidated files' header metadata."""

    writer: str | None = None
    world_size: int | None = None
    contents: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RankFileName:
    """What a per-rank file's name says: the rank (counted from 1, as the writer numbers them) and which of the
    mapping's files it is."""

    rank: int
    index: int
    count: int

    @property
    def name(self) -> str:
        return rank_file_name(self.rank, self.index, self.count)


def rank_file_name(rank: int, index: int, count: int) -> str:
    return f"shard-{rank:05d}-model-{index:05d}-of-{count:05d}.safetensors"


def parse_rank_file_name(name: str) -> RankFileName | None:
    found = RANK_FILE.match(name)
    return RankFileName(*(int(group) for group in found.groups())) if found else None


def rank_files(folder: Path) -> list[Path]:
    """The per-rank files directly in ``folder``, by rank and file index."""
    try:
        found = [p for p in folder.iterdir() if RANK_FILE.match(p.name) and p.is_file()]
    except OSError:
        return []
    return sorted(found, key=lambda p: (parse_rank_file_name(p.name).rank, parse_rank_file_name(p.name).index))


def consolidated_leftover(folder: Path) -> Path | None:
    """The ``sharded/`` folder of per-rank files beside a consolidated save, if ``folder`` is one."""
    sharded = folder / SHARDED_FOLDER
    return sharded if (folder / INDEX).is_file() and rank_files(sharded) else None


@dataclass(frozen=True)
class Piece:
    """One rank's piece of a tensor: its box in the whole tensor and where its bytes start in its file."""

    file: Path
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dtype: torch.dtype
    start: int

    @property
    def numel(self) -> int:
        return torch.Size(self.sizes).numel()

    def box(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes))

    def describe(self) -> str:
        return f"the piece at {list(self.offsets)} of size {list(self.sizes)} in {self.file.name}"


def sharding_info(file: Path, metadata: dict[str, str], entries: dict) -> dict[str, tuple[int, ...]]:
    """Each tensor's saved offsets, from the header's DCP_SHARDING_INFO, checked against the tensors of the file."""
    def corrupt(what: str) -> CogExportError:
        return CogExportError(f"{file} has a damaged {SHARDING_INFO} header entry: {what}; copy the file again")

    if SHARDING_INFO not in metadata:
        raise CogExportError(f"{file} is named as a rank file of a Hugging Face writer save but its header has no "
                             f"{SHARDING_INFO} (where each piece lies): it is not one; rename it or point at it "
                             "alone")
    try:
        info = json.loads(metadata[SHARDING_INFO])
    except ValueError:
        raise corrupt("not valid JSON") from None
    if not isinstance(info, dict):
        raise corrupt("not a JSON object")
    offsets = {}
    for name, (_, shape, _) in entries.items():
        entry = info.get(name)
        saved = entry.get(SAVED_OFFSETS) if isinstance(entry, dict) else None
        if not isinstance(saved, list) or len(saved) != len(shape) or not all(
                isinstance(o, int) and not isinstance(o, bool) and 0 <= o < 2**62 for o in saved):
            raise corrupt(f"tensor {quoted(name)} of shape {list(shape)} has saved offsets {quoted(saved)}")
        offsets[name] = tuple(saved)
    extra = sorted(set(info) - set(entries))
    if extra:
        raise corrupt(f"it places {quoted(extra[0])}, which the file does not hold")
    return offsets


class HfShardedCheckpoint(LazyCheckpoint):
    """A per-rank Hugging Face writer save (one folder of ``shard-*-model-*-of-*.safetensors``) as whole tensors."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = Path(folder)
        self.files = rank_files(self.folder)
        if not self.files:
            raise CogExportError(f"{self.folder} holds no rank files of a Hugging Face writer save "
                                 "(shard-*-model-*-of-*.safetensors)")
        self.names = {file: parse_rank_file_name(file.name) for file in self.files}
        self._descriptors: dict[Path, int] = {}
        self._read: dict[Path, int] = {}
        ranks = sorted({n.rank for n in self.names.values()})
        self.facts = HfWriterFacts(writer="torch.distributed.checkpoint HuggingFaceStorageWriter (save_distributed: "
                                          "one file per rank)", world_size=ranks[-1])
        self.info = CheckpointInfo(format="hf-storage", paths=[str(self.folder)], facts=self.facts,
                                   files=[str(f) for f in self.files], weights_source="")
        try:
            self._check_names()
            pieces = self._read_headers()
            self._check_lost_files(pieces)
            for name in natural_sorted(pieces):  # the files keep no order of the model's: one that no file decides
                self._tensors[name] = self._lazy(name, pieces[name])
        except BaseException:
            self.close()
            raise
        self.info.weights_source = f"model weights as saved ({_dtypes(self)}, per-rank pieces)"
        self.info.trainable = list(self._tensors)
        self.facts.contents = [f"model ({len(self._tensors)} tensors) in {len(self.files)} files of {ranks[-1]} "
                               f"ranks"]
        self.info.notes.append(f"a per-rank Hugging Face writer save does not record how many ranks wrote it: read "
                               f"the files of ranks 1-{ranks[-1]} as the whole save")

    # -- opening ------------------------------------------------------------------------------------------------
    def _missing_files(self) -> list[str]:
        """Per-rank files a rank up to the highest lacks: (rank, file index) pairs no file has."""
        present = {(n.rank, n.index) for n in self.names.values()}
        count = next(iter(self.names.values())).count
        ranks = range(1, max(n.rank for n in self.names.values()) + 1)
        indices = sorted({n.index for n in self.names.values()})
        return [rank_file_name(r, k, count) for r in ranks for k in indices if (r, k) not in present]

    def _check_names(self) -> None:
        counts = sorted({n.count for n in self.names.values()})
        if len(counts) > 1:
            raise CogExportError(f"{self.folder} mixes the rank files of saves cut into "
                                 f"{' and '.join(map(str, counts))} files (shard-*-model-*-of-N.safetensors): point at "
                                 "one save's folder")
        wrong = [file.name for file, n in self.names.items() if not 1 <= n.index <= n.count or n.rank < 1]
        if wrong:
            raise CogExportError(f"{self.folder / wrong[0]} is numbered outside its save (rank from 1, file 1 to N); "
                                 "the save is damaged or renamed")
        ranks = {n.rank for n in self.names.values()}
        absent = [rank for rank in range(1, max(ranks) + 1) if rank not in ranks]
        if absent:
            expected = [name for name in self._missing_files() if parse_rank_file_name(name).rank == absent[0]]
            raise CogExportError(f"rank {absent[0]} of {max(ranks)}'s file {expected[0]} is missing from "
                                 f"{self.folder}; copy the whole save folder again")

    def _check_lost_files(self, pieces: dict[str, list[Piece]]) -> None:
        """A rank that wrote some of the mapping's files but not file K, which other ranks wrote, lost its pieces of
        K's tensors; nothing else would show it when it is the last rank (its pieces end the tensors, and at 2 ranks
        what is left of each looks like a tensor saved whole). The writer leaves a file out only when the rank has
        nothing to write in it: under FSDP every rank holds a piece of every tensor, dropped only as a copy of
        another rank's identical empty piece, so each of K's tensors must end in an empty piece. (A file holding only
        unsharded tensors that other ranks wrote would be refused too: the files cannot tell it from a loss.)"""
        by_index: dict[int, set[str]] = {}
        for file, name in self.names.items():
            by_index.setdefault(name.index, set()).update(n for n, ps in pieces.items() if any(p.file == file
                                                                                                 for p in ps))
        for missing in self._missing_files():
            index = parse_rank_file_name(missing).index
            held = [name for name in sorted(by_index.get(index, ())) if not _ends_in_an_empty_piece(pieces[name])]
            if held:
                wrote = sorted(n.index for n in self.names.values() if n.rank == parse_rank_file_name(missing).rank)
                raise CogExportError(f"{missing} is missing from {self.folder}: its rank wrote files "
                                     f"{', '.join(map(str, wrote))} of {next(iter(self.names.values())).count}, and "
                                     f"its pieces of file {index}'s tensors (such as {quoted(held[0])}) are not in "
                                     "the others; copy the whole save folder again")

    def _read_headers(self) -> dict[str, list[Piece]]:
        pieces: dict[str, list[Piece]] = {}
        for file in self.files:
            try:
                descriptor = os.open(file, os.O_RDONLY)
            except OSError as error:
                raise CogExportError(f"cannot read {file}: {error.strerror}") from None
            self._descriptors[file], self._read[file] = descriptor, 0
            entries, metadata = read_header(file, descriptor)
            offsets = sharding_info(file, metadata, entries)
            for name, (dtype, shape, start) in entries.items():
                pieces.setdefault(name, []).append(Piece(file, offsets[name], tuple(shape), dtype, start))
        return pieces

    def _lazy(self, name: str, pieces: list[Piece]) -> LazyTensor:
        where = f"tensor {quoted(name)} of the Hugging Face writer save {self.folder}"
        first = pieces[0]
        other = next((p for p in pieces if (p.dtype, len(p.sizes)) != (first.dtype, len(first.sizes))), None)
        if other is not None:
            raise CogExportError(f"{where}: {first.file.name} holds a {len(first.sizes)}-d {first.dtype} piece, "
                                 f"{other.file.name} a {len(other.sizes)}-d {other.dtype} one; the files are not of "
                                 "one save")
        # the writer records no full shape: like torch's reader, take where the pieces end
        shape = torch.Size(max(p.offsets[d] + p.sizes[d] for p in pieces) for d in range(len(first.sizes)))
        filled = [p for p in pieces if p.numel]
        overlap = overlapping_pair([(p.offsets, p.sizes) for p in filled])
        if overlap:
            one, two = (filled[i] for i in overlap)
            raise CogExportError(f"{where}: {one.describe()} and {two.describe()} overlap (a rank file copied "
                                 "over another's, or damaged); copy the save folder again")
        held = sum(p.numel for p in filled)
        if held != shape.numel():
            missing = self._missing_files()
            hint = f"; {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing" if missing else \
                "; a rank file is missing, damaged or of another save"
            raise CogExportError(f"{where}: its pieces hold {held} of the {shape.numel()} elements of the shape "
                                 f"{list(shape)} they reach{hint}; copy the save folder again")
        return LazyTensor(shape, first.dtype, lambda: self._assemble(shape, first.dtype, filled),
                          f"{name} (pieces in {len(filled)} rank files of {self.folder.name})",
                          _row_block_ranges(shape, filled))

    # -- reading ------------------------------------------------------------------------------------------------
    def _assemble(self, shape: torch.Size, dtype: torch.dtype, pieces: list[Piece]) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype)
        for piece in pieces:
            place = out[piece.box()]
            target = place if place.is_contiguous() else torch.empty(piece.sizes, dtype=piece.dtype)
            try:
                pread_into(self._descriptors[piece.file], tensor_buffer(target), piece.start)
            except (OSError, EOFError) as error:
                raise CogExportError(f"cannot read {piece.file}: {error}") from None
            if target is not place:
                place.copy_(target)
            self._read[piece.file] += target.nbytes
        return out

    def bytes_read(self) -> dict[str, int]:
        return {str(path): count for path, count in self._read.items()}

    def own_folders(self) -> list[Path]:
        return [self.folder]

    def close(self) -> None:
        for descriptor in self._descriptors.values():
            os.close(descriptor)
        self._descriptors.clear()



def _row_block_ranges(shape: torch.Size, pieces: list[Piece]) -> ByteRanges | None:
    """Where a tensor cut into blocks of whole rows (FSDP's dim-0 shards) lies, piece after piece; None for any
    other cut."""
    order = row_block_order(shape, [(piece.offsets, piece.sizes) for piece in pieces])
    if order is None:
        return None
    return joined_ranges([ByteRange(str(pieces[i].file), pieces[i].start, pieces[i].numel * pieces[i].dtype.itemsize)
                          for i in order])


def _ends_in_an_empty_piece(pieces: list[Piece]) -> bool:
    """Whether a tensor has fewer rows than ranks: the ranks past its end hold empty pieces there, copies of one
    another of which the writer keeps one, so a rank may have written nothing of it."""
    if not pieces[0].sizes:
        return False
    rows = max(p.offsets[0] + p.sizes[0] for p in pieces)
    return any(not p.numel and p.offsets[0] == rows for p in pieces)


def _dtypes(checkpoint: LazyCheckpoint) -> str:
    return ", ".join(sorted({DTYPE_NAMES.get(t.dtype, str(t.dtype)) for t in checkpoint.values()})) or "no tensors"


class HfConsolidatedCheckpoint(SafetensorsCheckpoint):
    """A consolidated Hugging Face writer save: the whole tensors of ``model-K-of-N.safetensors`` through
    ``model.safetensors.index.json``. The per-rank files it was made from (``sharded/``) are the same save in pieces:
    their headers are compared with the consolidated ones (names, shapes, dtypes) and their data is never read."""

    def __init__(self, folder: Path) -> None:
        super().__init__(Path(folder))
        self.folder = Path(folder)
        self.info.format = "hf-storage"
        self.info.facts = HfWriterFacts(writer="torch.distributed.checkpoint HuggingFaceStorageWriter (consolidated)",
                                        metadata=self.header.metadata)
        self.info.weights_source = f"model weights as saved ({_dtypes(self)}, consolidated)"
        leftover = consolidated_leftover(self.folder)
        if leftover is not None:
            try:
                self._check_same_save(leftover)
            except BaseException:
                self.close()
                raise

    def _check_same_save(self, leftover: Path) -> None:
        try:
            with HfShardedCheckpoint(leftover) as pieces:
                theirs = {name: (tensor.shape, tensor.dtype) for name, tensor in pieces.items()}
        except CogExportError as error:
            self.info.notes.append(f"read the consolidated files; the per-rank files in {leftover} (not needed) "
                                   f"do not open: {error}")
            return
        ours = {name: (tensor.shape, tensor.dtype) for name, tensor in self.items()}
        if theirs != ours:
            differ = sorted(set(ours) ^ set(theirs)) or [name for name in ours if ours[name] != theirs[name]]
            raise CogExportError(f"{self.folder} holds a consolidated model and per-rank files in {leftover.name}/ "
                                 f"that are not the same save ({quoted(differ[0])} differs): point at "
                                 f"{self.folder / INDEX} or at {leftover}")
        self.info.notes.append(f"read the consolidated files; the per-rank files in {leftover.name}/ are the same "
                               "save (same tensors, shapes and dtypes) and were not read")

    def own_folders(self) -> list[Path]:
        return [self.folder]
