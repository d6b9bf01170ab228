"""What the two ways of quantizing a tensor's pieces at once share (threads.py with the compiled quantizer,
processes.py with the torch fallback): a worker count, the smallest piece worth handing off, and an executor
started on first use and stopped, with its queued pieces cancelled, when the job's ``with`` block ends."""

from __future__ import annotations

from concurrent.futures import Executor


class PiecePool:
    """Base of QuantizingThreads and QuantizingProcesses: each starts its own kind of executor in ``_pool``."""

    def __init__(self, count: int, min_piece_values: int) -> None:
        self.count = max(1, count)
        self.min_piece_values = min_piece_values
        self._pool: Executor | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
