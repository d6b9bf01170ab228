"""Quantize with every core through the compiled quantizer (the K types and Q8_0): a tensor's rows split into pieces, each quantized by a
thread of one pool.

The compiled quantizer (kernel.py) runs with Python's lock released, so threads of this process quantize at once:
no copies into shared memory, no worker processes to start. The bytes are the same as quantizing in one thread:
every block is quantized from its own values alone, whichever thread holds its row. Anything that goes wrong
in a piece is done again whole in the calling thread, so the error names the tensor and counts its values whole.

Without the compiled quantizer the K types' torch search holds Python's lock much of the time, and worker processes
share the work instead (processes.py): ``quantizing_pool`` picks.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from . import kernel
from .formats import ggml_type
from .piece_pool import PiecePool
from .rows import quantize_tensor

# Values a piece holds at least: a millisecond of work or more (the K types take 25-110 ns a value on one core, Q8_0
# a few), far above a task's cost in the pool; smaller tensors are quantized in the calling thread.
MIN_PIECE_VALUES = 1 << 16
# Pieces a tensor is cut into per thread at most: a core slowed by other work then leaves less of the tensor
# waiting on it.
PIECES_PER_THREAD = 4


class QuantizingThreads(PiecePool):
    """``count`` threads quantizing pieces of the tensors the compiled quantizer takes (the K types, Q8_0); use as a context
    manager (the threads stop at its end). Other types, and every type with a count of 1, are quantized in the
    calling thread (the job's worker threads already quantize several tensors at once)."""

    def __init__(self, count: int, min_piece_values: int | None = None) -> None:
        super().__init__(count, min_piece_values or MIN_PIECE_VALUES)
        self._starting = threading.Lock()  # the job's worker threads call quantize at once

    def quantize(self, load: Callable[[], torch.Tensor], type_name: str, name: str) -> torch.Tensor:
        """The stored bytes (rows, bytes a row) of the tensor ``load`` gives, rows along its last dimension, as
        ``quantize_tensor`` makes them."""
        values = load()
        rows = values.reshape(-1, values.shape[-1] if values.dim() else 1)
        pieces = self._piece_count(rows, type_name)
        if pieces <= 1:
            return quantize_tensor(values, type_name, name)
        pool = self._started()
        # each piece's rows written straight into their place in the tensor's bytes: no joining copy
        out = torch.empty(rows.shape[0], ggml_type(type_name).row_bytes(rows.shape[1]), dtype=torch.uint8)
        futures = [pool.submit(quantize_tensor, piece, type_name, name, into=into)
                   for piece, into in zip(rows.tensor_split(pieces), out.tensor_split(pieces))]
        try:
            for future in futures:
                future.result()
            return out
        except Exception:  # a value a piece cannot hold: the whole tensor again here, for the error it raises
            for future in futures:
                future.cancel()
            return quantize_tensor(values, type_name, name)

    def _started(self) -> ThreadPoolExecutor:
        with self._starting:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.count, thread_name_prefix="cogexport-quantize")
            return self._pool

    def _piece_count(self, rows: torch.Tensor, type_name: str) -> int:
        if self.count <= 1 or not kernel.handles(type_name):
            return 1
        return min(self.count * PIECES_PER_THREAD, rows.shape[0], rows.numel() // self.min_piece_values)


def quantizing_pool(count: int):
    """Where a job's big K-type tensors are quantized with ``count`` cores: threads when the compiled quantizer is
    built, else worker processes (its torch fallback shares threads poorly)."""
    if kernel.available():
        return QuantizingThreads(count)
    from .processes import QuantizingProcesses  # multiprocessing only where it is used

    return QuantizingProcesses(count)
