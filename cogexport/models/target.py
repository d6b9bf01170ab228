"""The model an export writes into: the real Diffusers class built on the meta device, so its config is the class's
own and its state_dict names, shapes and order are the schema the plan must produce. Nothing is allocated; what the
build tells is kept on disk per Diffusers version (diffusers_cache.py), so a later export of the same class and
config need not import Diffusers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..errors import CogExportError
from .diffusers_cache import remembered


@dataclass
class TargetModel:
    """A Diffusers model as an export needs it: its class, its config (and config.json as save_pretrained writes
    it), and its state_dict schema."""

    class_name: str
    config: dict
    config_json: str
    schema: dict[str, torch.Size]
    dtypes: dict[str, torch.dtype]
    counts: dict[str, int]  # sizes the key-map rules may need (e.g. num_up_blocks for re-indexing)


def build_target(class_name: str, config: Mapping[str, object]) -> TargetModel:
    """The model ``class_name`` builds from ``config`` (a CogExportError if it cannot)."""
    answer = remembered("target", {"class": class_name, "config": dict(config)}, lambda: _build(class_name, config),
                        fields=("config", "config_json", "schema", "dtypes", "counts"))
    # every whole number of the config is a count a rule may read (num_attention_heads for a per-head regroup)
    counts = {name: value for name, value in answer["config"].items() if type(value) is int}
    return TargetModel(class_name, answer["config"], answer["config_json"],
                       {name: torch.Size(shape) for name, shape in answer["schema"].items()},
                       {name: getattr(torch, dtype) for name, dtype in answer["dtypes"].items()},
                       {**counts, **answer["counts"]})


def _build(class_name: str, config: Mapping[str, object]) -> dict:
    """Build the model on the meta device and tell what an export needs of it."""
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
    return {"config": dict(model.config), "config_json": model.to_json_string(),
            "schema": {name: list(tensor.shape) for name, tensor in state.items()},
            "dtypes": {name: str(tensor.dtype).removeprefix("torch.") for name, tensor in state.items()},
            "counts": counts}
