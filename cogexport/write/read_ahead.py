"""Reading the next tensors while this one is worked on: a job's source values are read (the reader's ``load``: a
``pread`` from the page cache or the disk, a cast) by one thread of their own, a few tensors ahead of the threads
that quantize them, so that reading overlaps quantizing instead of taking turns with it. The writer already works
behind the quantizing threads (io_engine.py's feed hands it each tensor's bytes as they are done), so with this a
GGUF job reads tensor i+1, quantizes tensor i and writes tensor i-1 at once.

Tensors are asked for by their place in one sequence (a file's tensors), in order or nearly so (a feed's threads
start them in order); asking for tensor i queues the reads of the ``ahead`` tensors after it. Memory: at most
``ahead`` tensors read and not yet asked for, beside those being worked on. A read that fails raises its error
where its tensor is asked for, as reading it there would; a tensor read ahead and never asked for (a torchrun rank's
run of the file ended, the job failed) is dropped. The thread stops when the job's ``with`` block ends (an error or
Ctrl-C included): what is queued is cancelled, and a read under way (one tensor: milliseconds) finishes first.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Sequence

import torch

from ..lazy import LazyTensor

# Tensors read ahead of the latest one asked for: one hides a read behind a quantizing; two absorb a short tensor
# (a bias) followed by a long one. More only hold memory.
DEFAULT_AHEAD = 2


class ReadAhead:
    """One reading thread for a job (``ahead`` 0: none, each tensor read where it is asked for, as before). Use as a
    context manager: the thread stops at its end."""

    def __init__(self, ahead: int = DEFAULT_AHEAD) -> None:
        self.ahead = max(0, ahead)
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False  # past the job's end every tensor is read where it is asked for: no thread is left
        self._lock = threading.Lock()  # the feed's threads ask at once

    def __enter__(self) -> "ReadAhead":
        return self

    def __exit__(self, *exc_info) -> None:
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def sequence(self, tensors: Sequence[LazyTensor]) -> list[LazyTensor]:
        """``tensors`` as they are (shape, dtype, origin, byte ranges), each loaded ahead where it can be."""
        if not self.ahead:
            return list(tensors)
        load = _Sequence(self, list(tensors)).load
        return [replace(tensor, loader=partial(load, index)) for index, tensor in enumerate(tensors)]

    def _submit(self, tensor: LazyTensor) -> Future:
        if self._pool is None:  # started on the first read: a job that fails while planning starts no thread
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="cogexport-read")
        return self._pool.submit(tensor.load)


class _Sequence:
    """The reads of one sequence's tensors: queued from the first place asked for on, ``ahead`` past the latest."""

    def __init__(self, reading: ReadAhead, tensors: list[LazyTensor]) -> None:
        self._reading = reading
        self._tensors = tensors
        self._queued: dict[int, Future] = {}
        self._next: int | None = None  # the next place to queue

    def load(self, index: int) -> torch.Tensor:
        with self._reading._lock:
            queued = None if self._reading._closed else self._queue_through(index)
        # past the job's end, or a place before the first asked for (never queued): read here
        return self._tensors[index].load() if queued is None else queued.result()

    def _queue_through(self, index: int) -> Future | None:
        """Queue the reads up to ``ahead`` places past ``index``; returns ``index``'s own, off the queue."""
        if self._next is None:
            self._next = index  # a torchrun rank's run starts within the file
        last = min(len(self._tensors), index + 1 + self._reading.ahead)
        for place in range(self._next, last):
            self._queued[place] = self._reading._submit(self._tensors[place])
        self._next = max(self._next, last)
        return self._queued.pop(index, None)
