"""The LTX-Video facts that need code: what a Diffusers-named LTXVideoTransformer3DModel's shapes say about it, which
release a single file is (its VAE's layout, beside the transformer in the same file), the config a single file keeps
in its metadata (both ways), and which published variant a custom config is built like. Everything else about the
family is data in key_maps/ltx_video/family.toml.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .shape_facts import block_count, require

_NEEDED = ("proj_in.weight", "proj_out.weight", "caption_projection.linear_1.weight")
VAE_PREFIX = "vae."  # the VAE's keys in a single-file release
ORIGINAL_CLASS = "Transformer3DModel"  # the LTX-Video repo's transformer class, as its config names it
VAE_VERSIONS = ("0.9.0", "0.9.1", "0.9.5")  # the three VAE layouts; "0.9.5" stands for 0.9.5 and every later one
WIDE_HEAD = 128  # 13B's attention head width (2B: 64)


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "an LTX-Video transformer")
    proj_in = shapes["proj_in.weight"]  # Linear [D, C_in] (patch size 1: latents are tokens)
    cross = shapes.get("transformer_blocks.0.attn2.to_k.weight")
    return {
        "hidden": proj_in[0],
        "in_channels": proj_in[1],
        "out_channels": shapes["proj_out.weight"][0],
        "layers": block_count(shapes, "transformer_blocks."),
        "caption_channels": shapes["caption_projection.linear_1.weight"][1],
        "cross_attention_dim": cross[1] if cross is not None else None,
    }


def release_facts(shapes: Mapping[str, torch.Size], metadata: Mapping[str, str]) -> dict[str, Any]:
    """What a single-file release holds beside the transformer: the VAE (under vae.), whose layout is the version,
    and the config JSON in the safetensors metadata."""
    vae_keys = [name[len(VAE_PREFIX):] for name in shapes if name.startswith(VAE_PREFIX)]
    facts: dict[str, Any] = {"vae_version": vae_version_of_keys(vae_keys)}
    if "config" in metadata:
        try:
            config = json.loads(metadata["config"])
        except ValueError:
            raise CogExportError("the checkpoint's safetensors metadata 'config' is not valid JSON; the file is "
                                 "corrupt or not an LTX-Video release") from None
        if isinstance(config, dict):
            facts["release_config"] = config
    return facts


def vae_version_of_keys(keys: Sequence[str]) -> str | None:
    """The VAE layout, read off its original key names (docs 3.3, by structure rather than by width): 0.9.0's
    decoder has ten blocks, 0.9.1 keeps 0.9.0's ten-block encoder, 0.9.5 and later have a nine-block encoder."""
    if not keys:
        return None
    if any(key.startswith("decoder.up_blocks.9.") for key in keys):
        return "0.9.0"
    if any(key.startswith("encoder.down_blocks.9.") for key in keys):
        return "0.9.1"
    return "0.9.5"


def vae_version_of_config(config: Mapping[str, Any]) -> str:
    """The same, for an AutoencoderKLLTXVideo config (a --base pipeline's vae/)."""
    if "LTXVideo095DownBlock3D" in (config.get("down_block_types") or ()):
        return "0.9.5"
    return "0.9.1" if config.get("timestep_conditioning") else "0.9.0"


def task_of(facts: Mapping[str, Any]) -> str:
    # the 13B releases (0.9.7, 0.9.8) come as LTXConditionPipeline; a 2B's pipeline depends on its version
    return "condition" if facts["hidden"] >= 4096 or facts["layers"] >= 48 else "t2v"


def tasks_of(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """Both pipelines drive the same transformer: which one a release comes as is its version's choice (a --base
    pipeline, or the size by default)."""
    default = task_of(facts)
    return (default, "t2v" if default == "condition" else "condition")


def describe(facts: Mapping[str, Any]) -> str:
    text = f"LTX-Video transformer, hidden size {facts['hidden']}, {facts['layers']} layers"
    if facts.get("vae_version"):
        return text + f", with a {facts['vae_version']}{'+' if facts['vae_version'] == '0.9.5' else ''} VAE"
    return text + (" and no VAE beside it (the 0.9.x releases of one size share a transformer; their VAE, "
                   "--model-name or --base tells them apart)")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The published variant a custom config is built like: 13B's wide heads or depth, else 2B (0.9.5 and later,
    unless a --base pipeline's VAE says otherwise: see variant_of_components)."""
    if config.get("attention_head_dim", 64) >= WIDE_HEAD or config.get("num_layers", 28) >= 48:
        return "LTX-Video-0.9.7-dev"
    return "LTX-Video-0.9.5"


def variant_of_components(name: str, components: Mapping[str, Mapping[str, Any]]) -> str:
    """A 2B's version from the --base pipeline's VAE config (0.9.0 and 0.9.1 shift their scheduler by resolution)."""
    vae = components.get("vae")
    if not vae or name != "LTX-Video-0.9.5":
        return name
    return f"LTX-Video-{vae_version_of_config(vae)}"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """Nothing beyond the shape plan: every LTX-Video tensor is checked by name and shape."""


# -- the single file's config (safetensors metadata "config") ----------------------------------------------------
def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config of a single-file release or fine-tune, from the transformer config in its metadata (so a
    custom-size single file exports without --base)."""
    original = (facts.get("release_config") or {}).get("transformer")
    if not isinstance(original, dict):
        return None
    return diffusers_config(original, "the checkpoint's metadata config")


def diffusers_config(original: Mapping[str, Any], where: str) -> dict:
    """Transformer3DModel's config (the LTX-Video repo's) as LTXVideoTransformer3DModel's."""
    try:
        config = {
            "num_attention_heads": int(original["num_attention_heads"]),
            "attention_head_dim": int(original["attention_head_dim"]),
            "num_layers": int(original["num_layers"]),
            "in_channels": int(original["in_channels"]),
            "out_channels": int(original.get("out_channels") or original["in_channels"]),
            "cross_attention_dim": int(original["cross_attention_dim"]),
            "caption_channels": int(original["caption_channels"]),
        }
    except (KeyError, TypeError, ValueError):
        raise CogExportError(f"{where} is not a complete LTX-Video transformer config (num_attention_heads, "
                             "attention_head_dim, num_layers, in_channels, cross_attention_dim, caption_channels)") \
            from None
    for name in ("norm_eps", "norm_elementwise_affine", "attention_bias", "activation_fn"):
        if name in original:
            config[name] = original[name]
    return config


def original_metadata(config: Mapping[str, Any], task: str) -> dict[str, str]:
    """The safetensors metadata a single-file release carries: {"config": JSON with the transformer's config in the
    LTX-Video repo's own names} (the original VAE's block-list config is not derived; see README)."""
    transformer = {
        "_class_name": ORIGINAL_CLASS,
        "num_attention_heads": config["num_attention_heads"],
        "attention_head_dim": config["attention_head_dim"],
        "in_channels": config["in_channels"],
        "out_channels": config["out_channels"],
        "num_layers": config["num_layers"],
        "cross_attention_dim": config["cross_attention_dim"],
        "caption_channels": config["caption_channels"],
        "attention_bias": config["attention_bias"],
        "activation_fn": config["activation_fn"],
        "norm_elementwise_affine": config["norm_elementwise_affine"],
        "norm_eps": config["norm_eps"],
        "qk_norm": "rms_norm",
        "standardization_norm": "rms_norm",
        "adaptive_norm": "single_scale_shift",
        "positional_embedding_type": "rope",
        "positional_embedding_theta": 10000.0,
        "positional_embedding_max_pos": [20, 2048, 2048],
        "timestep_scale_multiplier": 1000,
    }
    return {"config": json.dumps({"transformer": transformer})}
