"""An adapter in the layout a loader wants (--lora-format): the family's table for that format renames the modules
(running its module key map backwards), the format's grammar names the tensors, and the strength goes where that
format's loader reads it, so it applies exactly each module's alpha / r with no scale passed by hand:

- diffusers: ``lora_adapter_metadata`` in the header (PEFT LoraConfig arguments: r, lora_alpha, rank_pattern,
  alpha_pattern, use_rslora, target_modules, lora_bias);
- peft: ``adapter_config.json`` beside ``adapter_model.safetensors`` (the same arguments, and use_dora);
- comfyui, musubi: a ``.alpha`` tensor per module (fp32), alpha / r being the scale those loaders apply.

What a format cannot hold is refused with one line naming it, never dropped: DoRA magnitudes (only peft), full
weight deltas (only comfyui), LoRA bias deltas (diffusers and peft as lora_B.bias, comfyui as .diff_b; moving one
into the other multiplies or divides by the module's scale, which is exact only for a power of two).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Mapping

import torch

from ..errors import CogExportError
from ..lazy import LazyTensor
from ..precision import PrecisionPolicy
from .adapter import LoraAdapter, LoraModule
from .formats import ALPHA, BIAS, DIFF, DIFF_B, FORMATS, LORA_AB_NAMES, MAGNITUDE, PART_NAMES, WRITABLE, writable_format
from .modules import translate_modules
from .strength import DIFFUSERS_METADATA, PIPELINE_PREFIX
from .tables import output_table

PEFT_CONFIG = "adapter_config.json"


@dataclass
class AdapterOutput:
    """One adapter file to write, and the files beside it."""

    file: str
    tensors: dict[str, LazyTensor]
    metadata: dict[str, str]
    side_files: dict[str, str] = field(default_factory=dict)  # name -> text


def writable_formats(adapter: LoraAdapter) -> list[str]:
    return [name for name in WRITABLE if output_table(adapter.family, name) is not None]


def plan_output(adapter: LoraAdapter, format_name: str, model_schema: Mapping[str, torch.Size],
                policy: PrecisionPolicy, where: str, base_model: str | None = None) -> AdapterOutput:
    """The tensors, header metadata and side files of ``adapter`` in ``format_name``."""
    target = writable_format(format_name)
    table = output_table(adapter.family, format_name)
    if table is None:
        raise CogExportError(f"{where}: there is no {target.title} layout for {adapter.family.name} LoRAs (no loader "
                             f"reads one); write one of {', '.join(writable_formats(adapter))}")
    if table.write_lora_ab:
        target = replace(target, write_parts={**target.write_parts, **LORA_AB_NAMES})
    held = replace(adapter, modules={name: _held(name, module, format_name, adapter, where)
                                     for name, module in adapter.modules.items()})
    modules = {name: _cast(name, module, policy) for name, module in held.modules.items()}
    if table.modules is not None:
        modules, _ = translate_modules(modules, table.modules.inverted(), where, adapter.use_rslora)
    tensors: dict[str, LazyTensor] = {}
    for name in sorted(modules):
        module = modules[name]
        for part, tensor in module.parts.items():
            tensors[target.key(name, part)] = tensor
        if ALPHA in target.write_parts and module.rank is not None and not (
                target.alpha_optional and module.scale(adapter.use_rslora) == 1.0):
            tensors[target.key(name, ALPHA)] = _alpha_tensor(name, module, adapter.use_rslora, target.title, where)
    config = held.lora_config(model_schema)
    if format_name == "diffusers":
        prefixed = {PIPELINE_PREFIX + key: value for key, value in config.items()}
        return AdapterOutput(target.file, tensors, {"format": "pt", DIFFUSERS_METADATA: json.dumps(
            prefixed, indent=2, sort_keys=True)})
    if format_name == "peft":
        return AdapterOutput(target.file, tensors, {"format": "pt"},
                             {PEFT_CONFIG: json.dumps(_peft_config(config, base_model), indent=2, sort_keys=True)})
    metadata = {"format": "pt"}
    if format_name == "musubi":
        metadata.update(ss_network_module=table.network_module or "", ss_network_dim=str(adapter.rank),
                        ss_network_alpha=str(adapter.alpha))
    return AdapterOutput(target.file, tensors, metadata)


def _peft_config(config: dict, base_model: str | None) -> dict:
    """PEFT's adapter_config.json: the LoraConfig fields its loader reads, for inference."""
    return {"peft_type": "LORA", "task_type": None, "base_model_name_or_path": base_model, "bias": "none",
            "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "lora_dropout": 0.0,
            "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "use_rslora": False, "use_dora": False,
            "lora_bias": False, **config}


def _holders(part: str) -> str:
    names = [name for name in WRITABLE if part in FORMATS[name].write_parts]
    return " or ".join(f"--lora-format {name}" for name in names)


def _is_power_of_two(value: float) -> bool:
    return value > 0 and math.frexp(value)[0] == 0.5


def _held(name: str, module: LoraModule, format_name: str, adapter: LoraAdapter, where: str) -> LoraModule:
    """The module with only parts the format holds: a bias delta moved into the format's kind of bias delta when
    that is exact; anything else it cannot hold is refused."""
    target = FORMATS[format_name]
    parts = target.write_parts

    def lost(part: str) -> CogExportError:
        return CogExportError(f"{where}: {target.title} LoRA files cannot hold {PART_NAMES[part]} (on {name}); they "
                              f"would be lost; write {_holders(part)}")

    for attribute, part in (("magnitude", MAGNITUDE), ("diff", DIFF)):
        if getattr(module, attribute) is not None and part not in parts:
            raise lost(part)
    scale = module.scale(adapter.use_rslora) if module.rank is not None else None
    if module.diff_b is not None and DIFF_B not in parts:
        if BIAS not in parts or scale is None or module.bias is not None:
            raise lost(DIFF_B)
        if not _is_power_of_two(scale):
            raise CogExportError(f"{where}: the bias delta (.diff_b) of {name} would have to be divided by the "
                                 f"module's scale {scale:g} to become a lora_B.bias, which is not exact; write "
                                 f"{_holders(DIFF_B)}")
        diff_b = module.diff_b
        module = replace(module, diff_b=None, bias=LazyTensor(diff_b.shape, diff_b.dtype,
                                                              lambda: diff_b.load() / scale, "diff_b / scale"))
    if module.bias is not None and BIAS not in parts:
        if DIFF_B not in parts:
            raise lost(BIAS)
        if not _is_power_of_two(scale):
            raise CogExportError(f"{where}: the LoRA bias (lora_B.bias) of {name} would have to be multiplied by the "
                                 f"module's scale {scale:g} to become a .diff_b, which is not exact; write "
                                 f"{_holders(BIAS)}")
        bias = module.bias
        module = replace(module, bias=None, diff_b=LazyTensor(bias.shape, bias.dtype, lambda: bias.load() * scale,
                                                              "lora_B.bias * scale"))
    if BIAS in parts and module.bias is None and module.rank is not None and _any_bias(adapter):
        # PEFT's lora_bias gives every adapted layer a bias; the layers without one get zeros, which add nothing
        rows, dtype = module.up.shape[0], module.up.dtype
        module = replace(module, bias=LazyTensor(torch.Size([rows]), dtype, lambda: torch.zeros(rows, dtype=dtype),
                                                 "zero LoRA bias"))
    return module


def _any_bias(adapter: LoraAdapter) -> bool:
    return any(m.bias is not None or (m.diff_b is not None and m.rank is not None) for m in adapter.modules.values())


def _cast(name: str, module: LoraModule, policy: PrecisionPolicy) -> LoraModule:
    return module.with_parts({part: tensor.to(policy.target_dtype(f"{name}.{part}", tensor.dtype))
                              for part, tensor in module.parts.items()})


def _alpha_tensor(name: str, module: LoraModule, rslora: bool, title: str, where: str) -> LazyTensor:
    """The .alpha that makes alpha / r, as kohya and ComfyUI compute it, exactly the module's scale."""
    scale = module.scale(rslora)
    alpha = module.alpha if not rslora else scale * module.rank
    stored = float(torch.tensor(alpha, dtype=torch.float32))
    if stored != alpha or stored / module.rank != scale:
        raise CogExportError(f"{where}: the strength of {name} (scale {scale!r}) cannot be stored exactly as a "
                             f"{title} .alpha (fp32); write --lora-format diffusers or peft")
    return LazyTensor(torch.Size([]), torch.float32, lambda: torch.tensor(stored, dtype=torch.float32), "alpha")

