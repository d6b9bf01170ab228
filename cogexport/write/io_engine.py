"""Reading ahead while writing: the tensors a writer will write next are loaded (read, CRC-checked, cast) by worker
threads while it writes the earlier ones, within a budget of bytes held.

A writer walks its files in order and takes each tensor's data from a ``TensorFeed`` as a payload: either the loaded
tensor, or, for a tensor whose bytes lie in input files exactly as they are written (``LazyTensor.source``), those
byte ranges, which the writer copies file to file without loading it (byte_copy.py). Reads (``pread``), CRC-32s
(ISA-L) and casts release the GIL, so the threads overlap for real. The feed hands payloads over in the writer's
order, so every file is written exactly as one thread writing in turn would write it.

Memory: the tensors loaded and not yet written never hold more than ``budget`` bytes together (one tensor may
exceed it alone: it is then loaded by itself), on top of what a loader holds while it works (a cast's source).
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

import torch

from ..lazy import ByteRanges, LazyTensor

Payload = Union[torch.Tensor, ByteRanges]
MAX_DEFAULT_WORKERS = 8
MIN_BUDGET, MAX_BUDGET = 64 << 20, 1 << 30
_LOOKAHEAD = 64  # tensors queued ahead at most, however small


def default_workers(writer_core: bool = True) -> int:
    """One worker per core this process may run on but the one its writer needs (``writer_core``), shared with the
    other processes of a job on this machine. On 2 cores that is one (serial): a second loader beside the writer
    made consolidations 1.4-1.5x slower there (the scaling tables of scripts/benchmark_consolidate.py and
    benchmark_dcp.py). Loads that compute far longer than their bytes take to write (quantizing to GGUF) leave the
    writer no core of its own."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)  # torchrun's processes on this node
    return max(1, min(MAX_DEFAULT_WORKERS, cores // max(1, local_processes) - (1 if writer_core else 0)))


def default_budget(total_bytes: int) -> int:
    """A sixty-fourth of what is written, within 64 MB .. 1 GB: a few tensors ahead, far under the model's size
    (a universal checkpoint writes 3.5x the fp32 model: a sixteenth of it took the peak to 0.31x the model)."""
    return max(MIN_BUDGET, min(MAX_BUDGET, total_bytes // 64))


@dataclass(frozen=True)
class IOSettings:
    """How a write runs: ``workers`` threads loading ahead (1: one thread reads, casts and writes in turn),
    ``budget`` bytes loaded ahead at most (None: ``default_budget`` of the write), and whether byte ranges are
    copied file to file (``copy_ranges``; off, every tensor is loaded, as before there were kernel copies)."""

    workers: int | None = 1
    budget: int | None = None
    copy_ranges: bool = True

    def resolved_workers(self) -> int:
        return default_workers() if self.workers is None else max(1, self.workers)


SERIAL = IOSettings()


def _settle_torch_thread_pool() -> None:
    """Let this thread, alone, (re)make torch's intra-op thread pool before the workers start. In a process forked
    from one that had used it, the first torch operation of each thread remakes the pool, and two threads doing it
    at once can see none: "pool INTERNAL ASSERT FAILED ... Invalid thread pool!" (seen in the fuzz harness's forked
    children)."""
    torch.set_num_threads(torch.get_num_threads())


class TensorFeed:
    """The payloads of ``tensors``, in order; with several workers, loaded ahead in threads. Use as a context
    manager: leaving it (an error in the writer included) cancels what is queued and waits for what is running."""

    def __init__(self, tensors: Sequence[LazyTensor], settings: IOSettings = SERIAL) -> None:
        self._tensors = list(tensors)
        self._copy = settings.copy_ranges
        workers = settings.resolved_workers()
        total = sum(tensor.nbytes for tensor in self._tensors)
        self._budget = settings.budget if settings.budget is not None else default_budget(total)
        if workers > 1:
            _settle_torch_thread_pool()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="cogexport-load") if workers > 1 else None
        self._queued: deque[tuple[int, Future]] = deque()
        self._held = 0  # bytes of the tensors queued, loading or loaded, not yet handed over and written
        self._next = 0  # the next tensor to queue
        self._sources: dict[int, ByteRanges | None] = {}  # tensors looked at ahead: copied from these, or loaded

    def __enter__(self) -> "TensorFeed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._queued.clear()

    def __len__(self) -> int:
        return len(self._tensors)

    def _copied_from(self, index: int) -> ByteRanges | None:
        """The byte ranges tensor ``index`` is copied from, or None if it is loaded (asked of the reader once)."""
        if not self._copy:
            return None
        if index not in self._sources:
            self._sources[index] = self._tensors[index].byte_ranges()
        return self._sources[index]

    def __iter__(self) -> Iterator[Payload]:
        for index, tensor in enumerate(self._tensors):
            self._sources.pop(index - 1, None)  # nothing looks behind the tensor being handed over
            source = self._copied_from(index)
            if source is not None:
                yield source
            elif self._pool is None:
                yield tensor.load()
            else:
                loaded = self._take(index)
                yield loaded
                del loaded
                self._held -= tensor.nbytes  # written (the writer asked for the next payload)

    def _take(self, index: int) -> torch.Tensor:
        self._queue_ahead(index)
        queued_index, future = self._queued.popleft()
        assert queued_index == index, "tensors are handed over in order"
        result = future.result()
        self._queue_ahead(index + 1)
        return result

    def _queue_ahead(self, index: int) -> None:
        """Queue loads from ``index`` on while they fit in the budget (the first one always does)."""
        self._next = max(self._next, index)
        while self._next < len(self._tensors) and self._next < index + _LOOKAHEAD:
            tensor = self._tensors[self._next]
            if self._copied_from(self._next) is None:
                if self._held and self._held + tensor.nbytes > self._budget:
                    return
                self._held += tensor.nbytes
                self._queued.append((self._next, self._pool.submit(tensor.load)))
            self._next += 1
