"""The Wan facts that need code: what a Diffusers-named WanTransformer3DModel's shapes say about it, which published
variant a custom config is built like, and the WanModel config.json the original layout keeps beside its weights
(both ways). Everything else about the family is data in key_maps/wan/family.toml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .diffusers_cache import diffusers_version
from .original_config import original_config_beside
from .shape_facts import block_count, require

_NEEDED = ("patch_embedding.weight", "proj_out.weight", "condition_embedder.text_embedder.linear_1.weight")
IMAGE_EMBEDDER = "condition_embedder.image_embedder."
ORIGINAL_CLASS = "WanModel"


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a Wan transformer")
    patch = shapes["patch_embedding.weight"]  # Conv3d [D, C_in, pt, ph, pw]
    per_patch = patch[2:].numel()
    ffn = shapes.get("blocks.0.ffn.net.0.proj.weight")
    image_norm, image_positions = shapes.get(f"{IMAGE_EMBEDDER}norm1.weight"), shapes.get(f"{IMAGE_EMBEDDER}pos_embed")
    added_k = shapes.get("blocks.0.attn2.add_k_proj.weight")
    return {
        "hidden": patch[0],
        "in_channels": patch[1],
        "out_channels": shapes["proj_out.weight"][0] // per_patch,
        "patch_size": list(patch[2:]),
        "layers": block_count(shapes, "blocks."),
        "ffn": ffn[0] if ffn is not None else None,
        "text_dim": shapes["condition_embedder.text_embedder.linear_1.weight"][1],
        "image_branch": image_norm is not None,
        "image_positions": image_positions is not None,
        # what the original config.json leaves out: CLIP's width (1280 in the releases), the added k/v input width
        # and FLF2V's image token count (2 x 257), all visible in the shapes
        "image_dim": image_norm[0] if image_norm is not None else None,
        "added_kv_dim": added_k[1] if added_k is not None else None,
        "image_tokens": image_positions[1] if image_positions is not None else None,
    }


def task_of(facts: Mapping[str, Any]) -> str:
    if facts["image_positions"]:
        return "flf2v"
    if facts["image_branch"] or facts["in_channels"] > facts["out_channels"]:
        return "i2v"  # Wan 2.1 I2V (CLIP image branch) or 2.2 I2V (image latents concatenated: 36 = 16 + 20)
    if facts["in_channels"] == 48:
        return "ti2v"  # Wan 2.2 TI2V-5B: the 48-channel VAE's latents, the image through the first latent frame
    return "t2v"


def describe(facts: Mapping[str, Any]) -> str:
    return (f"Wan transformer, hidden size {facts['hidden']}, {facts['layers']} layers, in_channels "
            f"{facts['in_channels']}" + (", with an image branch" if facts["image_branch"] else ""))


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The published variant a custom config (and, from a pipeline, its settings) is built like."""
    pipeline = pipeline or {}
    in_channels, out_channels = config.get("in_channels", 16), config.get("out_channels", 16)
    if experts or pipeline.get("boundary_ratio") is not None:
        return "Wan2.2-I2V-A14B" if in_channels > out_channels else "Wan2.2-T2V-A14B"
    if pipeline.get("expand_timesteps") or in_channels == 48:
        return "Wan2.2-TI2V-5B"
    if config.get("pos_embed_seq_len"):
        return "Wan2.1-FLF2V-14B-720P"
    if config.get("image_dim"):
        return "Wan2.1-I2V-14B-480P"
    if in_channels > out_channels:
        return "Wan2.2-I2V-A14B"
    return "Wan2.1-T2V-14B" if config.get("num_attention_heads", 40) * config.get("attention_head_dim", 128) >= 5120 \
        else "Wan2.1-T2V-1.3B"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """What the shape plan cannot see: FLF2V's image position table needs a config that keeps it."""
    if facts["image_positions"] and not config.get("pos_embed_seq_len"):
        raise CogExportError(f"{where} has FLF2V's image position table (img_emb.emb_pos), but the config it would go "
                             "into has no pos_embed_seq_len; check --base")


# -- the original layout's config.json ---------------------------------------------------------------------------
def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config for an original-layout release or fine-tune, from the WanModel config.json beside its
    weights (so a custom-size original checkpoint exports without --base). What the released files leave out (text_dim,
    patch_size) is read off the shapes."""
    found = original_config_beside(folders, (ORIGINAL_CLASS,), strict=False)
    if found is None:
        return None
    original, path = found
    return config_from_release(original, facts, path)


def config_from_release(original: Mapping[str, Any], facts: Mapping[str, Any], where: Path | str) -> dict:
    """The Diffusers config of a WanModel-like config.json as the releases write it: what they leave out (text_dim,
    patch_size) read off the shapes."""
    shapes_say = {"text_dim": facts["text_dim"], "patch_size": facts["patch_size"]}
    return diffusers_config({**shapes_say, **original}, facts, where)


def diffusers_config(original: Mapping[str, Any], facts: Mapping[str, Any], where: Path | str) -> dict:
    """WanModel's constructor arguments as WanTransformer3DModel's. text_dim, patch_size, qk_norm and
    cross_attn_norm are left out of the released files: their defaults (4096, [1, 2, 2], true, true) hold. The image
    branch is read off the shapes, not model_type: Wan 2.2's I2V-A14B experts say "i2v" and have none."""
    try:
        heads, dim = int(original["num_heads"]), int(original["dim"])
        config = {
            "num_attention_heads": heads, "attention_head_dim": dim // heads, "in_channels": int(original["in_dim"]),
            "out_channels": int(original["out_dim"]), "ffn_dim": int(original["ffn_dim"]),
            "num_layers": int(original["num_layers"]), "freq_dim": int(original.get("freq_dim", 256)),
            "text_dim": int(original.get("text_dim", 4096)), "eps": float(original.get("eps", 1e-6)),
            "patch_size": list(original.get("patch_size", [1, 2, 2])),
        }
    except (KeyError, TypeError, ValueError):
        raise CogExportError(f"{where} is not a complete WanModel config (dim, num_heads, ffn_dim, num_layers, in_dim, "
                             "out_dim)") from None
    if not original.get("qk_norm", True):
        config["qk_norm"] = None
    if not original.get("cross_attn_norm", True):
        config["cross_attn_norm"] = False
    if facts["image_branch"]:
        config.update(image_dim=int(facts["image_dim"]), added_kv_proj_dim=int(facts["added_kv_dim"]))
    if facts["image_positions"]:
        config["pos_embed_seq_len"] = int(facts["image_tokens"])
    return config


def original_config(config: Mapping[str, Any], task: str) -> dict:
    """The WanModel config.json the Wan repo writes beside its weights (WanModel is a Diffusers ConfigMixin, hence
    the version key), for a WanTransformer3DModel config."""
    original = {
        "_class_name": ORIGINAL_CLASS, "_diffusers_version": diffusers_version(),
        "dim": config["num_attention_heads"] * config["attention_head_dim"],
        "eps": config["eps"], "ffn_dim": config["ffn_dim"], "freq_dim": config["freq_dim"],
        "in_dim": config["in_channels"], "model_type": task, "num_heads": config["num_attention_heads"],
        "num_layers": config["num_layers"], "out_dim": config["out_channels"], "text_len": 512,
    }
    if config["text_dim"] != 4096:
        original["text_dim"] = config["text_dim"]
    if list(config["patch_size"]) != [1, 2, 2]:
        original["patch_size"] = list(config["patch_size"])
    return original
