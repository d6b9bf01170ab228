"""An adapter fused into its model: every adapted weight becomes W + delta, the delta computed in fp32 in the order
PEFT's merge uses (so Diffusers' fuse_lora at scale 1.0 gives the same bits): (B @ A) * scale for a LoRA, the LoKr's
or LoHa's factor product * scale (lycoris.py, the order of LyCORIS's, PEFT's and ComfyUI's merges); then + .diff
where the adapter has full-weight deltas; biases gain lora_B.bias * scale and .diff_b. Lazy: one tensor is made at a
time."""

from __future__ import annotations

from typing import Mapping

import torch

from ..errors import CogExportError
from ..keymap.plan import plan_translation
from ..lazy import LazyTensor
from . import lycoris
from .adapter import LoraAdapter, LoraModule


def base_weights(adapter: LoraAdapter, schema: Mapping[str, torch.Size], counts: Mapping[str, int],
                 where: str) -> dict[str, LazyTensor]:
    """The model's own weights the run saved beside the adapter, checked against the model."""
    # A key map of a whole run (SAT) names the adapters too: they are expected beside the model's tensors.
    adapters = adapter.adapter_schema() if adapter.table.keymap is not None else {}
    plan = plan_translation(adapter.base_table, adapter.base_source, {**schema, **adapters}, counts, what=where)
    return {name: plan.tensors[name] for name in schema}


def misfits(modules: Mapping[str, LoraModule], schema: Mapping[str, torch.Size]) -> list[str]:
    """What of these adapters does not fit a model with this schema (layers it lacks, shapes that differ)."""
    wrong = []
    for name, module in modules.items():
        weight, bias = schema.get(f"{name}.weight"), schema.get(f"{name}.bias")
        if module.kind is not None or module.diff is not None:
            if weight is None or len(weight) != 2:
                wrong.append(f"the adapter of {name} is not on a linear layer of the model")
                continue
            wrong += _weight_misfits(name, module, weight)
            if module.diff is not None and module.diff.shape != weight:
                wrong.append(f"{name}.diff is {tuple(module.diff.shape)}, the weight {tuple(weight)}")
        for part in ("bias", "diff_b", "magnitude"):
            tensor = getattr(module, part)
            if tensor is None:
                continue
            rows = (bias if part != "magnitude" else weight)
            if rows is None:
                wrong.append(f"the adapter gives {name} a bias delta, but that layer has no bias")
            elif tensor.shape[0] != rows[0]:
                wrong.append(f"{name}.{part} has {tensor.shape[0]} rows, the layer {rows[0]}")
    return wrong


def _weight_misfits(name: str, module: LoraModule, weight: torch.Size) -> list[str]:
    out, inp = weight
    if module.down is not None and (module.down.shape[1] != inp or module.up.shape[0] != out):
        return [f"{name} is {inp} -> {out}, the adapter {module.down.shape[1]} -> {module.up.shape[0]}"]
    if module.factors and lycoris.delta_shape(module.factors) != (out, inp):
        adapted_out, adapted_in = lycoris.delta_shape(module.factors)
        return [f"{name} is {inp} -> {out}, the {module.kind} adapter {adapted_in} -> {adapted_out}"]
    return []


def check_fits(adapter: LoraAdapter, schema: Mapping[str, torch.Size], where: str) -> None:
    """Every adapted module is a layer of this model, with the shapes the adapter needs."""
    wrong = misfits(adapter.modules, schema)
    if wrong:
        raise CogExportError(f"{where}: the adapter does not fit the base model: {'; '.join(wrong[:3])}")


def plan_fused(adapter: LoraAdapter, base: Mapping[str, LazyTensor], where: str) -> dict[str, LazyTensor]:
    """The model's tensors (``base``, in the model's order) with the adapter merged into its layers."""
    dora = [name for name, module in adapter.modules.items() if module.magnitude is not None]
    if dora:
        raise CogExportError(f"{where}: {dora[0]} is a DoRA adapter, whose fused weights cogexport does not compute; "
                             "write it with --lora adapter --lora-format peft and merge it with PEFT")
    fused = dict(base)
    for name, module in adapter.modules.items():
        scale = module.scale(adapter.use_rslora) if module.kind is not None else 1.0
        weight, bias = f"{name}.weight", f"{name}.bias"
        if module.kind is not None or module.diff is not None:
            fused[weight] = LazyTensor(base[weight].shape, torch.float32, _weight(base[weight], module, scale),
                                       f"{weight} + LoRA")
        if module.bias is not None or module.diff_b is not None:
            fused[bias] = LazyTensor(base[bias].shape, torch.float32, _bias(base[bias], module, scale),
                                     f"{bias} + LoRA")
    return fused


def _weight(weight: LazyTensor, module: LoraModule, scale: float):
    def fuse() -> torch.Tensor:
        merged = weight.load().float()
        if module.down is not None:
            # PEFT's order: delta = (B @ A) * scale, then W + delta.
            merged = merged + (module.up.load().float() @ module.down.load().float()) * scale
        if module.factors:
            merged = merged + lycoris.delta(module.factors, scale)
        if module.diff is not None:
            merged = merged + module.diff.load().float()
        return merged

    return fuse


def _bias(bias: LazyTensor, module: LoraModule, scale: float):
    def fuse() -> torch.Tensor:
        merged = bias.load().float()
        if module.bias is not None:
            merged = merged + module.bias.load().float() * scale
        if module.diff_b is not None:
            merged = merged + module.diff_b.load().float()
        return merged

    return fuse
