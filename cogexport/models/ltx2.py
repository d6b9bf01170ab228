"""The LTX-2 facts that need code: what a Diffusers-named LTX2VideoTransformer3DModel's shapes say about it (its size
and which version's layers it has), and the config JSON a release file keeps in its header metadata, read into
Diffusers configs and written back from them. Everything else about the family is data in
key_maps/ltx2/family.toml.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from .ltx2_release_config import release_config, transformer_config
from .shape_facts import block_count, metadata_json, one_task, require

_NEEDED = ("proj_in.weight", "audio_proj_in.weight", "proj_out.weight", "audio_proj_out.weight")
LAYOUTS = {"2.0": "LTX-2-19B-dev", "2.3": "LTX-2.3-22B-dev", "2.5": "LTX-2.5-22B-dev"}  # each version's layout


def read_facts(shapes: Mapping[str, torch.Size]) -> dict[str, Any]:
    require(shapes, _NEEDED, "an LTX-2 transformer")
    caption = shapes.get("caption_projection.linear_1.weight")
    return {
        "hidden": shapes["proj_in.weight"][0],
        "in_channels": shapes["proj_in.weight"][1],
        "out_channels": shapes["proj_out.weight"][0],
        "audio_hidden": shapes["audio_proj_in.weight"][0],
        "audio_in_channels": shapes["audio_proj_in.weight"][1],
        "layers": block_count(shapes, "transformer_blocks."),
        "caption_channels": caption[1] if caption is not None else None,
        "version": version_of_names(shapes),
    }


def version_of_names(names: Sequence[str] | Mapping[str, Any]) -> str:
    """Which release's layers a Diffusers-named transformer has: 2.5 (a keyframe embedding, or 2.3's layers without
    the video feed-forward biases: the first 2.5 release had no keyframe embedding yet), 2.3 (gated attention and the
    prompt modulation), else 2.0."""
    if "keyframes_abs_pos_embedding" in names:
        return "2.5"
    if any(name.endswith(".to_gate_logits.weight") or name.startswith("prompt_adaln.") for name in names):
        return "2.5" if _video_feed_forward_unbiased(names) else "2.3"
    return "2.0"


def _video_feed_forward_unbiased(names: Sequence[str] | Mapping[str, Any]) -> bool:
    """Whether the video feed-forward layers have weights but no biases (2.5's; the audio ones keep theirs). The
    leading dot leaves out audio_ff."""
    weights = any(name.endswith(".ff.net.2.weight") for name in names)
    return weights and not any(name.endswith(".ff.net.2.bias") for name in names)


def release_facts(shapes: Mapping[str, torch.Size], metadata: Mapping[str, str]) -> dict[str, Any]:
    """What a release file says beside the transformer: the config JSON in its header metadata."""
    return metadata_json(metadata, "config", "release_config", "an LTX-2 release")


task_of = one_task("t2v")


def tasks_of(facts: Mapping[str, Any]) -> tuple[str, ...]:
    """LTX2Pipeline and LTX2ImageToVideoPipeline drive the same models: a --base pipeline or --model-type says which."""
    return ("t2v", "i2v")


def describe(facts: Mapping[str, Any]) -> str:
    return (f"LTX-{facts['version']} transformer, hidden size {facts['hidden']} (audio {facts['audio_hidden']}), "
            f"{facts['layers']} layers")


def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                   pipeline: Mapping[str, Any] | None = None) -> str:
    """The published variant a custom config is built like: 2.5's (video feed-forward without biases, or the
    keyframe embedding), 2.3's (gated, prompt-modulated layers), else 2.0's."""
    if not config.get("ff_bias", True) or config.get("use_keyframes_abs_pos_embedding"):
        return LAYOUTS["2.5"]
    return LAYOUTS["2.3" if config.get("gated_attn") or config.get("cross_attn_mod") else "2.0"]


def check_target(facts: Mapping[str, Any], config: Mapping[str, Any], where: str) -> None:
    """Nothing beyond the shape plan: every LTX-2 tensor is checked by name and shape."""


def config_beside(folders: Sequence[Path], facts: Mapping[str, Any]) -> dict | None:
    """The Diffusers config of a release file's transformer, from the config in its metadata (a custom-size release
    exports without --base)."""
    original = (facts.get("release_config") or {}).get("transformer")
    if not isinstance(original, dict):
        return None
    return transformer_config(original, "the checkpoint's metadata config")


def original_metadata(config: Mapping[str, Any], task: str | None,
                      components: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The header metadata of a release file: {"config": the JSON of every model written into it, as the LTX-2
    repository writes it}."""
    return {"config": json.dumps(release_config(config, components))}
