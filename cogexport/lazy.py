"""The unit every stage of the pipe hands to the next: a tensor known by shape and dtype, loaded on demand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


class SizedTensor:
    """numel and nbytes for anything with a ``shape`` and a ``dtype``."""

    shape: torch.Size
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return self.shape.numel()

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class LazyTensor(SizedTensor):
    """A tensor whose shape and dtype are known up front and whose data is made only by ``load()``.

    ``origin`` says in a few words where the data comes from (for reports and error messages).
    """

    shape: torch.Size
    dtype: torch.dtype
    loader: Callable[[], torch.Tensor]
    origin: str = ""

    def load(self) -> torch.Tensor:
        tensor = self.loader()
        if tensor.shape != self.shape or tensor.dtype != self.dtype:
            raise RuntimeError(
                f"{self.origin or 'lazy tensor'} produced {tuple(tensor.shape)} {tensor.dtype}, "
                f"expected {tuple(self.shape)} {self.dtype}"
            )
        return tensor

    def to(self, dtype: torch.dtype) -> "LazyTensor":
        """The same tensor cast to ``dtype`` when loaded (itself when the dtype already matches)."""
        if dtype == self.dtype:
            return self
        return LazyTensor(self.shape, dtype, lambda: self.load().to(dtype), self.origin)
