"""NaN and infinite values in weights: how many a tensor (or some of its bytes) holds, said the same way everywhere.

A flipped byte in a format without a checksum (safetensors) or a training run that diverged leaves NaN or +-Inf in
weights that otherwise look fine. Counting must not cost a pass of its own where the values are already in hand, so
a tensor is first asked one cheap question that any NaN or infinity answers (its sum, or for float16, whose sum
overflows, its smallest and largest value: memory-bound, no temporary), and counted value by value only when that
answer is not finite. The writers (write/value_watch.py) and ``inspect`` count with it; a producer that meets such
values on its own way through them (a quantizer's scale) raises ``NonfiniteValuesError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .errors import CogExportError, quoted

ALLOW_FLAG = "--allow-nonfinite"  # what asks the writers to pass such values on
_BLOCK = 1 << 22  # values counted at once when some are not finite: the temporaries stay a few MB
_FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2}


@dataclass(frozen=True)
class NonfiniteCount:
    """``nan`` NaN and ``inf`` infinite values among ``total``."""

    nan: int
    inf: int
    total: int

    def __add__(self, other: "NonfiniteCount") -> "NonfiniteCount":
        return NonfiniteCount(self.nan + other.nan, self.inf + other.inf, self.total + other.total)

    def __bool__(self) -> bool:
        return bool(self.nan or self.inf)

    def __str__(self) -> str:
        return f"{self.nan:,} NaN and {self.inf:,} infinite of {self.total:,} values"


NONE_OF_NONE = NonfiniteCount(0, 0, 0)


class NonfiniteValuesError(CogExportError):
    """A producer met NaN or infinite values in the values of ``name`` it was given (a quantizer computing a scale),
    counted them (``count``), and will not pass them on unasked. ``write_anyway`` makes its output with them passed
    on, where its format can hold them; None where it cannot, ``why_not`` saying why."""

    def __init__(self, name: str, count: NonfiniteCount, write_anyway: Callable[[], torch.Tensor] | None = None,
                 why_not: str = "") -> None:
        super().__init__(f"{quoted(name)} holds NaN or infinite values ({count})" + (f"; {why_not}" if why_not else ""))
        self.count, self.write_anyway, self.why_not = count, write_anyway, why_not


def nonfinite_problem(name: str, count: NonfiniteCount) -> str:
    """``inspect``'s line for a tensor holding NaN or infinite values."""
    return (f"tensor {quoted(name)} holds NaN or infinite values ({count}): a damaged file or a run that diverged; "
            f"exports refuse it unless {ALLOW_FLAG}")


def can_hold_nonfinite(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def count_nonfinite(values: torch.Tensor) -> NonfiniteCount:
    """How many NaN and infinite values ``values`` holds (none for a dtype that cannot hold them): one reduction,
    and a count value by value only when it says some are there."""
    if not can_hold_nonfinite(values.dtype) or not values.numel():
        return NonfiniteCount(0, 0, values.numel())
    if values.dtype in _FLOAT8:  # no reductions of its own; rare (a file already in fp8): widened, exactly
        values = values.to(torch.bfloat16)
    if torch.isfinite(_summary(values)).all():
        return NonfiniteCount(0, 0, values.numel())
    return _counted(values)


def count_nonfinite_bytes(data: memoryview, dtype: torch.dtype) -> NonfiniteCount:
    """``count_nonfinite`` of whole elements of ``dtype`` held by ``data`` (read where they lie: no copy; writable
    memory, as torch views it without a warning: a private map, a buffer)."""
    if not can_hold_nonfinite(dtype) or not len(data):
        return NonfiniteCount(0, 0, len(data) // dtype.itemsize)
    return count_nonfinite(torch.frombuffer(data, dtype=dtype))


def _summary(values: torch.Tensor) -> torch.Tensor:
    """A value that is not finite when any of ``values`` is not (it may also be so for finite values, rarely: a sum
    past the dtype's range; the count then finds none). float16's sums overflow: its extremes are taken instead."""
    if values.dtype == torch.float16:
        return torch.stack(torch.aminmax(values))
    return values.sum()


def _counted(values: torch.Tensor) -> NonfiniteCount:
    flat, nan, inf = values.reshape(-1), 0, 0
    for start in range(0, flat.numel(), _BLOCK):
        block = flat[start:start + _BLOCK]
        nan += int(torch.isnan(block).sum())
        inf += int(torch.isinf(block).sum())
    return NonfiniteCount(nan, inf, flat.numel())
