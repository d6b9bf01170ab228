"""LoRA runs: an adapter that Diffusers applies at exactly the trained strength, or the adapter fused into the model.

A LoRA checkpoint (SAT's LoraMixin, PEFT inside a DeepSpeed or DDP checkpoint, or a Diffusers LoRA file) is
translated by its key map into Diffusers names: base weights (when the checkpoint holds them) and
``<module>.lora_A.weight`` [r, in] / ``<module>.lora_B.weight`` [out, r]. The trained strength is alpha / r:
alpha comes from --lora-alpha, else what the run recorded (the file's lora_adapter_metadata, a PEFT
adapter_config.json, a SAT model_config.json or training YAML), else the layout's documented default. The
adapter file carries r, lora_alpha and target_modules in ``lora_adapter_metadata``, which Diffusers reads into
peft's LoraConfig, so no scale has to be passed by hand. Fusing computes W + (alpha / r) B A in fp32.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import torch

from .errors import CogExportError
from .keymap.plan import plan_translation, translate_shapes
from .keymap.table import KeyMapTable
from .lazy import LazyTensor
from .models.family import ModelFamily
from .models.recognize import choose_table

LORA_WEIGHTS_NAME = "pytorch_lora_weights.safetensors"
LORA_METADATA_KEY = "lora_adapter_metadata"
PIPELINE_PREFIX = "transformer."  # the pipeline component the adapter belongs to, as Diffusers names it
_A, _B = ".lora_A.weight", ".lora_B.weight"


def is_lora_key(name: str) -> bool:
    return name.endswith((_A, _B))


@dataclass
class LoraAdapter:
    """What a LoRA checkpoint holds, read from names and shapes only."""

    family: ModelFamily
    table: KeyMapTable
    ranks: dict[str, int]  # module path -> rank
    alpha: float
    alpha_source: str
    alpha_recorded: bool  # False: the run saved no alpha and a default is assumed
    has_base_weights: bool
    alpha_pattern: dict[str, float] = field(default_factory=dict)  # module path -> its alpha, where not ``alpha``
    use_rslora: bool = False  # rank-stabilised LoRA: the strength is alpha / sqrt(r)
    warnings: list[str] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return Counter(self.ranks.values()).most_common(1)[0][0]

    @property
    def blocks_needed(self) -> int:
        """How many transformer blocks the adapted model has at least (the highest adapted block + 1)."""
        return max((int(m.split(".")[1]) + 1 for m in self.ranks if m.startswith("transformer_blocks.")), default=0)

    @property
    def target_modules(self) -> list[str]:
        """Module names as PEFT matches them (by suffix): to_q, to_out.0, ff.net.2, ..."""
        names = set()
        for module in self.ranks:
            parts = module.split(".")
            tail = parts[2:] if parts[0] == "transformer_blocks" else parts
            names.add(".".join(tail[1:] if tail[0] == "attn1" else tail))
        return sorted(names)

    @property
    def layers(self) -> int:
        return len({m.split(".")[1] for m in self.ranks if m.startswith("transformer_blocks.")})

    def scale(self, module: str | None = None) -> float:
        """The strength B A is applied at: one module's, or (no module) that of the usual rank and alpha."""
        rank = self.ranks[module] if module else self.rank
        alpha = self.alpha_pattern.get(module, self.alpha) if module else self.alpha
        return alpha / (math.sqrt(rank) if self.use_rslora else rank)

    def targets_in(self, model_schema: Mapping[str, torch.Size]) -> list[str]:
        """target_modules for a model with this schema: the short names when they pick out exactly the adapted
        modules, else every adapted module's path (PEFT would otherwise add zero adapters to the others)."""
        short = self.target_modules
        linear = [name[: -len(".weight")] for name, shape in model_schema.items()
                  if name.endswith(".weight") and len(shape) == 2]
        picked = {module for module in linear if any(module == t or module.endswith("." + t) for t in short)}
        return short if picked == set(self.ranks) else sorted(self.ranks)

    def metadata(self, model_schema: Mapping[str, torch.Size]) -> dict:
        """Diffusers' lora_adapter_metadata: LoraConfig arguments, prefixed with the pipeline component."""
        config: dict = {"r": self.rank, "lora_alpha": self.alpha, "target_modules": self.targets_in(model_schema)}
        pattern = {module: rank for module, rank in self.ranks.items() if rank != self.rank}
        if pattern:
            config["rank_pattern"] = pattern
        if self.alpha_pattern:
            config["alpha_pattern"] = dict(self.alpha_pattern)
        if self.use_rslora:
            config["use_rslora"] = True
        return {f"{PIPELINE_PREFIX}{key}": value for key, value in config.items()}

    def describe(self) -> str:
        extras = (", per-module alphas" if self.alpha_pattern else "") + (", rank-stabilised" if self.use_rslora else "")
        return (f"rank {self.rank}, lora_alpha {self.alpha:g} ({self.alpha_source}), scale {self.scale():g}{extras}, "
                f"{len(self.ranks)} modules ({', '.join(self.target_modules)}) in {self.layers} layers")


def read_adapter(source: Mapping[str, LazyTensor], where: str, alpha_override: float | None = None,
                 folders: Iterable[Path] = (), metadata: Mapping[str, str] | None = None) -> LoraAdapter:
    family, table = choose_table(source, "lora", "LoRA", where)
    shapes = translate_shapes(table, {name: tensor.shape for name, tensor in source.items()})
    unsupported = [name for name in shapes if ".lora_" in name and not is_lora_key(name)]
    if unsupported:
        raise CogExportError(f"{where}: {unsupported[0]} belongs to a LoRA variant that Diffusers' {family.name} LoRA "
                             "files cannot carry (DoRA magnitudes, LoRA biases, ...); cogexport exports plain lora_A/lora_B "
                             "adapters")
    ranks: dict[str, int] = {}
    for name, shape in shapes.items():
        if not name.endswith(_A):
            continue
        module = name[: -len(_A)]
        partner = shapes.get(module + _B)
        if partner is None:
            raise CogExportError(f"{where}: {module} has a lora_A but no lora_B")
        if len(shape) != 2 or len(partner) != 2 or shape[0] != partner[1]:
            raise CogExportError(f"{where}: the adapter of {module} is inconsistent: lora_A {tuple(shape)}, "
                                 f"lora_B {tuple(partner)} (expected [r, in] and [out, r])")
        ranks[module] = shape[0]
    orphans = [n[: -len(_B)] for n in shapes if n.endswith(_B) and n[: -len(_B)] not in ranks]
    if orphans:
        raise CogExportError(f"{where}: {orphans[0]} has a lora_B but no lora_A")
    if not ranks:
        raise CogExportError(f"{where} has LoRA names but no adapter pairs")
    recorded, recorded_where = _recorded_config(metadata, folders)
    for option in ("use_dora", "lora_bias"):
        if recorded.get(option):
            raise CogExportError(f"{where} was trained with {option} ({recorded_where}), which Diffusers' "
                                 f"{family.name} LoRA files cannot carry; cogexport exports plain lora_A/lora_B adapters")
    if alpha_override is not None:
        alpha, alpha_source, alpha_recorded = _positive(alpha_override, "--lora-alpha"), "--lora-alpha", True
    elif recorded.get("lora_alpha") is not None:
        alpha = _positive(recorded["lora_alpha"], f"lora_alpha ({recorded_where})")
        alpha_source, alpha_recorded = recorded_where, True
    else:
        defaults = table.lora
        alpha, alpha_source = float(defaults["default_alpha"]), defaults["default_alpha_reason"]
        alpha_recorded = bool(defaults.get("alpha_recorded"))
    adapter = LoraAdapter(family, table, ranks, alpha, alpha_source, alpha_recorded,
                          has_base_weights=any(not is_lora_key(name) for name in shapes),
                          alpha_pattern=_per_module(recorded.get("alpha_pattern") or {}, ranks, alpha),
                          use_rslora=bool(recorded.get("use_rslora")))
    if not alpha_recorded:
        adapter.warnings.append(f"{where} does not record its LoRA alpha; using {alpha:g} ({alpha_source}); pass "
                                "--lora-alpha if the run used another")
    return adapter


def _positive(value: object, what: str) -> float:
    try:
        alpha = float(value)
    except (TypeError, ValueError):
        alpha = math.nan
    if not (math.isfinite(alpha) and alpha > 0):
        raise CogExportError(f"{what} {value!r} is not a positive number")
    return alpha


def _per_module(pattern: Mapping[str, float], modules: Iterable[str], alpha: float) -> dict[str, float]:
    """PEFT's alpha_pattern resolved to module paths: the first pattern that matches a module's name, or a dotted
    suffix of it, gives that module's alpha. Only modules whose alpha differs from ``alpha`` are listed."""
    resolved = {}
    for module in modules:
        key = next((key for key in pattern if re.match(rf"(.*\.)?({key})$", module)), None)
        if key is not None and float(pattern[key]) != alpha:
            resolved[module] = float(pattern[key])
    return resolved


def _recorded_config(metadata: Mapping[str, str] | None, folders: Iterable[Path]) -> tuple[dict, str | None]:
    """The LoRA settings the run recorded (lora_alpha, alpha_pattern, use_rslora, ...), and where they were found:
    the file's lora_adapter_metadata, else a PEFT adapter_config.json, a SAT model_config.json or a training YAML
    next to the checkpoint."""
    raw = (metadata or {}).get(LORA_METADATA_KEY)
    if raw:
        try:
            values = json.loads(raw)
            config = {key[len(PIPELINE_PREFIX):]: value for key, value in values.items() if key.startswith(PIPELINE_PREFIX)}
        except (ValueError, AttributeError):
            config = {}
        if "lora_alpha" not in config:
            raise CogExportError(f"the file's {LORA_METADATA_KEY} is not valid (expected JSON with "
                                 f"{PIPELINE_PREFIX}lora_alpha)")
        return config, "the file's lora_adapter_metadata"
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
                    raise CogExportError(f"{path} is not a valid PEFT adapter config (JSON object); repair or remove it")
                return tree, f"recorded in {path}"
            value = _find_key(tree, "lora_alpha")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return {"lora_alpha": value}, f"recorded in {path}"
    return {}, None


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


def lora_schema(adapter: LoraAdapter, model_schema: Mapping[str, torch.Size]) -> dict[str, torch.Size]:
    """The adapter's tensors as the model's linear layers make them: lora_A [r, in], lora_B [out, r]."""
    schema = {}
    for module, rank in adapter.ranks.items():
        weight = model_schema.get(f"{module}.weight")
        if weight is None or len(weight) != 2:
            raise CogExportError(f"the LoRA adapts {module}, which is not a linear layer of the model")
        schema[module + _A] = torch.Size([rank, weight[1]])
        schema[module + _B] = torch.Size([weight[0], rank])
    return schema


def plan_adapter(source: Mapping[str, LazyTensor], adapter: LoraAdapter, model_schema: Mapping[str, torch.Size],
                 where: str, *, check_shapes: bool = True) -> dict[str, LazyTensor]:
    """The adapter's tensors under Diffusers LoRA names, each adapting a linear layer of the model (and fitting its
    shape, unless the model's size is unknown and ``model_schema`` only stands for its layout)."""
    full = plan_translation(adapter.table, source, None, {}, what=where).tensors
    lora = {name: tensor for name, tensor in full.items() if is_lora_key(name)}
    schema = lora_schema(adapter, model_schema)
    if check_shapes:
        wrong = [f"{name} is {tuple(lora[name].shape)}, the model needs {tuple(shape)}"
                 for name, shape in schema.items() if lora[name].shape != shape]
        if wrong:
            raise CogExportError(f"{where}: the adapter does not fit the base model: {'; '.join(wrong[:3])}")
    return lora


def plan_fused(source: Mapping[str, LazyTensor], adapter: LoraAdapter, model_schema: Mapping[str, torch.Size],
               base_weights: Mapping[str, LazyTensor] | None, counts: Mapping[str, int],
               where: str) -> dict[str, LazyTensor]:
    """The model's tensors with every adapted weight replaced by W + (alpha / r) B A, computed in fp32."""
    adapter_schema = lora_schema(adapter, model_schema)
    if adapter.has_base_weights:
        plan = plan_translation(adapter.table, source, {**model_schema, **adapter_schema}, counts, what=where)
        base = {name: plan.tensors[name] for name in model_schema}
        lora = {name: plan.tensors[name] for name in adapter_schema}
    else:
        if base_weights is None:
            raise CogExportError(f"--lora fuse needs the base weights: {where} holds only the adapter; pass --base with "
                                 "the Diffusers pipeline or transformer folder (with its weights) it was trained on")
        base = dict(base_weights)
        lora = plan_adapter(source, adapter, model_schema, where)
    fused = dict(base)
    for module in adapter.ranks:
        weight, down, up = base[f"{module}.weight"], lora[module + _A], lora[module + _B]
        fused[f"{module}.weight"] = LazyTensor(weight.shape, torch.float32,
                                               _fuser(weight, down, up, adapter.scale(module)),
                                               f"{module}.weight + LoRA")
    return fused


def _fuser(weight: LazyTensor, down: LazyTensor, up: LazyTensor, scale: float):
    def fuse() -> torch.Tensor:
        # The order PEFT fuses in: delta = (B @ A) * scale, then W + delta.
        return weight.load().float() + (up.load().float() @ down.load().float()) * scale

    return fuse


def adapter_file_metadata(adapter: LoraAdapter, model_schema: Mapping[str, torch.Size]) -> dict[str, str]:
    """The safetensors header metadata Diffusers' save_lora_weights writes: format and the adapter config."""
    return {"format": "pt", LORA_METADATA_KEY: json.dumps(adapter.metadata(model_schema), indent=2, sort_keys=True)}
