"""The model an export writes into: the real Diffusers class built on the meta device, so its config is the class's
own and its state_dict names, shapes and order are the schema the plan must produce. Nothing is allocated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..errors import CogExportError


@dataclass
class TargetModel:
    """A Diffusers model built on the meta device: its config (for config.json) and state_dict schema."""

    model: torch.nn.Module
    schema: dict[str, torch.Size]
    dtypes: dict[str, torch.dtype]
    counts: dict[str, int]  # sizes the key-map rules may need (e.g. num_up_blocks for re-indexing)

    @property
    def class_name(self) -> str:
        return type(self.model).__name__

    @property
    def config(self) -> dict:
        return dict(self.model.config)


def build_target(class_name: str, config: Mapping[str, object]) -> TargetModel:
    from .family import model_class as class_named

    model_class = class_named(class_name)
    try:
        with torch.device("meta"):
            model = model_class.from_config(dict(config))
    except (TypeError, ValueError, AssertionError, AttributeError, IndexError) as error:
        raise CogExportError(f"cannot build {class_name} from this config: {error}") from None
    state = model.state_dict()
    counts = {}
    if "up_block_types" in model.config:
        counts["num_up_blocks"] = len(model.config["up_block_types"])
    return TargetModel(model, {k: v.shape for k, v in state.items()}, {k: v.dtype for k, v in state.items()}, counts)
