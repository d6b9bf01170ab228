"""The SkyReels-V2 facts that need code: a Wan 2.1 transformer (cogexport.models.wan reads its facts), whose
diffusion-forcing 1.3B model adds an fps embedding (inject_sample_info). The T2V and diffusion-forcing 14B models have
the same shapes; the pipeline they are exported into says which. Everything else is data in
key_maps/skyreels_v2/family.toml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from . import wan
from .original_config import original_config_beside

_FPS = "fps_embedding.weight"
_DIFFUSION_FORCING = "SkyReelsV2DiffusionForcingPipeline"  # tasks that share shapes differ in their pipeline
SAMPLE_INFO = "inject_sample_info"  # the original WanModel's config key (the fps embedding), which Wan's lacks


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    facts = wan.read_facts(shapes)
    facts["sample_info"] = _FPS in shapes
    return facts


def task_of(facts: Mapping[str, Any]) -> str:
    return "df" if facts["sample_info"] else wan.task_of(facts)


def tasks_of(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """A 16-channel model without the fps embedding is a T2V or a diffusion-forcing 14B model (the same shapes)."""
    task = task_of(facts)
    return ("t2v", "df") if task == "t2v" else (task,)


def describe(facts: Mapping[str, Any]) -> str:
    return (f"SkyReels-V2 transformer, hidden size {facts['hidden']}, {facts['layers']} layers, in_channels "
            f"{facts['in_channels']}" + (", with the fps embedding" if facts["sample_info"] else "")
            + (", with an image branch" if facts["image_branch"] else ""))


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    size = "14B" if config.get("num_attention_heads", 16) * config.get("attention_head_dim", 128) >= 5120 else "1.3B"
    if config.get("image_dim") or config.get("in_channels", 16) > config.get("out_channels", 16):
        return f"SkyReels-V2-I2V-{size}-540P"
    pipeline_class = (pipeline or {}).get("_class_name")
    if config.get(SAMPLE_INFO) or pipeline_class == _DIFFUSION_FORCING:
        return f"SkyReels-V2-DF-{size}-540P"
    # the T2V pipeline's, or with none named, the published model of this size (no T2V 1.3B was released)
    return "SkyReels-V2-T2V-14B-540P" if size == "14B" or pipeline_class else "SkyReels-V2-DF-1.3B-540P"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    wan.check_target(facts, config, where)


# -- the original layout's config.json ---------------------------------------------------------------------------
def claims_config(config: Mapping[str, Any]) -> bool:
    """The SkyReels-V2 repo's WanModel config records inject_sample_info, which Wan's does not."""
    return config.get("_class_name") == wan.ORIGINAL_CLASS and SAMPLE_INFO in config


def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config from the WanModel config.json beside the weights (Wan's translation, plus the fps
    embedding)."""
    found = original_config_beside(folders, (wan.ORIGINAL_CLASS,))
    if found is None:
        return None
    original, path = found
    config = wan.config_from_release(original, facts, path)
    config[SAMPLE_INFO] = bool(original.get(SAMPLE_INFO, facts["sample_info"]))
    return config


def original_config(config: Mapping[str, Any], task: str) -> dict:
    """The WanModel config.json the SkyReels-V2 repo keeps beside its weights: its model_type is t2v or i2v (the
    diffusion-forcing models are t2v models), and it records inject_sample_info."""
    original = wan.original_config(config, "i2v" if task in ("i2v", "flf2v") else "t2v")
    original[SAMPLE_INFO] = bool(config.get(SAMPLE_INFO))
    return dict(sorted(original.items()))
