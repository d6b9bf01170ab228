"""The strength an adapter was trained at: each module's alpha, from what the file or the run recorded.

In order: --lora-alpha; the file's own .alpha tensors (kohya, ComfyUI); the adapter config the file or run
recorded (Diffusers' lora_adapter_metadata, finetrainers' lora_config, PEFT's adapter_config.json, a SAT
model_config.json or training YAML beside the checkpoint; with PEFT's alpha_pattern and use_rslora); else what the
layout's table says: what the format means (ComfyUI without .alpha: scale 1; DiffSynth: the strength is in
lora_B) or a documented default that is only a guess (then a warning).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import CogExportError

DIFFUSERS_METADATA = "lora_adapter_metadata"
FINETRAINERS_METADATA = "lora_config"
PIPELINE_PREFIX = "transformer."  # the pipeline component a Diffusers adapter config belongs to


@dataclass
class Recorded:
    """The LoRA settings a run recorded, and where."""

    config: dict
    where: str | None


def positive(value: object, what: str) -> float:
    try:
        alpha = float(value)
    except (TypeError, ValueError):
        alpha = math.nan
    if not (math.isfinite(alpha) and alpha > 0):
        raise CogExportError(f"{what} {value!r} is not a positive number")
    return alpha


def pattern_value(pattern: Mapping[str, object], module: str) -> object | None:
    """PEFT's rank_pattern / alpha_pattern lookup: the first key that matches the module's name or a dotted
    suffix of it."""
    key = next((key for key in pattern if re.match(rf"(.*\.)?({key})$", module)), None)
    return None if key is None else pattern[key]


def recorded_config(metadata: Mapping[str, str] | None, folders: Iterable[Path]) -> Recorded:
    """The LoRA settings (lora_alpha, alpha_pattern, use_rslora, ...) the file's header or the run's side files
    record."""
    metadata = metadata or {}
    raw = metadata.get(DIFFUSERS_METADATA)
    if raw:
        try:
            values = json.loads(raw)
            config = {key[len(PIPELINE_PREFIX):]: value for key, value in values.items()
                      if key.startswith(PIPELINE_PREFIX)}
        except (ValueError, AttributeError):
            config = {}
        if "lora_alpha" not in config:
            raise CogExportError(f"the file's {DIFFUSERS_METADATA} is not valid (expected JSON with "
                                 f"{PIPELINE_PREFIX}lora_alpha)")
        return Recorded(config, f"the file's {DIFFUSERS_METADATA}")
    raw = metadata.get(FINETRAINERS_METADATA)
    if raw:
        try:
            config = json.loads(raw)
        except ValueError:
            config = None
        if not isinstance(config, dict) or "lora_alpha" not in config:
            raise CogExportError(f"the file's {FINETRAINERS_METADATA} metadata is not valid (expected finetrainers' "
                                 "JSON with lora_alpha)")
        return Recorded(config, f"the file's {FINETRAINERS_METADATA} (finetrainers)")
    for folder in dict.fromkeys(folders):
        candidates = [folder / "adapter_config.json", folder / "model_config.json",
                      *sorted(folder.glob("*.yaml")), *sorted(folder.glob("*.yml"))]
        for path in candidates:
            if not path.is_file():
                continue
            try:
                if path.suffix == ".json":
                    tree = json.loads(path.read_text(encoding="utf-8"))
                else:
                    import yaml

                    tree = yaml.safe_load(path.read_text(encoding="utf-8"))
            except Exception:  # a side file we cannot parse is not the checkpoint; look at the next one
                tree = None
            if path.name == "adapter_config.json":  # PEFT's LoraConfig, as saved: the run's own record
                if not isinstance(tree, dict):
                    raise CogExportError(f"{path} is not a valid PEFT adapter config (JSON object); repair or remove "
                                         "it")
                return Recorded(tree, f"recorded in {path}")
            value = _find_key(tree, "lora_alpha")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return Recorded({"lora_alpha": value}, f"recorded in {path}")
    return Recorded({}, None)


def _find_key(tree: object, key: str) -> object:
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = _find_key(value, key)
            if found is not None:
                return found
    elif isinstance(tree, list):
        for value in tree:
            found = _find_key(value, key)
            if found is not None:
                return found
    return None

