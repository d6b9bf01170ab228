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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import torch

from .errors import CogExportError
from .keymap.plan import plan_translation, translate_shapes
from .keymap.table import KeyMapTable
from .lazy import LazyTensor
from .models.recognize import LORA_TABLES, choose_table

LORA_WEIGHTS_NAME = "pytorch_lora_weights.safetensors"
LORA_METADATA_KEY = "lora_adapter_metadata"
PIPELINE_PREFIX = "transformer."  # the pipeline component the adapter belongs to, as Diffusers names it
_A, _B = ".lora_A.weight", ".lora_B.weight"


def is_lora_key(name: str) -> bool:
    return name.endswith((_A, _B))


@dataclass
class LoraAdapter:
    """What a LoRA checkpoint holds, read from names and shapes only."""

    table: KeyMapTable
    ranks: dict[str, int]  # module path -> rank
    alpha: float
    alpha_source: str
    alpha_recorded: bool  # False: the run saved no alpha and a default is assumed
    has_base_weights: bool
    warnings: list[str] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return Counter(self.ranks.values()).most_common(1)[0][0]

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

    def scale(self, module: str) -> float:
        return self.alpha / self.ranks[module]

    def metadata(self) -> dict:
        """Diffusers' lora_adapter_metadata: LoraConfig arguments, prefixed with the pipeline component."""
        config: dict = {"r": self.rank, "lora_alpha": self.alpha, "target_modules": self.target_modules}
        pattern = {module: rank for module, rank in self.ranks.items() if rank != self.rank}
        if pattern:
            config["rank_pattern"] = pattern
        return {f"{PIPELINE_PREFIX}{key}": value for key, value in config.items()}

    def describe(self) -> str:
        return (f"rank {self.rank}, lora_alpha {self.alpha:g} ({self.alpha_source}), scale {self.alpha / self.rank:g}, "
                f"{len(self.ranks)} modules ({', '.join(self.target_modules)}) in {self.layers} layers")


def read_adapter(source: Mapping[str, LazyTensor], where: str, alpha_override: float | None = None,
                 folders: Iterable[Path] = (), metadata: Mapping[str, str] | None = None) -> LoraAdapter:
    table = choose_table(source, LORA_TABLES, "LoRA", where)
    shapes = translate_shapes(table, {name: tensor.shape for name, tensor in source.items()})
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
    alpha, alpha_source, recorded = _resolve_alpha(table, alpha_override, folders, metadata)
    adapter = LoraAdapter(table, ranks, alpha, alpha_source, recorded,
                          has_base_weights=any(not is_lora_key(name) for name in shapes))
    if not recorded:
        adapter.warnings.append(f"{where} does not record its LoRA alpha; using {alpha:g} ({alpha_source}); pass "
                                "--lora-alpha if the run used another")
    return adapter


def _resolve_alpha(table: KeyMapTable, override: float | None, folders: Iterable[Path],
                   metadata: Mapping[str, str] | None) -> tuple[float, str, bool]:
    if override is not None:
        return float(override), "--lora-alpha", True
    recorded = _alpha_in_metadata(metadata) or _alpha_in_saved_config(folders)
    if recorded is not None:
        return recorded[0], recorded[1], True
    defaults = table.lora
    return float(defaults["default_alpha"]), defaults["default_alpha_reason"], bool(defaults.get("alpha_recorded"))


def _alpha_in_metadata(metadata: Mapping[str, str] | None) -> tuple[float, str] | None:
    raw = (metadata or {}).get(LORA_METADATA_KEY)
    if not raw:
        return None
    try:
        values = json.loads(raw)
        return float(values[f"{PIPELINE_PREFIX}lora_alpha"]), "the file's lora_adapter_metadata"
    except (ValueError, KeyError, TypeError):
        raise CogExportError(f"the file's {LORA_METADATA_KEY} is not valid (expected JSON with "
                             f"{PIPELINE_PREFIX}lora_alpha)") from None


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


def _alpha_in_saved_config(folders: Iterable[Path]) -> tuple[float, str] | None:
    """lora_alpha from a config the run saved next to its weights (PEFT, SAT, training YAML)."""
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
                continue
            value = _find_key(tree, "lora_alpha")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value), f"recorded in {path}"
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


def plan_adapter(source: Mapping[str, LazyTensor], adapter: LoraAdapter, model_schema: Mapping[str, torch.Size] | None,
                 where: str) -> dict[str, LazyTensor]:
    """The adapter's tensors under Diffusers LoRA names (checked against the model when its schema is known)."""
    full = plan_translation(adapter.table, source, None, {}, what=where).tensors
    lora = {name: tensor for name, tensor in full.items() if is_lora_key(name)}
    if model_schema is not None:
        schema = lora_schema(adapter, model_schema)
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


def adapter_file_metadata(adapter: LoraAdapter) -> dict[str, str]:
    """The safetensors header metadata Diffusers' save_lora_weights writes: format and the adapter config."""
    return {"format": "pt", LORA_METADATA_KEY: json.dumps(adapter.metadata(), indent=2, sort_keys=True)}
