"""A release's single model-states file: ``torch.save({"module": state dict})`` under the name DeepSpeed gives it
(HunyuanVideo's ``transformers/mp_rank_00_model_states.pt``, which its repo loads with ``--load-key module``),
written a tensor at a time."""

from __future__ import annotations

from typing import Mapping

from ..lazy import LazyTensor
from .folder_plan import TensorFile


def model_states_file(path: str, tensors: Mapping[str, LazyTensor]) -> TensorFile:
    return TensorFile(path, tensors, container="torch", under="module")
