"""The operations a key-map table is made of, each with an exact inverse.

One general operation covers every renaming: split each source tensor into equal chunks along ``dim``, then
build each target by concatenating chosen chunks. A rename is one source in one chunk to one target; a chunk
(qkv into q, k, v) is one source in k chunks to k targets; its inverse concatenates; a regroup (the 12-chunk
adaLN into norm1/norm2) is any arrangement in between. Every chunk is used exactly once, so the inverse is
always defined. A grouped regroup lays that arrangement out in every one of ``groups`` equal consecutive parts of each
tensor (a fused qkv interleaved per head: [h0: q k v, h1: q k v, ...]), the count read from the target config, and its
inverse is the grouped inverse. A re-index maps a placeholder value v to count-1-v (its own inverse); a reshape renames one
tensor into another view of the same elements (Wan Animate's leaky-ReLU biases [1, C, 1, 1] <-> [C]); a drop
discards a source key for a stated reason.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import threading
from dataclasses import dataclass, replace
from typing import Mapping

import torch

from ..lazy import ByteRanges, LazyTensor, joined_ranges, slice_ranges
from ..tensor_bytes import read_ranges
from .pattern import KeyPattern


class RuleError(ValueError):
    """A rule cannot be applied to these tensors (wrong sizes, out-of-range index)."""


@dataclass(frozen=True)
class Regroup:
    kind: str  # how the table wrote it: rename, chunk, regroup or reindex (for messages)
    sources: tuple[KeyPattern, ...]
    source_chunks: tuple[int, ...]
    targets: tuple[KeyPattern, ...]
    target_chunks: tuple[tuple[int, ...], ...]  # indices into the concatenated chunks of all sources
    dim: int = 0
    reverse_index: tuple[tuple[str, str], ...] = ()  # (placeholder, count name): value -> count - 1 - value
    optional_reason: str | None = None  # produce only if the target model has the key, else drop for this reason
    value_maps: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()  # (placeholder, (source, target) pairs)
    # a reshape: (the source's view, the target's view), -1 standing for the one size the element count decides
    views: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # the count name of the groups the arrangement repeats in (each tensor is that many equal consecutive parts along
    # dim, and the chunks are laid out within each part), read from the target config; None: one group
    groups: str | None = None

    def __post_init__(self) -> None:
        total = sum(self.source_chunks)
        used = sorted(i for chunk_list in self.target_chunks for i in chunk_list)
        if used != list(range(total)):
            raise ValueError(f"{self.describe()}: every source chunk must be used exactly once")
        names = {frozenset(p.names) for p in self.sources} | {frozenset(p.names) for p in self.targets}
        if len(names) != 1:
            raise ValueError(f"{self.describe()}: all its keys must use the same placeholders")
        for placeholder, _ in self.reverse_index:
            if placeholder not in self.sources[0].names:
                raise ValueError(f"{self.describe()}: re-indexed placeholder {{{placeholder}}} is not in its keys")
        if self.views is not None and (len(self.sources) != 1 or len(self.targets) != 1 or
                                       any(list(view).count(-1) > 1 for view in self.views)):
            raise ValueError(f"{self.describe()}: a reshape has one source, one target and at most one -1 per view")

    def describe(self) -> str:
        return f"{self.kind} {self.sources[0].text!r}"

    # -- direction ------------------------------------------------------------------------------------------
    def inverse(self) -> "Regroup":
        order = [i for chunk_list in self.target_chunks for i in chunk_list]
        position = {chunk: index for index, chunk in enumerate(order)}
        offsets = [sum(self.source_chunks[:j]) for j in range(len(self.sources))]
        back = tuple(tuple(position[offsets[j] + m] for m in range(count))
                     for j, count in enumerate(self.source_chunks))
        flipped = tuple((name, tuple((b, a) for a, b in pairs)) for name, pairs in self.value_maps)
        views = None if self.views is None else (self.views[1], self.views[0])
        return Regroup(self.kind, self.targets, tuple(len(c) for c in self.target_chunks), self.sources, back, self.dim,
                       self.reverse_index, self.optional_reason, flipped, views, self.groups)

    # -- groups ---------------------------------------------------------------------------------------------------
    def laid_out(self, counts: Mapping[str, int]) -> "Regroup":
        """The rule with its groups spelled out as plain chunks, the group count read from ``counts``."""
        if self.groups is None:
            return self
        count = counts.get(self.groups)
        if not isinstance(count, int) or count <= 0:
            raise RuleError(f"{self.describe()} needs '{self.groups}', which the target model does not define")
        return self.in_groups(count)

    def in_groups(self, count: int) -> "Regroup":
        """The arrangement repeated in ``count`` groups: source j's chunk m of group g is chunk g * chunks_j + m of
        that source, and each target takes its chunks from group 0, then group 1, ..."""
        offsets = [sum(self.source_chunks[:j]) for j in range(len(self.sources))]
        owner = [(j, m) for j, chunks in enumerate(self.source_chunks) for m in range(chunks)]

        def spread(index: int, group: int) -> int:
            j, m = owner[index]
            return offsets[j] * count + group * self.source_chunks[j] + m

        targets = tuple(tuple(spread(index, group) for group in range(count) for index in chunk_list)
                        for chunk_list in self.target_chunks)
        return replace(self, source_chunks=tuple(chunks * count for chunks in self.source_chunks),
                       target_chunks=targets, groups=None)

    # -- application ----------------------------------------------------------------------------------------
    def target_values(self, values: Mapping[str, str], counts: Mapping[str, int]) -> dict[str, str]:
        mapped = dict(values)
        for placeholder, pairs in self.value_maps:
            mapped[placeholder] = dict(pairs)[values[placeholder]]
        for placeholder, count_name in self.reverse_index:
            if count_name not in counts:
                raise RuleError(f"{self.describe()} needs '{count_name}', which the target model does not define")
            index, count = int(values[placeholder]), counts[count_name]
            if not 0 <= index < count:
                raise RuleError(f"{self.sources[0].format(values)}: index {index} is out of range for "
                                f"{count_name}={count}")
            mapped[placeholder] = str(count - 1 - index)
        return mapped

    def reshaped(self, shape: torch.Size, key: str) -> torch.Size:
        """The target view of a source of this shape (a reshape rule); the source must fit the source view."""
        source, target = self.views
        if len(shape) != len(source) or any(want not in (-1, have) for want, have in zip(source, shape)):
            raise RuleError(f"{key} {tuple(shape)} is not of the shape {list(source)} that {self.describe()} reads")
        known = 1
        for size in target:
            known *= size if size != -1 else 1
        if shape.numel() % known:
            raise RuleError(f"{key} {tuple(shape)} cannot be viewed as {list(target)}")
        return torch.Size(size if size != -1 else shape.numel() // known for size in target)

    def output_shapes(self, shapes: list[torch.Size], keys: list[str]) -> list[torch.Size]:
        if self.views is not None:
            return [self.reshaped(shapes[0], keys[0])]
        if self.source_chunks == (1,) and self.target_chunks == ((0,),):
            return list(shapes)  # a plain rename takes any shape, 0-dim scalars too (LTX's timestep_scale_multiplier)
        pieces: list[torch.Size] = []
        for shape, count, key in zip(shapes, self.source_chunks, keys):
            if len(shape) <= self.dim or shape[self.dim] % count:
                raise RuleError(f"{key} {tuple(shape)} cannot be split into {count} equal parts along dim {self.dim}")
            pieces += [torch.Size((*shape[:self.dim], shape[self.dim] // count, *shape[self.dim + 1:]))] * count
        outputs = []
        for chunk_list in self.target_chunks:
            first = pieces[chunk_list[0]]
            if any(len(pieces[i]) != len(first) or any(a != b for d, (a, b) in enumerate(zip(pieces[i], first))
                                                           if d != self.dim) for i in chunk_list):
                raise RuleError(f"{self.describe()}: the parts of {', '.join(keys)} do not fit together")
            size = sum(pieces[i][self.dim] for i in chunk_list)
            outputs.append(torch.Size((*first[:self.dim], size, *first[self.dim + 1:])))
        return outputs

    def build(self, inputs: list[LazyTensor], keys: list[str], wanted: list[int]) -> dict[int, LazyTensor]:
        """Lazy outputs (by target index) for these lazy inputs; outputs share one load of the inputs."""
        dtypes = {tensor.dtype for tensor in inputs}
        if len(dtypes) != 1:
            raise RuleError(f"{', '.join(keys)} have different dtypes; they cannot be combined")
        shapes = self.output_shapes([t.shape for t in inputs], keys)
        if self.views is not None:  # another view of the same elements, bit for bit: the same bytes
            source = inputs[0]
            return {index: LazyTensor(shapes[0], source.dtype, lambda: source.load().reshape(shapes[0]),
                                      f"{self.kind} of {keys[0]}", find_source=source.byte_ranges) for index in wanted}
        if len(inputs) == 1 and self.source_chunks == (1,):  # a plain rename: hand the input through untouched
            return {index: inputs[0] for index in wanted}
        shared = _SharedChunks(inputs, self.source_chunks, self.dim, len(wanted))
        ranged = _ChunkRanges(inputs, self.source_chunks) if _chunks_are_byte_runs(inputs, self.dim) else None
        origin = f"{self.kind} of {', '.join(keys)}"
        dtype = dtypes.pop()
        return {index: _chunk_tensor(shapes[index], dtype, self.target_chunks[index], shared, ranged, origin)
                for index in wanted}


def _chunks_are_byte_runs(inputs: list[LazyTensor], dim: int) -> bool:
    """Whether every chunk along ``dim`` is one run of its input's bytes (C order): nothing varies before ``dim``."""
    return all(len(tensor.shape) > dim and math.prod(tensor.shape[:dim]) == 1 for tensor in inputs)


def _chunk_tensor(shape: torch.Size, dtype: torch.dtype, chunk_list: tuple[int, ...], shared: "_SharedChunks",
                  ranged: "_ChunkRanges | None", origin: str) -> LazyTensor:
    """One output of a split or join. Where its chunks are byte runs of inputs that lie in files as they are, it is
    those bytes: copied file to file by a writer, or read alone; else it is cut from the inputs loaded once."""
    if ranged is None:
        return LazyTensor(shape, dtype, lambda: shared.take(chunk_list), origin)

    def load() -> torch.Tensor:
        ranges = ranged.of(chunk_list)
        return read_ranges(ranges, shape, dtype) if ranges is not None else shared.take(chunk_list)

    return LazyTensor(shape, dtype, load, origin, find_source=lambda: ranged.of(chunk_list))


class _ChunkRanges:
    """Where each chunk of a rule's inputs lies in the input files, when each is a run of its input's bytes and the
    inputs lie in files as they are (``LazyTensor.byte_ranges``, asked once, for all the rule's outputs)."""

    def __init__(self, inputs: list[LazyTensor], chunks: tuple[int, ...]) -> None:
        self._inputs, self._chunks = inputs, chunks
        self._table: list[tuple[ByteRanges, int, int]] | None = None  # per chunk: its input's ranges, start, length
        self._asked = False
        self._lock = threading.Lock()

    def of(self, chunk_list: tuple[int, ...]) -> ByteRanges | None:
        """The byte ranges of these chunks end to end, or None if an input's bytes are not in a file as they are."""
        with self._lock:
            if not self._asked:
                self._table, self._asked = self._chunk_table(), True
        if self._table is None:
            return None
        return joined_ranges([part for index in chunk_list for part in slice_ranges(*self._table[index])])

    def _chunk_table(self) -> list[tuple[ByteRanges, int, int]] | None:
        table = []  # the chunks of all inputs, in order
        for tensor, count in zip(self._inputs, self._chunks):
            found = tensor.byte_ranges()
            if found is None:
                return None
            size = tensor.nbytes // count
            table += [(found, piece * size, size) for piece in range(count)]
        return table


class _SharedChunks:
    """Loads a rule's inputs once for all its outputs, and lets them go when the last output has been made."""

    def __init__(self, inputs: list[LazyTensor], chunks: tuple[int, ...], dim: int, consumers: int) -> None:
        self._inputs, self._chunks, self._dim, self._consumers = inputs, chunks, dim, consumers
        self._parts: list[torch.Tensor] | None = None
        self._served = 0
        self._lock = threading.Lock()

    def take(self, chunk_list: tuple[int, ...]) -> torch.Tensor:
        with self._lock:
            if self._parts is None:
                self._parts = [part for tensor, count in zip(self._inputs, self._chunks)
                               for part in torch.chunk(tensor.load(), count, dim=self._dim)]
            selected = [self._parts[i] for i in chunk_list]
            result = selected[0].contiguous() if len(selected) == 1 else torch.cat(selected, dim=self._dim)
            self._served += 1
            if self._served >= self._consumers:
                self._parts, self._served = None, 0
            return result


@dataclass(frozen=True)
class Drop:
    """Source keys that are deliberately not exported, with the reason shown to the user. With ``keep``, tensors the
    target class has no place for are kept as they are in that file beside the model (so the way back writes them
    again)."""

    reason: str
    pattern: KeyPattern | None = None
    glob: str | None = None
    keep: str | None = None

    def matches(self, key: str) -> bool:
        if self.pattern is not None:
            return self.pattern.match(key) is not None
        return fnmatch.fnmatchcase(key, self.glob)

    def describe(self) -> str:
        return f"drop {(self.pattern.text if self.pattern else self.glob)!r}"

    def names(self) -> list[str]:
        """The keys it names, for messages: each alternative spelled out where its placeholders are lists."""
        if self.pattern is None:
            return [self.glob]
        kinds = [self.pattern.kinds[name] for name in self.pattern.names]
        if not all(isinstance(kind, list) for kind in kinds):
            return [self.pattern.text]
        return [self.pattern.format(dict(zip(self.pattern.names, values))) for values in itertools.product(*kinds)]
