"""Boxes of a tensor saved in pieces (DCP chunks, the Hugging Face writer's per-rank pieces): whether any two overlap.

A piece is ``tensor[o0:o0 + s0, o1:o1 + s1, ...]``; a sharded save is whole only when its non-empty pieces lie inside
the tensor, overlap nowhere and together hold every element. The readers check the first and last themselves (they
word what is wrong in their own terms); the overlap search is the part worth sharing.
"""

from __future__ import annotations

from typing import Sequence

Box = tuple[Sequence[int], Sequence[int]]  # (offsets, sizes)


def boxes_overlap(first: Box, second: Box) -> bool:
    """Whether two non-empty boxes share an element (a scalar's box, with no dims, is its one element)."""
    return all(o1 < o2 + s2 and o2 < o1 + s1 for o1, s1, o2, s2 in zip(first[0], first[1], second[0], second[1]))


def overlapping_pair(boxes: Sequence[Box]) -> tuple[int, int] | None:
    """The positions of two overlapping non-empty boxes (leave empty ones out), or None. Boxes are swept in order
    along dim 0, each compared only with the boxes that start before it ends there (FSDP's row pieces: one
    comparison each)."""
    order = sorted(range(len(boxes)), key=lambda i: tuple(boxes[i][0]))
    for position, index in enumerate(order):
        offsets, sizes = boxes[index]
        for other in order[position + 1:]:
            if offsets and boxes[other][0][0] >= offsets[0] + sizes[0]:
                break
            if boxes_overlap(boxes[index], boxes[other]):
                return index, other
    return None


def row_block_order(shape: Sequence[int], boxes: Sequence[Box]) -> list[int] | None:
    """The positions of ``boxes`` in the order that lays them end to end as the tensor's bytes, when each is a
    block of whole rows (all of every dim after the first: FSDP's and ZeRO's dim-0 shards, which are contiguous
    in the whole tensor); None when any is not. The boxes must already be known to tile the tensor exactly."""
    if not shape:
        return list(range(len(boxes))) if len(boxes) == 1 else None
    rest = tuple(shape[1:])
    if any(tuple(sizes[1:]) != rest or any(offsets[1:]) for offsets, sizes in boxes):
        return None
    return sorted(range(len(boxes)), key=lambda i: boxes[i][0][0])
