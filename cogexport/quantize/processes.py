"""Quantize with every core: a tensor's rows split into pieces, each quantized in a worker process. A job uses these
when the K types' compiled quantizer is not built (threads.py's pool otherwise, see ``quantizing_pool``).

The torch quantizers run thousands of small torch operations per chunk, each a Python call holding the interpreter's lock
for a moment, so threads of one process barely overlap (two threads on 2 cores: 1.2x one). Processes do not share
that lock. A tensor's pieces go to the workers in shared memory (one copy in, the stored bytes back the same way),
and the bytes are the same as quantizing in one process: every block is quantized from its own 256 or 32 values
alone, whichever process holds its row.

The workers start on the first tensor big enough to be worth one (a model of tiny test tensors never starts them),
from a fork server that has imported the quantizers once, and stop with the job. Anything that goes wrong in a
worker (a value no type can hold, a worker killed) is done again in this process, so the error is the one the
in-process quantizer raises, naming the tensor and counting its values whole.
"""

from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Callable

import torch
import torch.multiprocessing  # noqa: F401  (registers the reductions that pass tensors through shared memory)

from .piece_pool import PiecePool
from .rows import quantize_tensor

# Values a piece holds at least: sending one costs about a millisecond (a copy into shared memory and a message),
# quantizing 2^19 values takes 30 ms and more (the K types); smaller tensors stay here.
MIN_PIECE_VALUES = 1 << 19
# The types worth a worker: the K types' scale searches, 60-250 ns a value on one core. The others (the float
# types, Q8_0 and the 32-value types) are a few passes over the values (Q8_0 about 5 ns a value), not much more than
# the copies into and out of shared memory and the workers' start cost on their own: they are quantized here, by the
# job's worker threads (their few large torch operations release Python's lock). Q8_0 of Wan 2.1 1.3B took 51.5 s
# with two worker processes against 40.4 s with one (docs/benchmarks.md, a loaded machine).
SEARCHED_TYPES = frozenset({"Q6_K", "Q5_K", "Q4_K"})


def _ignore_interrupts() -> None:
    """A worker leaves Ctrl-C to the job, which stops the workers itself (no traceback from each of them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _quantize_piece(rows: torch.Tensor, type_name: str) -> torch.Tensor | None:
    """In a worker: the piece's stored bytes, or None when it cannot be quantized (the job finds out why)."""
    try:
        return quantize_tensor(rows, type_name)
    except Exception:  # any failure is redone in the job's process, which raises the error the user sees
        return None


class QuantizingProcesses(PiecePool):
    """``count`` worker processes quantizing pieces of tensors; use as a context manager (the workers stop at its
    end). With a count of 1 every tensor is quantized in this process."""

    def __init__(self, count: int, min_piece_values: int | None = None) -> None:
        super().__init__(count, min_piece_values or MIN_PIECE_VALUES)
        self._broken = False

    def quantize(self, load: Callable[[], torch.Tensor], type_name: str, name: str) -> torch.Tensor:
        """The stored bytes (rows, bytes a row) of the tensor ``load`` gives, rows along its last dimension, as
        ``quantize_tensor`` makes them. ``load`` is called once; the loaded values are not kept while the
        workers quantize their copies."""
        values = load()
        rows = values.reshape(-1, values.shape[-1] if values.dim() else 1)
        pieces = self._piece_count(rows, type_name)
        if pieces <= 1:
            return quantize_tensor(values, type_name, name)
        # in the stored dtype (a bf16 piece is half the bytes to copy): the quantizer casts a chunk at a time
        shared = [torch.empty_like(piece).share_memory_().copy_(piece) for piece in rows.tensor_split(pieces)]
        del values, rows
        futures = self._submit(shared, type_name)
        results = [_result(future) for future in futures] if futures else [None]
        if any(result is None for result in results):
            return quantize_tensor(torch.cat(shared), type_name, name)  # raises what went wrong, as here
        return torch.cat(results)

    def _piece_count(self, rows: torch.Tensor, type_name: str) -> int:
        if self.count <= 1 or self._broken or type_name not in SEARCHED_TYPES:
            return 1
        return min(self.count, rows.shape[0], rows.numel() // self.min_piece_values)

    def _submit(self, pieces: list[torch.Tensor], type_name: str) -> list[Future]:
        try:
            pool = self._started()
            return [pool.submit(_quantize_piece, piece, type_name) for piece in pieces]
        except Exception:  # a pool that cannot start or has broken: the rest of the job quantizes here
            self._broken = True
            return []

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("forkserver")
            # the fork server imports the quantizers (and torch) once; each worker is a fork of it, not a new start
            context.set_forkserver_preload([__name__])
            self._pool = ProcessPoolExecutor(self.count, mp_context=context, initializer=_ignore_interrupts)
        return self._pool


def _result(future: Future) -> torch.Tensor | None:
    try:
        return future.result()
    except Exception:  # a worker that died (killed, out of memory): the piece is redone in the job's process
        return None
