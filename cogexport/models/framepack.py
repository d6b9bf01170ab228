"""The HunyuanVideo FramePack facts that need code: what a HunyuanVideoFramepackTransformer3DModel's shapes say about it
(HunyuanVideo's facts, read by hunyuanvideo.py, plus FramePack's two additions), and the release's own config.json,
which names diffusers_helper's HunyuanVideoTransformer3DModelPacked. Everything else about the family is data in
key_maps/framepack/family.toml.

FramePackI2V_HY and FramePack-F1 have the same tensors and config: the shapes name the first, --model-name the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from . import hunyuanvideo
from .family import class_defaults
from .original_config import original_config_beside
from .shape_facts import one_task, one_variant

ORIGINAL_CLASS = "HunyuanVideoTransformer3DModelPacked"  # lllyasviel's diffusers_helper class, named in its config
IMAGE_PROJECTION = "image_projection.up.weight"  # Linear [3 x hidden, SigLIP width]
HISTORY = "clean_x_embedder.proj.weight"  # the history latents' 1x patch embedder (proj_2x, proj_4x beside it)

task_of = one_task("i2v")
layout_variant = one_variant("FramePackI2V_HY")


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    if IMAGE_PROJECTION not in shapes and HISTORY not in shapes:
        raise CogExportError(f"the tensors have neither {IMAGE_PROJECTION} nor {HISTORY}: not a FramePack transformer")
    facts = hunyuanvideo.read_facts(shapes)
    facts["image_proj_dim"] = shapes[IMAGE_PROJECTION][1] if IMAGE_PROJECTION in shapes else None
    facts["history"] = HISTORY in shapes
    return facts


def describe(facts: Mapping[str, Any]) -> str:
    parts = [f"HunyuanVideo FramePack transformer, hidden size {facts['hidden']}, {facts['layers']} double and "
             f"{facts['single_layers']} single blocks, in_channels {facts['in_channels']}"]
    if facts["image_proj_dim"] is not None:
        parts.append(f"image projection from {facts['image_proj_dim']}")
    if not facts["history"]:
        parts.append("no history embedder")
    return ", ".join(parts)


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """The differences a wrong --base makes, said in one line rather than as a list of missing keys: the input
    channels and guidance embedder (HunyuanVideo's), and FramePack's two optional modules."""
    hunyuanvideo_config = {"image_condition_type": hunyuanvideo.LATENT_CONCAT, **config} \
        if facts["in_channels"] > facts["out_channels"] else config
    hunyuanvideo.check_target(facts, hunyuanvideo_config, where)
    wanted = {"has_image_proj": facts["image_proj_dim"] is not None, "has_clean_x_embedder": facts["history"]}
    for option, present in wanted.items():
        if bool(config.get(option, False)) != present:
            has = "has" if present else "has no"
            module = "an image projection (image_projection)" if option == "has_image_proj" else \
                "a history embedder (clean_x_embedder)"
            raise CogExportError(f"{where} {has} {module}, but the config it would go into says {option} "
                                 f"{config.get(option, False)}; check --base")
    if config.get("image_condition_type") is not None:
        raise CogExportError(f"{where}: the config it would go into has image_condition_type "
                             f"{config['image_condition_type']!r}; FramePack conditions on the image through its "
                             "history latents and image projection, not HunyuanVideo I2V's; check --base")


# -- the release's config.json (HunyuanVideoTransformer3DModelPacked) ---------------------------------------------
def _diffusers_parameters() -> set[str]:
    # the constructor's arguments, every one with a default, as class_defaults keeps them on disk: reading a release
    # folder need not import Diffusers (seconds, more than copying the weights)
    return set(class_defaults("HunyuanVideoFramepackTransformer3DModel"))


def claims_config(config: Mapping[str, Any]) -> bool:
    """The release's config.json names FramePack's own class (its weights' names are Diffusers' own)."""
    return config.get("_class_name") == ORIGINAL_CLASS


def base_config(original: Mapping[str, Any], path: Path) -> dict:
    """The Diffusers config of the Packed config.json: the Packed class's arguments are Diffusers' own (Diffusers'
    class adds image_condition_type, which the release leaves at None). The release folder can so be --base."""
    unknown = sorted(key for key in original if not key.startswith("_") and key not in _diffusers_parameters())
    if unknown:
        raise CogExportError(f"{path} sets {', '.join(unknown)}, which HunyuanVideoFramepackTransformer3DModel does "
                             "not take; is it a FramePack release's config.json?")
    return {key: value for key, value in original.items() if not key.startswith("_")}


def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config from the Packed config.json beside the weights (the release folder's)."""
    found = original_config_beside(folders, (ORIGINAL_CLASS,))
    return None if found is None else base_config(*found)
