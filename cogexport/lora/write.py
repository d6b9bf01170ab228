"""An adapter in the layout a loader wants (--lora-format): the family's table for that format renames the modules
(running its module key map backwards), the format's grammar names the tensors, and the strength goes where that
format says its loader reads it (formats.py), so the loader applies exactly each module's strength with no scale
passed by hand:

- the adapter config in the header (Diffusers' lora_adapter_metadata: r, lora_alpha, rank_pattern, alpha_pattern,
  use_rslora, target_modules, lora_bias) or in adapter_config.json beside the file (PEFT: the same arguments, and
  use_dora; LoKrConfig / LoHaConfig for LyCORIS adapters, lycoris_loaders.py);
- or a ``.alpha`` tensor per module (fp32), alpha / r being the scale those loaders apply (kohya / musubi-tuner,
  ComfyUI, LyCORIS), with kohya's ss_network_* metadata where the format wants it.

What a format cannot hold is refused with one line naming it and the formats that hold it, never dropped: DoRA
magnitudes (only peft), full weight deltas (only comfyui), LoKr / LoHa factors (peft, comfyui, lycoris), LoRA bias
deltas (diffusers and peft as lora_B.bias, comfyui as .diff_b; moving one into the other multiplies or divides by
the module's scale, which is exact only for a power of two).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Mapping

import torch

from ..errors import CogExportError
from ..lazy import LazyTensor
from ..models.family import DEFAULT_TRANSFORMER_FOLDER
from ..precision import AsRead, PrecisionPolicy
from .adapter import LoraAdapter, LoraModule
from .formats import (FULL_AT_ONE, IN_HEADER, IN_SIDE_FILE, LORA_AB_NAMES, LoraFormat, holders, writable_format,
                      writable_formats)
from .lycoris_loaders import lycoris_problem, peft_config, whole_at_one
from .modules import translate_modules
from .parts import ALPHA, BIAS, DIFF, DIFF_B, KIND_TITLES, LORA, MAGNITUDE, PART_NAMES
from .strength import DIFFUSERS_METADATA
from .tables import output_table

PEFT_CONFIG = "adapter_config.json"


@dataclass
class AdapterOutput:
    """One adapter file to write, and the files beside it."""

    file: str
    tensors: dict[str, LazyTensor]
    metadata: dict[str, str]
    side_files: dict[str, str] = field(default_factory=dict)  # name -> text


def formats_for(adapter: LoraAdapter) -> list[str]:
    """The writable formats the adapter's family has a table for."""
    return [name for name in writable_formats() if output_table(adapter.family, name) is not None]


def plan_output(adapter: LoraAdapter, format_name: str, model_schema: Mapping[str, torch.Size],
                policy: PrecisionPolicy | AsRead, where: str, base_model: str | None = None,
                component: str = DEFAULT_TRANSFORMER_FOLDER) -> AdapterOutput:
    """The tensors, header metadata and side files of ``adapter`` in ``format_name``, for the pipeline component
    ``component`` (a format whose keys name it)."""
    target = writable_format(format_name)
    table = output_table(adapter.family, format_name)
    if table is None:
        raise CogExportError(f"{where}: there is no {target.title} layout for {adapter.family.name} LoRAs (no loader "
                             f"reads one); write one of {', '.join(formats_for(adapter))}")
    if table.write_lora_ab:
        target = replace(target, write_parts={**target.write_parts, **LORA_AB_NAMES})
    held = replace(adapter, modules={name: _held(name, module, target, adapter, where)
                                     for name, module in adapter.modules.items()})
    modules = {name: _cast(name, module, policy) for name, module in held.modules.items()}
    modules, _ = translate_modules(modules, table.modules.inverted(), where, adapter.use_rslora, adapter.counts)
    tensors: dict[str, LazyTensor] = {}
    for name in sorted(modules):
        tensors.update(_module_tensors(name, modules[name], target, adapter.use_rslora, where, component))
    config = _adapter_config(held, target, model_schema, where)
    metadata = {"format": "pt"}
    side_files = {}
    if target.adapter_config == IN_HEADER:
        metadata[DIFFUSERS_METADATA] = json.dumps({f"{component}.{key}": value for key, value in config.items()},
                                                  indent=2, sort_keys=True)
    elif target.adapter_config == IN_SIDE_FILE:
        side_files[PEFT_CONFIG] = json.dumps(_peft_file(config, base_model), indent=2, sort_keys=True)
    if target.kohya_metadata:
        metadata.update(ss_network_module=table.network_module, ss_network_dim=str(adapter.rank),
                        ss_network_alpha=str(adapter.alpha))
    return AdapterOutput(target.file, tensors, metadata, side_files)


def _module_tensors(name: str, module: LoraModule, target: LoraFormat, rslora: bool, where: str,
                    component: str) -> dict[str, LazyTensor]:
    """One module's tensors in the format's names, with the .alpha its loader divides by the module's rank."""
    tensors = {target.key(name, part, component): tensor for part, tensor in module.parts.items()}
    if not target.holds(ALPHA) or module.kind is None:
        return tensors
    rank, scale = module.rank, module.scale(rslora)
    if target.alpha_optional and scale == 1.0:
        return tensors  # its loaders apply a module without .alpha at scale 1
    preferred = module.alpha if module.kind != LORA or not rslora else None
    tensors[target.key(name, ALPHA, component)] = _alpha_tensor(name, scale, rank or 1, preferred, target.title, where)
    return tensors


def _adapter_config(adapter: LoraAdapter, target: LoraFormat, model_schema: Mapping[str, torch.Size],
                    where: str) -> dict:
    """The adapter config the format keeps (PEFT's LoraConfig arguments, or LoKrConfig / LoHaConfig ones)."""
    if not target.adapter_config:
        return {}
    kinds = set(adapter.kinds)
    if kinds <= {LORA}:
        return adapter.lora_config(model_schema)
    lycoris = {name: module for name, module in adapter.modules.items() if module.kind is not None}
    return peft_config(lycoris, model_schema, where)


def _peft_file(config: dict, base_model: str | None) -> dict:
    """PEFT's adapter_config.json: the config fields its loader reads, for inference."""
    common = {"task_type": None, "base_model_name_or_path": base_model, "inference_mode": True,
              "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}}
    if config.get("peft_type") in ("LOKR", "LOHA"):
        lycoris = {"rank_dropout": 0.0, "module_dropout": 0.0, "use_effective_conv2d": False, "init_weights": True,
                   "exclude_modules": None, "layers_to_transform": None, "layers_pattern": None}
        if config["peft_type"] == "LOKR":
            lycoris.update(decompose_both=False, decompose_factor=-1, rank_dropout_scale=False)
        return {**common, **lycoris, **config}
    return {**common, "peft_type": "LORA", "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True,
            "lora_dropout": 0.0, "use_rslora": False, "use_dora": False, "lora_bias": False, **config}


def _is_power_of_two(value: float) -> bool:
    return value > 0 and math.frexp(value)[0] == 0.5


def _held(name: str, module: LoraModule, target: LoraFormat, adapter: LoraAdapter, where: str) -> LoraModule:
    """The module with only parts the format holds: a bias delta moved into the format's kind of bias delta when
    that is exact; anything else it cannot hold is refused."""
    def lost(what: str, part: str) -> CogExportError:
        return CogExportError(f"{where}: {target.title} LoRA files cannot hold {what} (on {name}); they would be lost; "
                              f"write {holders(part)}")

    if module.factors:
        _check_factors(name, module, target, where)
    for attribute, part in (("magnitude", MAGNITUDE), ("diff", DIFF)):
        if getattr(module, attribute) is not None and not target.holds(part):
            raise lost(PART_NAMES[part], part)
    scale = module.scale(adapter.use_rslora) if module.kind is not None else None
    if module.diff_b is not None and not target.holds(DIFF_B):
        if not target.holds(BIAS) or module.kind != LORA or module.bias is not None:
            raise lost(PART_NAMES[DIFF_B], DIFF_B)
        if not _is_power_of_two(scale):
            raise CogExportError(f"{where}: the bias delta (.diff_b) of {name} would have to be divided by the "
                                 f"module's scale {scale:g} to become a lora_B.bias, which is not exact; write "
                                 f"{holders(DIFF_B)}")
        diff_b = module.diff_b
        module = replace(module, diff_b=None, bias=LazyTensor(diff_b.shape, diff_b.dtype,
                                                              lambda: diff_b.load() / scale, "diff_b / scale"))
    if module.bias is not None and not target.holds(BIAS):
        if not target.holds(DIFF_B):
            raise lost(PART_NAMES[BIAS], BIAS)
        if not _is_power_of_two(scale):
            raise CogExportError(f"{where}: the LoRA bias (lora_B.bias) of {name} would have to be multiplied by the "
                                 f"module's scale {scale:g} to become a .diff_b, which is not exact; write "
                                 f"{holders(BIAS)}")
        bias = module.bias
        module = replace(module, bias=None, diff_b=LazyTensor(bias.shape, bias.dtype, lambda: bias.load() * scale,
                                                              "lora_B.bias * scale"))
    if target.holds(BIAS) and module.bias is None and module.kind == LORA and _any_bias(adapter):
        # PEFT's lora_bias gives every adapted layer a bias; the layers without one get zeros, which add nothing
        rows, dtype = module.up.shape[0], module.up.dtype
        module = replace(module, bias=LazyTensor(torch.Size([rows]), dtype, lambda: torch.zeros(rows, dtype=dtype),
                                                 "zero LoRA bias"))
    return module


def _check_factors(name: str, module: LoraModule, target: LoraFormat, where: str) -> None:
    """A LoKr or LoHa module goes only where its loader gives back its factors and strength."""
    if not all(target.holds(part) for part in module.factors):
        raise CogExportError(f"{where}: {target.title} LoRA files cannot hold a {KIND_TITLES[module.kind]} adapter "
                             f"(on {name}): their loaders apply lora_A / lora_B only; write "
                             f"{holders(next(iter(module.factors)))}")
    if target.full_lokr == FULL_AT_ONE:
        whole_at_one(name, module, target.title, where)
    if target.factor_rules == "lycoris":
        problem = lycoris_problem(name, module)
        if problem:
            raise CogExportError(f"{where}: {problem}; write --lora-format comfyui or peft")


def _any_bias(adapter: LoraAdapter) -> bool:
    return any(m.bias is not None or (m.diff_b is not None and m.kind == LORA) for m in adapter.modules.values())


def _cast(name: str, module: LoraModule, policy: PrecisionPolicy) -> LoraModule:
    return module.with_parts({part: tensor.to(policy.target_dtype(f"{name}.{part}", tensor.dtype))
                              for part, tensor in module.parts.items()})


def _alpha_tensor(name: str, scale: float, rank: int, preferred: float | None, title: str, where: str) -> LazyTensor:
    """The .alpha that makes alpha / r, as kohya, ComfyUI and LyCORIS compute it, exactly the module's scale."""
    alpha = preferred if preferred is not None and preferred / rank == scale else scale * rank
    stored = float(torch.tensor(alpha, dtype=torch.float32))
    if stored != alpha or stored / rank != scale:
        raise CogExportError(f"{where}: the strength of {name} (scale {scale!r}) cannot be stored exactly as a "
                             f"{title} .alpha (fp32); write --lora-format diffusers or peft")
    return LazyTensor(torch.Size([]), torch.float32, lambda: torch.tensor(stored, dtype=torch.float32), "alpha")

