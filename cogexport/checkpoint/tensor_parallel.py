"""Tensor-parallel DeepSpeed checkpoints (AutoTP): joining each model-parallel rank's share of a tensor into the whole.

A run with ``tensor_parallel.autotp_size`` > 1 saves one ordinary ZeRO checkpoint per model-parallel (TP) rank
(``..._mp_rank_<tp>_...`` files), each holding that rank's share of every parameter. Rank 0's model states record
how the shares make the whole, under ``universal_checkpoint_info``:

- ``affine_map.params``: per parameter (a regex of its name), its ``logical_shape`` and, per TP rank, its
  ``shard_shape`` and ``pieces``: blocks given as (offset, strides) views of the whole tensor (``source``) and of the
  rank's share (``dest``), the ranks holding each block (``locations``: several for a replicated block) and the
  factor the share holds it by (``scale``).
- for parameters without a map (older saves): ``tp_replicated_parameter_patterns`` (whole on every rank),
  ``parameter_with_row_parallelism_patterns`` (split on dim 1); any other is split on dim 0 (column-parallel).

A joined tensor is read one share at a time into the whole; every element must be written once, and a block that
several ranks hold must be equal on all of them (the copies of a replicated parameter drift apart when the training
code lets them: that is refused, never averaged or picked).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..errors import CogExportError, quoted
from ..lazy import LazyTensor

INFO_KEY = "universal_checkpoint_info"
# universal_checkpoint_info entries that describe layouts cogexport does not join: refused by name when they apply.
_UNSUPPORTED = ("vocabulary_parameter_patterns", "parameter_with_sub_params", "parameter_to_average_patterns",
                "parameter_with_2_sub_params_cat_dim_0")


@dataclass(frozen=True)
class Piece:
    """A block of the whole tensor and where one rank's share holds it (torch.as_strided arguments on both sides)."""

    shape: tuple[int, ...]
    source: tuple[int, tuple[int, ...]]
    dest: tuple[int, tuple[int, ...]]
    locations: frozenset[int]
    scale: float = 1.0

    @property
    def numel(self) -> int:
        return torch.Size(self.shape).numel()

    def fits(self, side: tuple[int, tuple[int, ...]], numel: int) -> bool:
        offset, strides = side
        if len(strides) != len(self.shape) or offset < 0 or any(stride < 0 for stride in strides):
            return False
        return self.numel == 0 or offset + sum((size - 1) * stride for size, stride in zip(self.shape, strides)) < numel


@dataclass(frozen=True)
class ShardMap:
    """How one tensor is spread over the TP ranks."""

    logical_shape: torch.Size
    shard_shapes: dict[int, torch.Size]
    pieces: dict[int, list[Piece]]


def _piece(entry: dict) -> Piece:
    (source_offset, source_strides), (dest_offset, dest_strides) = entry["source"], entry["dest"]
    return Piece(tuple(int(d) for d in entry["shape"]), (int(source_offset), tuple(int(s) for s in source_strides)),
                 (int(dest_offset), tuple(int(s) for s in dest_strides)),
                 frozenset(int(r) for r in entry["locations"]), float(entry.get("scale", 1.0)))


def _shard_map(entry: dict) -> ShardMap:
    ranks = entry["ranks"]
    return ShardMap(torch.Size(int(d) for d in entry["logical_shape"]),
                    {int(rank): torch.Size(int(d) for d in value["shard_shape"]) for rank, value in ranks.items()},
                    {int(rank): [_piece(piece) for piece in value["pieces"]] for rank, value in ranks.items()})


def _split_map(shapes: Sequence[torch.Size], dim: int) -> ShardMap:
    """Each rank's share one contiguous block of the whole along ``dim`` (rank order)."""
    whole = list(shapes[0])
    whole[dim] = sum(shape[dim] for shape in shapes)
    logical = torch.Size(whole)
    strides = _row_major(logical)
    pieces, start = {}, 0
    for rank, shape in enumerate(shapes):
        pieces[rank] = [Piece(tuple(shape), (start * strides[dim], strides), (0, _row_major(shape)),
                              frozenset({rank}))]
        start += shape[dim]
    return ShardMap(logical, dict(enumerate(shapes)), pieces)


def _replicated_map(shape: torch.Size, tp: int) -> ShardMap:
    piece = Piece(tuple(shape), (0, _row_major(shape)), (0, _row_major(shape)), frozenset(range(tp)))
    return ShardMap(shape, {rank: shape for rank in range(tp)}, {rank: [piece] for rank in range(tp)})


def _row_major(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class TensorParallelLayout:
    """What rank 0's model states say of the TP layout, and each tensor's map from it."""

    def __init__(self, info: Any, tp: int, where: str) -> None:
        self.tp, self.where = tp, where
        if not isinstance(info, dict):
            raise CogExportError(f"{where} is from a tensor-parallel run ({tp} model-parallel ranks) but records no "
                                 f"{INFO_KEY} saying how each rank's share makes the whole tensor (saved by an "
                                 "older DeepSpeed?); cogexport cannot join the shares")
        self.info = info
        maps = (info.get("affine_map") or {}).get("params") or {}
        try:
            self.maps = [(re.compile(pattern), _shard_map(entry)) for pattern, entry in maps.items()]
        except (KeyError, TypeError, ValueError, re.error) as error:
            raise CogExportError(f"{where}: {INFO_KEY}'s affine_map is damaged ({type(error).__name__}: {error}); "
                                 "cannot tell how the tensor-parallel shares join") from None

    def _patterns(self, key: str) -> list[str]:
        value = self.info.get(key) or []  # a list of patterns, or a dict keyed by them (the unsupported ones)
        return list(value) if isinstance(value, (list, tuple, dict)) else []

    def _matches(self, key: str, name: str) -> bool:
        patterns = self._patterns(key)
        if key == "parameter_with_sub_params":
            patterns = [p for entry in patterns if isinstance(entry, dict) for p in entry.get("patterns", [])]
        return any(re.match(pattern, name) for pattern in patterns if isinstance(pattern, str))

    def map_of(self, name: str, shapes: Sequence[torch.Size], parameter: bool) -> ShardMap:
        """The map of ``name``, whose shares have ``shapes`` (one per TP rank), checked against them."""
        found = [shard_map for pattern, shard_map in self.maps if pattern.match(name)]
        if len(found) > 1:
            raise CogExportError(f"{self.where}: {len(found)} affine maps of {INFO_KEY} match {quoted(name)}; cannot "
                                 "tell how its tensor-parallel shares join")
        unsupported = self._patterns("autotp_unsupported_parameter_patterns")
        if not found and any(re.match(pattern, name) for pattern in unsupported if isinstance(pattern, str)):
            raise CogExportError(f"{self.where}: DeepSpeed recorded {quoted(name)} as a tensor-parallel layout it "
                                 "cannot describe (autotp_unsupported_parameter_patterns); cogexport cannot join it")
        if found:
            shard_map = found[0]
        elif not parameter or self._matches("tp_replicated_parameter_patterns", name):
            shard_map = _replicated_map(shapes[0], self.tp)
        elif any(self._matches(key, name) for key in _UNSUPPORTED):
            raise CogExportError(f"{self.where}: {quoted(name)} is a tensor-parallel layout cogexport does not join "
                                 "without an affine map (vocabulary padding, fused sub-parameters or averaging)")
        else:
            dim = 1 if self._matches("parameter_with_row_parallelism_patterns", name) else 0
            if any(len(shape) <= dim for shape in shapes):
                raise CogExportError(f"{self.where}: {quoted(name)} has no dim {dim} to join its shares on")
            shard_map = _split_map(shapes, dim)
        self._check(name, shard_map, shapes)
        return shard_map

    def _check(self, name: str, shard_map: ShardMap, shapes: Sequence[torch.Size]) -> None:
        """Before any data is read: the map covers exactly the shares there are, in their shapes, and its pieces
        stay inside the whole tensor and the shares and add up to both."""
        def damaged(why: str) -> CogExportError:
            return CogExportError(f"{self.where}: the affine map of {quoted(name)} in {INFO_KEY} {why}; cannot join "
                                  "its tensor-parallel shares (the model states are damaged or from another run)")

        if set(shard_map.shard_shapes) != set(range(self.tp)) or set(shard_map.pieces) != set(range(self.tp)):
            raise damaged(f"names ranks {sorted(shard_map.shard_shapes)}, the run has {self.tp}")
        whole, unique = shard_map.logical_shape.numel(), set()
        for rank, shape in enumerate(shapes):
            if shard_map.shard_shapes[rank] != shape:
                raise damaged(f"gives rank {rank} a share of {tuple(shard_map.shard_shapes[rank])}; its files hold "
                              f"{tuple(shape)}")
            pieces = shard_map.pieces[rank]
            if sum(piece.numel for piece in pieces) != shape.numel():
                raise damaged(f"accounts for {sum(p.numel for p in pieces)} elements of rank {rank}'s {shape.numel()}")
            for piece in pieces:
                if rank not in piece.locations or not piece.fits(piece.source, whole) or \
                        not piece.fits(piece.dest, shape.numel()) or piece.scale == 0:
                    raise damaged(f"has a piece of rank {rank} outside the tensor or its share ({piece})")
                unique.add((piece.shape, piece.source))
        if sum(torch.Size(shape).numel() for shape, _ in unique) != whole:
            raise damaged(f"covers {sum(torch.Size(s).numel() for s, _ in unique)} elements of {whole}")


def joined(name: str, shard_map: ShardMap, shares: Sequence[LazyTensor], files: Callable[[int], str],
           scaled: bool = True) -> LazyTensor:
    """The whole tensor ``name``, read from its shares (one at a time) when loaded. ``scaled=False`` (an optimizer
    state) refuses a map whose shares hold a block scaled: the state would need the optimizer's own rescaling."""
    dtype = shares[0].dtype
    tp = len(shares)
    if not scaled and any(piece.scale != 1.0 for pieces in shard_map.pieces.values() for piece in pieces):
        raise CogExportError(f"{name}: its shares hold a block scaled (a pre-divided replicated bias); an optimizer "
                             "state through that scale is not the state of the whole parameter, so cogexport does "
                             "not write one (DeepSpeed's converter refuses it too)")

    def load() -> torch.Tensor:
        whole = torch.empty(shard_map.logical_shape.numel(), dtype=dtype)
        written = torch.zeros(whole.numel(), dtype=torch.bool)
        for rank in range(tp):
            if not shard_map.pieces[rank]:
                continue
            share = shares[rank].load().contiguous().view(-1)
            for piece in shard_map.pieces[rank]:
                _place(name, piece, rank, share, whole, written, files)
        if not bool(written.all()):
            raise CogExportError(f"{name}: its tensor-parallel shares leave {int((~written).sum())} elements unset; "
                                 f"the affine map in {files(0)} is damaged")
        return whole.view(shard_map.logical_shape)

    origin = f"{shares[0].origin}, joined over {tp} tensor-parallel ranks"
    return LazyTensor(shard_map.logical_shape, dtype, load, origin)


def _place(name: str, piece: Piece, rank: int, share: torch.Tensor, whole: torch.Tensor, written: torch.Tensor,
           files: Callable[[int], str]) -> None:
    values = share.as_strided(piece.shape, piece.dest[1], piece.dest[0])
    if piece.scale != 1.0:
        values = values / piece.scale  # the share holds the block times scale (a pre-divided replicated bias)
    target = whole.as_strided(piece.shape, piece.source[1], piece.source[0])
    seen = written.as_strided(piece.shape, piece.source[1], piece.source[0])
    if piece.numel and bool(seen.all()) and len(piece.locations) > 1:
        if not torch.equal(target, values):
            first = min(piece.locations)
            raise CogExportError(
                f"{name} is held whole by every tensor-parallel rank, but ranks {first} and {rank} ({files(first)}, "
                f"{files(rank)} and their optimizer files) hold different values: the copies were trained apart (a "
                "parameter applied to each rank's share of the activations, such as a per-head norm, needs its "
                "gradient summed over the TP group: AutoTP's grad_allreduce) or the files are from different saves; "
                "cogexport will not pick one copy")
        return
    if bool(seen.any()):
        raise CogExportError(f"{name}: two pieces of its affine map write the same elements; the map in "
                             f"{files(0)} is damaged")
    target.copy_(values)
    seen.fill_(True)
