"""A release's single model-states file: ``torch.save({"module": state dict})`` under the name DeepSpeed gives it
(HunyuanVideo's ``transformers/mp_rank_00_model_states.pt``, which its repo loads with ``--load-key module``),
written a tensor at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

from ..lazy import LazyTensor
from .torch_archive import write_torch_archive


def write_model_states(path: Path, tensors: Mapping[str, LazyTensor],
                       on_tensor: Callable[[str, int], None] | None = None) -> list[str]:
    write_torch_archive(path, {"module": dict(tensors)}, on_tensor)
    return [path.name]
