"""The HunyuanVideo 1.5 facts that need code: what a Diffusers-named HunyuanVideo15Transformer3DModel's shapes say
about it, which published variant a custom config is built like, and the config.json the original release keeps
beside its weights (both ways). Everything else about the family is data in key_maps/hunyuanvideo15/family.toml.

T2V and I2V, 480p and 720p, and the cfg-distilled models all have the same tensors: their shapes say "t2v or i2v",
the release's config.json (ideal_resolution, ideal_task) or the user (--model-type, --model-name, --base) says
which. Only the step-distilled 480p I2V model (MeanFlow: a second timestep embedder) differs in its tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .diffusers_cache import diffusers_version
from .original_config import original_config_beside
from .shape_facts import block_count, require

_NEEDED = ("x_embedder.proj.weight", "proj_out.weight", "context_embedder.proj_in.weight",
           "context_embedder_2.linear_1.weight", "image_embedder.norm_in.weight",
           "transformer_blocks.0.attn.norm_q.weight")
MEANFLOW = "time_embed.timestep_embedder_r.linear_1.weight"
ORIGINAL_CLASS = "HunyuanVideo_1_5_DiffusionTransformer"
# the original's ideal_resolution and the Diffusers config's target_size (the pipeline's default pixel size)
TARGET_SIZES = {"480p": 640, "720p": 960}
# the original constructor's settings every release shares, which the Diffusers class cannot express otherwise
FIXED_ORIGINAL = {
    "attn_mode": "flash", "attn_param": None, "concat_condition": True, "glyph_byT5_v2": True, "guidance_embed": False,
    "is_reshape_temporal_channels": False, "mlp_act_type": "gelu_tanh", "mm_single_blocks_depth": 0,
    "qk_norm": True, "qk_norm_type": "rms", "qkv_bias": True, "text_pool_type": None,
    "text_projection": "single_refiner", "text_states_dim_2": None, "use_attention_mask": True,
    "use_cond_type_embedding": True, "vision_projection": "linear",
}
# which of those a config beside the weights must have as written, and what they mean when it does not
_REQUIRED_ORIGINAL = {
    "guidance_embed": (False, "a guidance embedder (guidance_in)"),
    "mm_single_blocks_depth": (0, "single-stream blocks"),
    "text_projection": ("single_refiner", "another text projection"),
    "glyph_byT5_v2": (True, "no glyph (ByT5) projection"),
    "vision_projection": ("linear", "no image projection"),
    "use_cond_type_embedding": (True, "no condition-type embedding"),
    "concat_condition": (True, "no condition channels in its patch embedding"),
    "qk_norm_type": ("rms", "another query / key norm"),
}


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a HunyuanVideo 1.5 transformer")
    patch = shapes["x_embedder.proj.weight"]  # Conv3d [hidden, C_in, pt, ph, pw]
    hidden, head_dim = patch[0], shapes["transformer_blocks.0.attn.norm_q.weight"][0]
    return {
        "hidden": hidden,
        "heads": hidden // head_dim,
        "head_dim": head_dim,
        "in_channels": patch[1],
        "out_channels": shapes["proj_out.weight"][0] // patch[2:].numel(),
        "patch_size": list(patch[2:]),
        "layers": block_count(shapes, "transformer_blocks."),
        "refiner_layers": block_count(shapes, "context_embedder.token_refiner.refiner_blocks."),
        "text_embed_dim": shapes["context_embedder.proj_in.weight"][1],
        "text_embed_2_dim": shapes["context_embedder_2.linear_1.weight"][1],
        "image_embed_dim": shapes["image_embedder.norm_in.weight"][0],
        "meanflow": MEANFLOW in shapes,
    }


def tasks_of(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """Every task these shapes can be, the default first: T2V and I2V models have the same tensors (the image
    projection and the condition channels are in both); the MeanFlow model is released as I2V only."""
    return ("i2v",) if facts["meanflow"] else ("t2v", "i2v")


def task_of(facts: Mapping[str, Any]) -> str:
    return tasks_of(facts)[0]


def describe(facts: Mapping[str, Any]) -> str:
    return (f"HunyuanVideo 1.5 transformer, hidden size {facts['hidden']}, {facts['layers']} double blocks, "
            f"in_channels {facts['in_channels']}" + (", MeanFlow (step-distilled)" if facts["meanflow"] else ""))


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The published variant a custom config is built like: its resolution (target_size), task and MeanFlow. The
    cfg-distilled releases have their base model's config: a config alone names the base model."""
    if config.get("use_meanflow"):
        return "HunyuanVideo-1.5-480p_i2v_step_distilled"
    resolution = "720p" if config.get("target_size", 640) >= TARGET_SIZES["720p"] else "480p"
    task = "t2v" if config.get("task_type", "i2v") == "t2v" else "i2v"
    return f"HunyuanVideo-1.5-{resolution}_{task}"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """The MeanFlow embedder said in one line rather than as a list of keys."""
    if facts["meanflow"] != bool(config.get("use_meanflow", False)):
        has = "has" if facts["meanflow"] else "has no"
        raise CogExportError(f"{where} {has} MeanFlow's second timestep embedder (time_r_in), but the config it would "
                             f"go into says use_meanflow {config.get('use_meanflow', False)}; check --base or "
                             "--model-name (the step-distilled 480p I2V model is the MeanFlow one)")


# -- the original layout's config.json ---------------------------------------------------------------------------
def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config of a release or fine-tune in the original layout, from the HunyuanVideo_1_5 config.json
    beside its weights (so a release folder exports without --base)."""
    found = original_config_beside(folders, (ORIGINAL_CLASS,), strict=False)
    if found is None:
        return None
    original, path = found
    return diffusers_config(original, facts, path)


def _check_original(original: Mapping[str, Any], where: Path | str) -> None:
    for key, (value, what) in _REQUIRED_ORIGINAL.items():
        if original.get(key, value) != value:
            raise CogExportError(f"{where} describes a HunyuanVideo 1.5 transformer with {what} ({key} "
                                 f"{original[key]!r}), which Diffusers' HunyuanVideo15Transformer3DModel cannot hold")


def diffusers_config(original: Mapping[str, Any], facts: Mapping[str, Any], where: Path | str) -> dict:
    """HunyuanVideo_1_5_DiffusionTransformer's constructor arguments as HunyuanVideo15Transformer3DModel's. What the
    original hard-codes (the ByT5 input width 1472, two refiner blocks) is read off the shapes."""
    _check_original(original, where)
    try:
        heads, hidden = int(original["heads_num"]), int(original["hidden_size"])
        patch = [int(size) for size in original["patch_size"]]
        latent = int(original["in_channels"])
        config = {
            "in_channels": 2 * latent + 1, "out_channels": int(original.get("out_channels") or latent),
            "num_attention_heads": heads, "attention_head_dim": hidden // heads,
            "num_layers": int(original["mm_double_blocks_depth"]), "num_refiner_layers": int(facts["refiner_layers"]),
            "qk_norm": "rms_norm",
            "mlp_ratio": float(original.get("mlp_width_ratio", 4.0)), "patch_size": patch[1], "patch_size_t": patch[0],
            "text_embed_dim": int(original["text_states_dim"]), "text_embed_2_dim": int(facts["text_embed_2_dim"]),
            "image_embed_dim": int(original["vision_states_dim"]), "rope_theta": float(original.get("rope_theta", 256)),
            "rope_axes_dim": [int(d) for d in original["rope_dim_list"]],
            "use_meanflow": bool(original.get("use_meanflow", False)),
        }
    except (KeyError, TypeError, ValueError, IndexError):
        raise CogExportError(f"{where} is not a complete HunyuanVideo 1.5 config (heads_num, hidden_size, patch_size, "
                             "in_channels, mm_double_blocks_depth, text_states_dim, vision_states_dim, "
                             "rope_dim_list)") from None
    if original.get("ideal_resolution") in TARGET_SIZES:
        config["target_size"] = TARGET_SIZES[original["ideal_resolution"]]
    if original.get("ideal_task") in ("t2v", "i2v"):
        config["task_type"] = original["ideal_task"]
    return config


def _number(value: float) -> int | float:
    """A whole number as the original configs write it (4, 256), any other as it is."""
    return int(value) if float(value).is_integer() else value


def original_config(config: Mapping[str, Any], task: str | None) -> dict | None:
    """The HunyuanVideo_1_5_DiffusionTransformer config.json the release keeps beside its transformer weights (the
    class is a Diffusers ConfigMixin, hence the version key), for a HunyuanVideo15Transformer3DModel config; None for
    the VAE, whose original config cogexport does not derive."""
    if "num_attention_heads" not in config:
        return None
    heads, head_dim = config["num_attention_heads"], config["attention_head_dim"]
    resolution = {size: name for name, size in TARGET_SIZES.items()}.get(config["target_size"])
    return {
        "_class_name": ORIGINAL_CLASS, "_diffusers_version": diffusers_version(), **FIXED_ORIGINAL,
        "heads_num": heads, "hidden_size": heads * head_dim, "ideal_resolution": resolution,
        "ideal_task": task or config["task_type"], "in_channels": (config["in_channels"] - 1) // 2,
        "mlp_width_ratio": _number(config["mlp_ratio"]), "mm_double_blocks_depth": config["num_layers"],
        "out_channels": config["out_channels"],
        "patch_size": [config["patch_size_t"], config["patch_size"], config["patch_size"]],
        "rope_dim_list": list(config["rope_axes_dim"]), "rope_theta": _number(config["rope_theta"]),
        "text_states_dim": config["text_embed_dim"], "use_meanflow": config["use_meanflow"],
        "vision_states_dim": config["image_embed_dim"],
    }
