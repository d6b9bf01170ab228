"""The strength an adapter was trained at: each module's alpha, from what the file or the run recorded.

In order: --lora-alpha; the file's own .alpha tensors (kohya, ComfyUI, LyCORIS); the adapter config the file or run
recorded (Diffusers' lora_adapter_metadata, prefixed with the pipeline component or, as SimpleTuner's ComfyUI files
have it, not; finetrainers' lora_config, PEFT's adapter_config.json (LoraConfig, LoKrConfig, LoHaConfig), a SAT
model_config.json or training YAML beside the checkpoint; with PEFT's alpha_pattern, rank_pattern and use_rslora);
else what the layout's table says: what the format means (ComfyUI without .alpha: scale 1; DiffSynth: the strength
is in lora_B) or a documented default that is only a guess (then a warning).

A LoKr or LoHa module divides alpha by its low-rank factor's rank; a LoKr whose factors are both whole by what its
trainer divides by (lycoris.py): musubi-tuner's own LoKr the larger side of w2, a PEFT adapter its config's r, the
rest nothing (alpha is not applied: scale 1).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ..errors import CogExportError
from ..models.family import DEFAULT_TRANSFORMER_FOLDER, all_transformer_folders
from .adapter import LoraModule
from .parts import LORA, LOKR_W2

DIFFUSERS_METADATA = "lora_adapter_metadata"
FINETRAINERS_METADATA = "lora_config"


@dataclass
class Recorded:
    """The LoRA settings a run recorded, and where."""

    config: dict
    where: str | None
    component: str | None = None  # the pipeline component Diffusers' lora_adapter_metadata keyed them by


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


def recorded_config(metadata: Mapping[str, str] | None, folders: Iterable[Path], where: str = "the file") -> Recorded:
    """The LoRA settings (lora_alpha, alpha_pattern, use_rslora, ...) the file's header or the run's side files
    record."""
    metadata = metadata or {}
    raw = metadata.get(DIFFUSERS_METADATA)
    if raw:
        config, component = _diffusers_metadata(raw, where)
        if "lora_alpha" not in config:
            raise CogExportError(f"the file's {DIFFUSERS_METADATA} is not valid (expected JSON with "
                                 f"{component or DEFAULT_TRANSFORMER_FOLDER}.lora_alpha)")
        return Recorded(config, f"the file's {DIFFUSERS_METADATA}", component)
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


def _diffusers_metadata(raw: str, where: str) -> tuple[dict, str | None]:
    """Diffusers' LoraConfig arguments, each prefixed with the pipeline component they are for (a transformer
    folder of some family's tasks), and that component; SimpleTuner's ComfyUI files keep the same JSON without the
    prefix (component None). Two components' configs in one file are refused: whose would apply is not said."""
    try:
        values = json.loads(raw)
    except ValueError:
        return {}, None
    if not isinstance(values, dict):
        return {}, None
    by_component: dict[str, dict] = {}
    for key, value in values.items():
        component = next((c for c in all_transformer_folders() if key.startswith(f"{c}.")), None)
        if component is not None:
            by_component.setdefault(component, {})[key[len(component) + 1:]] = value
    if len(by_component) > 1:
        raise CogExportError(f"{where}: its {DIFFUSERS_METADATA} holds the adapter configs of "
                             f"{len(by_component)} pipeline components ({', '.join(sorted(by_component))}); cogexport "
                             "reads one model's adapter: save each component's adapter in a file of its own")
    if by_component:
        return next(iter(by_component.values())), next(iter(by_component))
    return values, None


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



# -- each module's alpha ----------------------------------------------------------------------------------------------
LYCORIS_PEFT_TYPES = ("LOKR", "LOHA")


@dataclass
class Strength:
    """What there is to know about a file's strength, in order of precedence."""

    where: str  # the file or run, for messages
    override: float | None  # --lora-alpha
    alphas: dict[str, tuple[str, float]]  # the file's .alpha tensors, by module (in the file's naming): (key, value)
    recorded: Recorded
    default: Callable[[int], float]  # the table's default alpha for a rank
    default_reason: str
    default_recorded: bool
    whole_w2: bool = False  # musubi-tuner's own LoKr: a whole w2 divides alpha by its larger side
    notes: list[str] = field(default_factory=list)

    @property
    def lycoris_config(self) -> dict | None:
        """PEFT's LoKrConfig / LoHaConfig, when that is what the run recorded."""
        config = self.recorded.config
        return config if config.get("peft_type") in LYCORIS_PEFT_TYPES else None


def set_strengths(modules: Mapping[str, LoraModule], strength: Strength) -> tuple[str, bool]:
    """Each module's alpha (and a LoKr's or LoHa's divisor); returns where they came from and whether the file or
    run recorded them."""
    recorded = strength.recorded
    if strength.override is not None:
        source, flag, alpha_of = "--lora-alpha", True, _override(strength)
    elif strength.alphas:
        source, flag, alpha_of = "the file's .alpha tensors", True, _from_tensors(strength)
    elif recorded.config.get("lora_alpha") is not None or strength.lycoris_config:
        source, flag, alpha_of = recorded.where, True, _from_config(strength)
    else:
        source, flag, alpha_of = strength.default_reason, strength.default_recorded, _from_default(strength)
    for name, module in modules.items():
        if module.kind is not None:
            module.dim = _divisor(name, module, strength)
            applied = module.kind == LORA or module.dim is not None
            module.alpha = alpha_of(name, module) if applied else None  # a whole LoKr at scale 1: no alpha applies
    return source, flag


def _divisor(name: str, module: LoraModule, strength: Strength) -> int | None:
    """What a LoKr's or LoHa's alpha is divided by (a LoRA's is its rank)."""
    if module.kind == LORA:
        return None
    config = strength.lycoris_config
    if config is not None and not strength.alphas:
        r = _pattern_or(config, "rank_pattern", "r", name)
        if module.rank is not None and r != module.rank:
            raise CogExportError(f"{strength.where}: {name}'s factors have rank {module.rank}, but "
                                 f"{strength.recorded.where} says r {r}; the adapter and its config do not belong "
                                 "together")
        return int(r)
    if module.rank is not None:
        return module.rank
    if strength.whole_w2 and LOKR_W2 in module.factors:
        return max(module.factors[LOKR_W2].shape)
    return None


def _override(strength: Strength) -> Callable[[str, LoraModule], float]:
    alpha = positive(strength.override, "--lora-alpha")
    return lambda name, module: alpha


def _from_tensors(strength: Strength) -> Callable[[str, LoraModule], float]:
    # kohya, ComfyUI and LyCORIS apply a module without .alpha at scale 1
    def alpha(name: str, module: LoraModule) -> float:
        if name not in strength.alphas:
            return float(module.rank if module.kind == LORA else module.dim)
        key, value = strength.alphas[name]
        return positive(value, f"{strength.where}: {key}")
    return alpha


def _from_config(strength: Strength) -> Callable[[str, LoraModule], float]:
    config, where = strength.recorded.config, strength.recorded.where

    def alpha(name: str, module: LoraModule) -> float:
        if module.kind != LORA and strength.lycoris_config is not None:
            return positive(_pattern_or(config, "alpha_pattern", "alpha", name), f"alpha ({where})")
        if config.get("lora_alpha") is None:  # a LoKr config says nothing about a LoRA module beside it
            return strength.default(module.rank)
        return positive(_pattern_or(config, "alpha_pattern", "lora_alpha", name), f"lora_alpha ({where})")
    return alpha


def _from_default(strength: Strength) -> Callable[[str, LoraModule], float]:
    return lambda name, module: strength.default(module.rank if module.kind == LORA else module.dim)


def _pattern_or(config: Mapping, pattern: str, usual: str, name: str) -> object:
    value = pattern_value(config.get(pattern) or {}, name)
    return config.get(usual) if value is None else value


def whole_w2_rule(keys: Iterable[str], metadata: Mapping[str, str] | None) -> bool:
    """Whether a file is musubi-tuner's own LoKr (networks.lokr), which divides a whole w2's alpha by its larger side:
    its network-level lokr_factor tensor, or its training metadata, says so."""
    return "lokr_factor" in set(keys) or (metadata or {}).get("ss_network_module") == "networks.lokr"
