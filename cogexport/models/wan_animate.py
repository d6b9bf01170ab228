"""The Wan Animate facts that need code: a Wan 2.1 I2V transformer (cogexport.models.wan reads its facts) with a pose
embedding, a motion encoder, a face encoder and face adapters, whose sizes the shapes show. The original
WanAnimateModel's config.json records only Wan's values (its motion and face sizes are constants of its code), so a
custom-size checkpoint's Diffusers config takes those from the shapes. Everything else is data in
key_maps/wan_animate/family.toml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from . import wan
from .diffusers_cache import remembered
from .original_config import original_config_beside
from .shape_facts import block_count, one_task, one_variant, require

ORIGINAL_CLASS = "WanAnimateModel"
_MOTION, _FACE = "motion_encoder.", "face_encoder."
_CHANNEL_SIZES = "diffusers.models.transformers.transformer_wan_animate.WAN_ANIMATE_MOTION_ENCODER_CHANNEL_SIZES"
_NEEDED = ("pose_patch_embedding.weight", f"{_MOTION}motion_synthesis_weight", f"{_MOTION}conv_in.weight",
           f"{_MOTION}conv_out.weight", f"{_FACE}conv1_local.weight", f"{_FACE}conv2.weight")
# the config values the motion and face modules take, all read off the shapes
_ANIMATE_KEYS = ("latent_channels", "motion_encoder_size", "motion_style_dim", "motion_dim", "motion_encoder_dim",
                 "face_encoder_hidden_dim", "face_encoder_num_heads", "inject_face_latents_blocks",
                 "motion_encoder_channel_sizes")


def _channel_sizes(shapes: Mapping[str, torch.Size], size: int, blocks: int) -> dict[str, int] | None:
    """The motion encoder's channels per feature-map size, as the class's default table with the sizes these
    shapes use; None when that is the default table itself."""
    default = _default_channel_sizes()
    used = {str(size): shapes[f"{_MOTION}conv_in.weight"][0]}
    used.update({str(size >> (i + 1)): shapes[f"{_MOTION}res_blocks.{i}.conv2.weight"][0] for i in range(blocks)})
    sizes = {**default, **used}
    return None if sizes == default else sizes


def _default_channel_sizes() -> dict[str, int]:
    """Diffusers' default table of the motion encoder's channels (a constant of its module, not of the class's
    signature), kept in the Diffusers cache with what the class tells, so that a remembered export imports no
    Diffusers."""
    def ask() -> dict:
        from diffusers.models.transformers import transformer_wan_animate

        return {"sizes": dict(transformer_wan_animate.WAN_ANIMATE_MOTION_ENCODER_CHANNEL_SIZES)}

    return remembered("constant", {"name": _CHANNEL_SIZES}, ask, ("sizes",))["sizes"]


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a Wan Animate transformer")
    facts = wan.read_facts(shapes)
    blocks, adapters = block_count(shapes, f"{_MOTION}res_blocks."), block_count(shapes, "face_adapter.")
    size = 2 ** (blocks + 2)  # each residual block halves the map, down to the 4x4 conv_out
    synthesis, hidden = shapes[f"{_MOTION}motion_synthesis_weight"], shapes[f"{_FACE}conv2.weight"][0]
    facts.update(
        latent_channels=shapes["pose_patch_embedding.weight"][1], motion_encoder_size=size,
        motion_style_dim=shapes[f"{_MOTION}conv_out.weight"][0], motion_dim=synthesis[1],
        motion_encoder_dim=synthesis[0], face_encoder_hidden_dim=hidden,
        face_encoder_num_heads=shapes[f"{_FACE}conv1_local.weight"][0] // hidden, face_adapters=adapters,
        inject_face_latents_blocks=facts["layers"] // adapters if adapters else None,
        motion_encoder_channel_sizes=_channel_sizes(shapes, size, blocks))
    return facts


task_of = one_task("animate")


def describe(facts: Mapping[str, Any]) -> str:
    return (f"Wan Animate transformer, hidden size {facts['hidden']}, {facts['layers']} layers, "
            f"{facts['face_adapters']} face adapters")


layout_variant = one_variant("Wan2.2-Animate-14B")


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """The face adapters follow every inject_face_latents_blocks-th block: the layer count must split evenly."""
    adapters, layers = facts["face_adapters"], facts["layers"]
    if not adapters or layers % adapters:
        raise CogExportError(f"{where} has {adapters} face adapters for {layers} layers; Wan Animate needs one every "
                             "inject_face_latents_blocks layers, an even split")


# -- the original layout's config.json ---------------------------------------------------------------------------
def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config from the WanAnimateModel config.json beside the weights: Wan's values translated as
    Wan's are, the motion and face sizes (constants of the original code) from the shapes."""
    found = original_config_beside(folders, (ORIGINAL_CLASS,))
    if found is None:
        return None
    original, path = found
    config = wan.config_from_release(original, facts, path)
    config.update({key: facts[key] for key in _ANIMATE_KEYS})
    return config


def original_config(config: Mapping[str, Any], task: str) -> dict:
    """The WanAnimateModel config.json the Wan2.2 repo writes beside the weights (every constructor argument: its
    register_to_config records them all)."""
    original = wan.original_config(config, task)
    del original["model_type"]  # WanAnimateModel takes none
    original.update(_class_name=ORIGINAL_CLASS, text_dim=config["text_dim"], patch_size=list(config["patch_size"]),
                    window_size=[-1, -1], qk_norm=config["qk_norm"] is not None,
                    cross_attn_norm=config["cross_attn_norm"],
                    motion_encoder_dim=config["motion_encoder_dim"], use_context_parallel=False, use_img_emb=True)
    return dict(sorted(original.items()))
