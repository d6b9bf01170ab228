"""The ChronoEdit facts that need code: a Wan 2.1 I2V transformer (cogexport.models.wan reads its facts) whose config
adds rope_temporal_skip_len, and the WanModel config.json of its original layout, which records that setting so that
the file says it is ChronoEdit's. Everything else is data in key_maps/chronoedit/family.toml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from . import wan
from .original_config import original_config_beside
from .shape_facts import one_task, one_variant

ROPE_SKIP = "rope_temporal_skip_len"  # ChronoEditTransformer3DModel's config key, which Wan's configs lack
DEFAULT_ROPE_SKIP = 8  # the class's default, the released model's

task_of = one_task("edit")
layout_variant = one_variant("ChronoEdit-14B")


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    facts = wan.read_facts(shapes)
    if not facts["image_branch"]:
        # ChronoEditPipeline always hands the transformer CLIP's image features: a model without Wan 2.1 I2V's image
        # branch is some other Wan, not a ChronoEdit
        raise CogExportError(f"a {wan.describe(facts)} has no CLIP image branch, which every ChronoEdit model has "
                             "(Wan 2.1 I2V's); it is not a ChronoEdit transformer")
    return facts


def describe(facts: Mapping[str, Any]) -> str:
    return (f"ChronoEdit transformer, hidden size {facts['hidden']}, {facts['layers']} layers, in_channels "
            f"{facts['in_channels']}")


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    wan.check_target(facts, config, where)


# -- the original layout's config.json ---------------------------------------------------------------------------
def claims_config(config: Mapping[str, Any]) -> bool:
    """The WanModel config.json --to original writes for ChronoEdit records rope_temporal_skip_len; Wan's does not."""
    return config.get("_class_name") == wan.ORIGINAL_CLASS and ROPE_SKIP in config


def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config from the WanModel config.json beside the weights: Wan's translation, and the RoPE
    setting it records."""
    found = original_config_beside(folders, (wan.ORIGINAL_CLASS,))
    if found is None:
        return None
    original, path = found
    config = wan.config_from_release(original, facts, path)
    config[ROPE_SKIP] = int(original.get(ROPE_SKIP, DEFAULT_ROPE_SKIP))
    return config


def original_config(config: Mapping[str, Any], task: str) -> dict:
    """Wan 2.1 I2V's WanModel config.json (what Wan's code, ComfyUI and DiffSynth-Studio read) with the RoPE setting
    recorded: the one fact that tells the file from a Wan I2V's."""
    original = wan.original_config(config, "i2v")
    original[ROPE_SKIP] = int(config.get(ROPE_SKIP, DEFAULT_ROPE_SKIP))
    return dict(sorted(original.items()))
