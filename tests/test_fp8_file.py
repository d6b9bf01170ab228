"""ComfyUI's scaled fp8 files of tiny Wan, HunyuanVideo and LTX-Video transformers: the weights read back as ComfyUI
dequantizes them (fp8 times the scale) equal the reference cast times its scale bit for bit, in every layout;
ComfyUI's loader rules (its convert_old_quants and the layer markers, rewritten from its source) read each layout
to the same layers; the high-precision tensors are untouched."""

from __future__ import annotations

import json

import pytest
import torch
from quantized_models import FAMILIES, original_tensors
from safetensors import safe_open
from safetensors.torch import load_file

from cogexport.checkpoint.comfy_quant import dequantized, is_comfy_quantized, quantized_layers
from cogexport.checkpoint.safetensors_files import SafetensorsCheckpoint
from cogexport.errors import CogExportError
from cogexport.lazy import LazyTensor
from cogexport.quantize.check import check_comfy_quant
from cogexport.quantize.comfy_quant import comfy_quantization
from cogexport.quantize.policy import quantization_policy
from cogexport.write.comfy_quant_file import plan_comfy_quant, write_comfy_quant

FP8 = {torch.float8_e4m3fn: comfy_quantization("fp8"), torch.float8_e5m2: comfy_quantization("fp8_e5m2")}


def plan_fp8(tensors, policy, fp8_dtype=torch.float8_e4m3fn, **options):
    return plan_comfy_quant(tensors, policy, FP8[fp8_dtype], **options)


def reference(weight: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """ComfyUI's recipe (QUANTIZATION.md): scale = absmax / fp8 max; stored (W / scale) cast to fp8."""
    limit = torch.finfo(fp8_dtype).max
    scale = (weight.float().abs().max() / limit).float()
    return (weight.float() / scale).clamp(-limit, limit).to(fp8_dtype), scale


def comfy_layers(path) -> dict[str, tuple[dict, torch.Tensor, torch.Tensor]]:
    """layer -> (its config, fp8 weight, scale) as ComfyUI's loader finds them: a legacy file (scaled_fp8 marker)
    has its .scale_weight renamed .weight_scale and every layer set to float8_e4m3fn; a file whose header holds
    _quantization_metadata gets the layers from there; otherwise the per-layer .comfy_quant tensors say."""
    tensors = load_file(path)
    with safe_open(path, "pt") as handle:
        metadata = handle.metadata() or {}
    if "_quantization_metadata" in metadata:
        layers = json.loads(metadata["_quantization_metadata"])["layers"]
    elif "scaled_fp8" in tensors:
        layers = {k[: -len(".scale_weight")]: {"format": "float8_e4m3fn"} for k in tensors if k.endswith(".scale_weight")}
        tensors = {(k[: -len(".scale_weight")] + ".weight_scale" if k.endswith(".scale_weight") else k): v
                   for k, v in tensors.items()}
    else:
        layers = {k[: -len(".comfy_quant")]: json.loads(bytes(v.tolist()).decode("utf-8"))
                  for k, v in tensors.items() if k.endswith(".comfy_quant")}
    return {layer: (conf, tensors[f"{layer}.weight"], tensors[f"{layer}.weight_scale"]) for layer, conf in layers.items()}


@pytest.fixture(scope="module", params=list(FAMILIES))
def original(request):
    family = FAMILIES[request.param]
    return family, original_tensors(family, family.build())


@pytest.mark.parametrize("layout,fp8_dtype", [("comfy_quant", torch.float8_e4m3fn), ("comfy_quant", torch.float8_e5m2),
                                              ("metadata", torch.float8_e4m3fn), ("legacy", torch.float8_e4m3fn)])
def test_dequantized_weights_are_the_reference_cast_times_scale(original, layout, fp8_dtype, tmp_path):
    family, tensors = original
    policy = quantization_policy(family.key)
    plan = plan_fp8(tensors, policy, fp8_dtype=fp8_dtype, layout=layout, keep_dtype=torch.bfloat16)
    write_comfy_quant(tmp_path / "model.safetensors", plan)
    layers = comfy_layers(tmp_path / "model.safetensors")
    assert sorted(layers) == sorted(plan.layers) and plan.layers
    name = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}[fp8_dtype]
    for layer, (conf, weight, scale) in layers.items():
        assert conf["format"] == name and weight.dtype == fp8_dtype
        assert scale.dtype == torch.float32 and scale.shape == ()
        expected, expected_scale = reference(tensors[f"{layer}.weight"].load(), fp8_dtype)
        assert torch.equal(scale, expected_scale) and torch.equal(weight.view(torch.uint8), expected.view(torch.uint8))
        assert torch.equal(weight.float() * scale, expected.float() * expected_scale)
    stored = load_file(tmp_path / "model.safetensors")
    for name_, source in tensors.items():
        if name_[: -len(".weight")] not in layers:
            assert torch.equal(stored[name_], source.load().to(torch.bfloat16)), name_


def test_what_stays_in_high_precision(original):
    family, tensors = original
    plan = plan_fp8(tensors, quantization_policy(family.key))
    quantized = {f"{layer}.weight" for layer in plan.layers}
    for name in quantized:
        assert tensors[name].load().dim() == 2
    kept = set(tensors) - quantized
    assert all(any(part in name for part in ("norm", "bias", "modulation", "embed", "head", "proj", "_in.", "final",
                                                "adaln", "caption", "scale_shift", "_mod.", "patchify"))
               for name in kept), sorted(kept)


def test_read_back_and_verified(original, tmp_path):
    family, tensors = original
    plan = plan_fp8(tensors, quantization_policy(family.key))
    write_comfy_quant(tmp_path / "model.safetensors", plan)
    with SafetensorsCheckpoint(tmp_path / "model.safetensors") as checkpoint:
        metadata = checkpoint.info.header_metadata
        assert is_comfy_quantized(checkpoint, metadata)
        restored = dequantized(checkpoint, metadata)
        assert set(restored) == set(tensors)
        checks = check_comfy_quant(quantized_layers(checkpoint, metadata), checkpoint, restored, tensors)
    assert all(check.exact for check in checks)
    fp8 = [c for c in checks if c.type == "float8_e4m3fn"]
    assert fp8 and all(0 < c.rms_relative < 0.05 for c in fp8)


def test_a_zero_weight_and_bad_options(tmp_path):
    tensors = {"blocks.0.self_attn.q.weight": torch.zeros(32, 32), "blocks.0.self_attn.k.weight": torch.randn(32, 32)}
    lazy = {n: LazyTensor(t.shape, t.dtype, lambda t=t: t, n) for n, t in tensors.items()}
    policy = quantization_policy("wan")
    write_comfy_quant(tmp_path / "zero.safetensors", plan_fp8(lazy, policy))
    stored = load_file(tmp_path / "zero.safetensors")
    assert stored["blocks.0.self_attn.q.weight_scale"] == 1.0
    assert torch.equal(stored["blocks.0.self_attn.q.weight"].float(), torch.zeros(32, 32))
    with pytest.raises(CogExportError, match="legacy scaled_fp8 layout is read as float8_e4m3fn only"):
        plan_fp8(lazy, policy, fp8_dtype=torch.float8_e5m2, layout="legacy")
    with pytest.raises(CogExportError, match="no tensor matches the wan family's quantized weights"):
        plan_fp8({"blocks.0.attn1.to_q.weight": lazy["blocks.0.self_attn.q.weight"]}, policy)
    broken = torch.ones(32, 32)
    broken[0, 0] = float("inf")
    bad = {"blocks.0.self_attn.q.weight": LazyTensor(broken.shape, broken.dtype, lambda: broken, "q")}
    with pytest.raises(CogExportError, match="NaN or infinite"):
        write_comfy_quant(tmp_path / "bad.safetensors", plan_fp8(bad, policy))
