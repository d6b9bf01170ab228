"""The MiniMax-H3 facts that need code: what a Diffusers-named MiniMaxH3Transformer3DModel's shapes say about it,
the release's MiniMaxH3DiTModel config.json both ways, the order the release's module lists its tensors in (where its
shards are cut), and the pruned checkpoints refused by name. Everything else about the family is data in
key_maps/minimax_h3/.

FL2VA and Ref2VA have the same tensors and config: the shapes say "fl2va or ref2va", --model-type or --model-name says
which.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..errors import CogExportError
from .base_folder import read_json
from .shape_facts import block_count, require
from .told_apart import config_classes

ORIGINAL_CLASS = "MiniMaxH3DiTModel"
MODALITIES = 3  # video, text, audio: one row of AdaLN parameters per (timestep, modality)
_NEEDED = ("proj_in.weight", "audio_proj_in.weight", "context_embedder.weight", "norm_out.linear.weight",
           "transformer_blocks.0.attn.norm_q.weight", "transformer_blocks.0.attn.to_q.weight",
           "transformer_blocks.0.ff.net.2.weight")
# the release's config.json keys (DiffSynth-Studio's MiniMaxH3DiT arguments) -> MiniMaxH3Transformer3DModel's
_CONFIG_NAMES = {
    "num_layers": "num_layers", "token_refiner_num_layers": "num_refiner_layers", "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads", "attention_head_dim": "attention_head_dim",
    "ffn_hidden_size": "ffn_dim", "latents_dim": "in_channels", "audio_latents_dim": "audio_in_channels",
    "patch_size": "patch_size", "text_dim": "text_dim", "timestep_input_dim": "freq_dim",
    "time_embed_hidden_size": "time_embed_hidden_dim", "time_embed_dim": "time_embed_dim",
    "rope_inv_freq_len": "rope_freq_dim", "norm_eps": "norm_eps", "qk_norm_eps": "qk_norm_eps",
    "final_norm_eps": "final_norm_eps",
}


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "a MiniMax-H3 transformer")
    hidden, head_dim = shapes["proj_in.weight"][0], shapes["transformer_blocks.0.attn.norm_q.weight"][0]
    return {
        "hidden": hidden,
        "heads": shapes["transformer_blocks.0.attn.to_q.weight"][0] // head_dim,
        "head_dim": head_dim,
        "layers": block_count(shapes, "transformer_blocks."),
        "refiner_layers": block_count(shapes, "token_refiner.refiner_blocks."),
        "ffn_dim": shapes["transformer_blocks.0.ff.net.2.weight"][1],
        "video_patch_dim": shapes["proj_in.weight"][1],
        "audio_channels": shapes["audio_proj_in.weight"][1],
        "text_dim": shapes["context_embedder.weight"][1],
        "time_embed_dim": shapes["norm_out.linear.weight"][1],
    }


def tasks_of(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """Both partitions have the same tensors: FL2VA (the default) or Ref2VA."""
    return ("fl2va", "ref2va")


def task_of(facts: Mapping[str, Any]) -> str:
    return tasks_of(facts)[0]


def describe(facts: Mapping[str, Any]) -> str:
    return (f"MiniMax-H3 transformer, hidden size {facts['hidden']} ({facts['heads']} heads), {facts['layers']} "
            f"layers, {facts['refiner_layers']} text refiner layers")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    return "MiniMax-H3-FL2VA"


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """Nothing the shape plan cannot see: every tensor of the class is planned by name and shape."""


def release_facts(shapes: Mapping[str, Any], metadata: Mapping[str, str]) -> dict[str, Any]:
    """A pruned checkpoint (Comfy-Org's *_pruned_* files and their derivatives) is another model: its timestep
    embedder is a table of precomputed embeddings and its AdaLN projections take them without the SiLU, which
    MiniMaxH3Transformer3DModel cannot hold. Refused by name, never exported without it."""
    pruned = next((name for name in shapes if name.split(".")[-1] == "adaln_t_table"), None)
    if pruned is not None:
        raise CogExportError(f"the checkpoint holds {pruned}: it is a pruned MiniMax-H3 (a precomputed timestep "
                             "table in place of the timestep embedder), which MiniMaxH3Transformer3DModel cannot "
                             "hold; export the unpruned release (MiniMaxAI/MiniMax-H3) or its unpruned single file")
    return {}


# -- the release's config.json -------------------------------------------------------------------------------------
def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config of a release partition (or a fine-tune kept beside its config), from the MiniMaxH3DiTModel
    config.json beside the weights, so a release folder exports without --base."""
    for folder in folders:
        path = Path(folder) / "config.json"
        if path.is_file():
            original = read_json(path)
            if isinstance(original, dict) and ORIGINAL_CLASS in config_classes(original):
                return diffusers_config(original, path)
    return None


def diffusers_config(original: Mapping[str, Any], where: Path | str) -> dict:
    """MiniMaxH3DiTModel's constructor arguments as MiniMaxH3Transformer3DModel's; those the original derives
    (adaln_out_features, final_adaln_out_features) are checked against what the Diffusers class builds."""
    config = {name: original[key] for key, name in _CONFIG_NAMES.items() if key in original}
    if "patch_size" in config:
        config["patch_size"] = tuple(config["patch_size"])
    hidden = config.get("hidden_size", 5376)
    derived = {"adaln_out_features": 6 * hidden * MODALITIES, "final_adaln_out_features": 2 * hidden}
    for key, value in derived.items():
        if key in original and original[key] != value:
            raise CogExportError(f"{where} says {key} {original[key]}, but a MiniMax-H3 of hidden size {hidden} has "
                                 f"{value}; MiniMaxH3Transformer3DModel cannot hold it")
    return config


def original_config(config: Mapping[str, Any], task: str | None) -> dict | None:
    """The MiniMaxH3DiTModel config.json the release keeps beside its shards, for a MiniMaxH3Transformer3DModel
    config (every argument written, the derived ones too)."""
    if "num_refiner_layers" not in config:
        return None
    original: dict[str, Any] = {"architectures": [ORIGINAL_CLASS]}
    for key, name in _CONFIG_NAMES.items():
        value = config[name]
        original[key] = list(value) if isinstance(value, tuple) else value
    original["adaln_out_features"] = 6 * config["hidden_size"] * MODALITIES
    original["final_adaln_out_features"] = 2 * config["hidden_size"]
    return dict(sorted(original.items()))


# -- the order of the release's module -------------------------------------------------------------------------------
# MiniMaxH3DiT registers its parts in this order (the shards are cut in it); within a block, these in turn.
_TOP = ("video_patch_proj.", "audio_patch_proj.", "condition_proj.", "time_embedder.proj_in.",
        "time_embedder.proj_out.", "rope.", "token_refiner.blocks.", "token_refiner.final_norm.", "blocks.",
        "final_layer.norm.", "final_layer.adaln_proj.", "final_layer.video_out.", "final_layer.audio_out.")
_IN_BLOCK = ("norm1.", "norm2.", "attn.qkv_proj.", "attn.q_norm.", "attn.k_norm.", "attn.out_proj.", "mlp.fc1.",
             "mlp.fc2.", "adaln_proj.")
_BLOCK = re.compile(r"^(token_refiner\.blocks\.|blocks\.)(\d+)\.(.*)$")


def original_order(names: Sequence[str]) -> list[str]:
    """The names in the order MiniMaxH3DiT's state_dict lists them (its register order), weight before bias."""
    def position(name: str) -> tuple:
        block = _BLOCK.match(name)
        if block:
            prefix, index, rest = block.groups()
            return (_TOP.index(prefix), int(index), _place(rest, _IN_BLOCK), rest.endswith(".bias"))
        return (_place(name, _TOP), 0, 0, name.endswith(".bias"))

    return sorted(names, key=position)


def _place(name: str, order: Sequence[str]) -> int:
    return next((index for index, prefix in enumerate(order) if name.startswith(prefix)), len(order))
