"""ComfyUI's nvfp4, mxfp8 and int8_tensorwise files (``--to comfyui --quant nvfp4|mxfp8|int8``). The judges:
comfy-kitchen (the kernel library ComfyUI quantizes with; a test dependency only), whose eager quantizers applied to
the same source weights give the bytes of every tensor a layer stores, bit for bit (outside the degenerate weights
where comfy-kitchen divides by a zero scale: there it stores NaN or 448s, cogexport zeros, and both dequantize to the
same finite values wherever comfy-kitchen's are finite); a reader written from ComfyUI's loader rules
(comfy/ops.py ``_load_quantized_module``: the ``comfy_quant`` config or the header's ``_quantization_metadata``, each
format's scales viewed as its loader views them, the weight in the format's storage type) whose layers, dequantized
by comfy-kitchen, are comfy-kitchen's own quantization of the source dequantized; then cogexport's read-back,
verify, the command line and a LoRA run fused then quantized."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refused
from quantize_cases import edge_cases, random_weights
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

ck = pytest.importorskip("comfy_kitchen")
from comfy_kitchen.tensor import QuantizedTensor, get_layout_class  # noqa: E402

QUANTS = ("nvfp4", "mxfp8", "int8")
# ComfyUI's QUANT_ALGOS (comfy/quant_ops.py): format -> its storage type and comfy-kitchen layout
COMFY_ALGOS = {"nvfp4": (torch.uint8, "TensorCoreNVFP4Layout"), "mxfp8": (torch.float8_e4m3fn, "TensorCoreMXFP8Layout"),
               "int8_tensorwise": (torch.int8, "TensorWiseINT8Layout")}
LAYOUT = {"nvfp4": "TensorCoreNVFP4Layout", "mxfp8": "TensorCoreMXFP8Layout", "int8": "TensorWiseINT8Layout"}


def ours(quant: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    return {part.name: part.make(weight, "w") for part in comfy_quantization(quant).parts}


def kitchens(quant: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """comfy-kitchen's quantization of ``weight`` as ComfyUI's layer would save it (its state_dict keys)."""
    state = QuantizedTensor.from_float(weight, LAYOUT[quant]).state_dict("w.weight")
    return {name.removeprefix("w."): tensor for name, tensor in state.items()}


def raw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).contiguous().view(torch.uint8)


def degenerate(quant: str, weight: torch.Tensor, theirs: dict[str, torch.Tensor]) -> bool:
    """Where comfy-kitchen divides by a zero scale: nvfp4's tensor scale, mxfp8's E8M0 code 0 on a nonzero block."""
    if quant == "nvfp4":
        return bool(theirs["weight_scale_2"] == 0)
    if quant == "mxfp8":
        peaks = weight.float().reshape(weight.shape[0], -1, 32).abs().amax(-1)
        needed = (peaks / 448.0).clamp(min=2.0 ** -127)
        return bool(((torch.ceil(torch.log2(needed)) <= -127) & (peaks > 0)).any())
    return False


def cases() -> dict[str, torch.Tensor]:
    """The edge cases at a shape every format stores unpadded (32 columns), and random weights of several scales."""
    shaped = {name: tensor.reshape(-1, 32) for name, tensor in edge_cases(256).items()}
    return {**shaped, **{f"random {seed}": random_weights(seed, 64, 512, 0.01 * 4 ** seed) for seed in range(4)}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("quant", QUANTS)
def test_every_byte_is_comfy_kitchens(quant, dtype):
    exact = set()
    for name, weight in cases().items():
        weight = weight.to(dtype)
        if not bool(torch.isfinite(weight).all()):  # float16 overflows "large": refused (a test below)
            continue
        mine, theirs = ours(quant, weight), kitchens(quant, weight)
        assert mine.keys() == theirs.keys() and all(mine[k].shape == theirs[k].shape for k in mine), name
        if not degenerate(quant, weight, theirs):
            assert all(torch.equal(raw(mine[k]), raw(theirs[k])) for k in mine), (name, dtype)
            exact.add(name)
            continue
        mine_back = comfy_quantization(quant).dequantize(mine).to(dtype)
        theirs_back = QuantizedTensor.from_float(weight, LAYOUT[quant]).dequantize()
        finite = torch.isfinite(theirs_back)
        assert torch.isfinite(mine_back).all() and torch.equal(mine_back[finite], theirs_back[finite]), name
    assert {name for name in cases() if name.startswith("random")} <= exact
    assert len(exact) >= len(cases()) - 4  # at most the zeros, negative zeros and the tiny and subnormal cases


@pytest.mark.parametrize("quant", QUANTS)
def test_dequantized_as_comfy_kitchen_dequantizes(quant):
    for seed in range(3):
        weight = random_weights(seed, 128, 256, 0.02)
        theirs = QuantizedTensor.from_float(weight, LAYOUT[quant]).dequantize()
        assert torch.equal(comfy_quantization(quant).dequantize(ours(quant, weight)), theirs)


def comfy_load(path) -> dict[str, torch.Tensor]:
    """The file as ComfyUI's loader makes the model's weights of it (comfy/ops.py, comfy/utils.py), each quantized
    layer dequantized by comfy-kitchen: the layers from the header's _quantization_metadata (converted to markers)
    or the per-layer comfy_quant configs; per format its scales, viewed as the loader views them (mxfp8's as E8M0,
    nvfp4's block scales as float8 e4m3fn beside the tensor scale weight_scale_2); the weight must already be in the
    format's storage type (the loader's ``.to(storage_t)`` would otherwise convert its values)."""
    state = load_file(path)
    with safe_open(path, "pt") as handle:
        metadata = handle.metadata() or {}
    if "_quantization_metadata" in metadata:
        configs = json.loads(metadata["_quantization_metadata"])["layers"]
    else:
        configs = {k[: -len(".comfy_quant")]: json.loads(bytes(state.pop(k).tolist())) for k in list(state)
                   if k.endswith(".comfy_quant")}
    for layer, config in configs.items():
        storage, layout = COMFY_ALGOS[config["format"]]
        weight = state.pop(f"{layer}.weight")
        assert weight.dtype == storage, layer
        scales = {"scale": state.pop(f"{layer}.weight_scale")}
        if config["format"] == "mxfp8":
            scales["scale"] = scales["scale"].view(torch.float8_e8m0fnu)
        if config["format"] == "nvfp4":
            scales = {"scale": state.pop(f"{layer}.weight_scale_2"), "block_scale": scales["scale"].view(torch.float8_e4m3fn)}
        shape = (weight.shape[0], weight.shape[1] * (2 if config["format"] == "nvfp4" else 1))
        params = get_layout_class(layout).Params(**scales, orig_dtype=torch.float32, orig_shape=shape)
        state[f"{layer}.weight"] = QuantizedTensor(weight, layout, params).dequantize()
    return state


@pytest.fixture(scope="module")
def wan():
    family = FAMILIES["wan"]
    return family, original_tensors(family, family.build())


@pytest.mark.parametrize("layout", ["comfy_quant", "metadata"])
@pytest.mark.parametrize("quant", QUANTS)
def test_comfyui_loads_each_layer_as_comfy_kitchens_own_quantization(wan, quant, layout, tmp_path):
    family, tensors = wan
    plan = plan_comfy_quant(tensors, quantization_policy(family.key), comfy_quantization(quant), layout=layout,
                            keep_dtype=torch.bfloat16)
    write_comfy_quant(tmp_path / "model.safetensors", plan)
    loaded = comfy_load(tmp_path / "model.safetensors")
    assert loaded.keys() == tensors.keys() and len(plan.layers) == 10  # q, k, v, o of both attentions; ffn.0, ffn.2
    for name, source in tensors.items():
        weight = source.load()
        if name[: -len(".weight")] in plan.layers:
            expected = QuantizedTensor.from_float(weight, LAYOUT[quant]).dequantize()
        else:
            expected = weight.to(torch.bfloat16)
        assert torch.equal(loaded[name], expected), name


@pytest.mark.parametrize("quant", QUANTS)
def test_read_back_and_verified_and_a_changed_scale_noticed(wan, quant, tmp_path):
    family, tensors = wan
    plan = plan_comfy_quant(tensors, quantization_policy(family.key), comfy_quantization(quant))
    path = tmp_path / "model.safetensors"
    write_comfy_quant(path, plan)
    with SafetensorsCheckpoint(path) as checkpoint:
        metadata = checkpoint.info.header_metadata
        assert is_comfy_quantized(checkpoint, metadata)
        layers = quantized_layers(checkpoint, metadata)
        restored = dequantized(checkpoint, metadata)
        assert {n: tuple(t.shape) for n, t in restored.items()} == {n: tuple(t.shape) for n, t in tensors.items()}
        checks = {c.name: c for c in check_comfy_quant(layers, checkpoint, restored, tensors)}
    assert all(check.exact for check in checks.values())
    assert all(0 < checks[f"{layer}.weight"].rms_relative < 0.2 for layer in plan.layers)
    layer = plan.layers[0]
    scale = load_file(path)[f"{layer}.weight_scale"]
    with SafetensorsCheckpoint(path) as checkpoint:
        changed = dict(checkpoint)
        bumped = raw(scale).clone()
        bumped[0] ^= 1
        changed[f"{layer}.weight_scale"] = LazyTensor(scale.shape, scale.dtype, lambda: bumped.view(scale.dtype)
                                                      .reshape(scale.shape), "changed")
        checks = check_comfy_quant(layers, changed, dequantized(changed, {}), tensors)
    assert [check.name for check in checks if not check.exact] == [f"{layer}.weight"]


def test_shapes_the_blocks_do_not_tile_stay_in_high_precision_and_bad_input_is_refused(tmp_path):
    policy = quantization_policy("wan")
    weights = {"blocks.0.self_attn.q.weight": torch.randn(64, 64), "blocks.0.ffn.2.weight": torch.randn(64, 48)}
    lazy = {n: LazyTensor(t.shape, t.dtype, lambda t=t: t, n) for n, t in weights.items()}
    plan = plan_comfy_quant(lazy, policy, comfy_quantization("mxfp8"))
    assert plan.layers == ("blocks.0.self_attn.q",)
    assert plan.notes == ("blocks.0.ffn.2.weight: 64 x 48 is not a multiple of 32 both ways, as mxfp8 blocks are; "
                          "kept in float32",)
    assert plan_comfy_quant(lazy, policy, comfy_quantization("nvfp4")).layers == plan.layers + ("blocks.0.ffn.2",)
    with pytest.raises(CogExportError, match="legacy scaled_fp8 layout is read as float8_e4m3fn only"):
        plan_comfy_quant(lazy, policy, comfy_quantization("nvfp4"), layout="legacy")
    with pytest.raises(CogExportError, match="can be stored as mxfp8"):
        plan_comfy_quant({"blocks.0.ffn.2.weight": lazy["blocks.0.ffn.2.weight"]}, policy, comfy_quantization("mxfp8"))
    broken = weights["blocks.0.self_attn.q.weight"].clone()
    broken[1, 2] = float("nan")
    bad = {"blocks.0.self_attn.q.weight": LazyTensor(broken.shape, broken.dtype, lambda: broken, "q")}
    for quant in QUANTS:
        with pytest.raises(CogExportError, match="'blocks.0.self_attn.q.weight' holds NaN or infinite values"):
            write_comfy_quant(tmp_path / "bad.safetensors", plan_comfy_quant(bad, policy, comfy_quantization(quant)))
        assert not (tmp_path / "bad.safetensors").exists()


@pytest.mark.parametrize("quant", QUANTS)
def test_export_inspect_and_verify_through_the_command_line(quant, cli, tmp_path):
    family = FAMILIES["wan"]
    family.build().save_pretrained(tmp_path / "model")
    result = cli(tmp_path / "model", tmp_path / "out", "--to", "comfyui", "--quant", quant)
    assert result.exit_code == 0, result.stderr
    (path,) = (tmp_path / "out").glob(f"*_{quant}.safetensors")
    assert f"ComfyUI {quant}: 10 weights" in cli("inspect", path).stdout
    result = cli("verify", tmp_path / "out", "--against", tmp_path / "model", "--json")
    (report,) = json.loads(result.stdout)["reports"]
    assert result.exit_code == 0 and report["ok"] and report["exact"] == report["tensors"]
    assert comfy_quantization(quant).format in (tmp_path / "out" / "README.md").read_text()
    (tmp_path / "refusal").mkdir()
    assert_refused(cli, tmp_path / "refusal", [tmp_path / "model", tmp_path / "refusal" / "out", "--to", "comfyui",
                                               "--quant", quant, "--fp8-layout", "legacy"],
                   "legacy scaled_fp8 layout", inputs=[tmp_path / "model"])


@pytest.mark.parametrize("quant", QUANTS)
def test_a_lora_run_is_fused_then_quantized(quant, cli, tmp_path):
    """The file's quantized layers are the quantizer's bytes (comfy-kitchen's) of the fused weights, which an fp32
    fused export of the same run holds."""
    from test_lora_expert_pairs import MODULES, comfy, fused as read_fused
    from test_lora_wan import make_adapter
    from wan_fixtures import tiny_wan_pipeline

    pipeline = tiny_wan_pipeline("t2v-a14b")
    with safe_open(pipeline / "transformer_2" / "diffusion_pytorch_model.safetensors", "pt") as handle:
        weights = {k: handle.get_tensor(k) for k in handle.keys()}
    path = comfy(tmp_path / "lora" / "run_low_noise.safetensors", make_adapter(weights, MODULES, seed=41))
    assert cli(path, tmp_path / "fused", "--base", pipeline, "--lora", "fuse", "--dtype", "fp32").exit_code == 0
    truth = read_fused(tmp_path / "fused")
    result = cli(path, tmp_path / "out", "--base", pipeline, "--to", "comfyui", "--quant", quant)
    assert result.exit_code == 0, result.stderr
    (file,) = (tmp_path / "out").rglob("*.safetensors")
    stored = load_file(file)
    fused_q = truth["blocks.1.attn1.to_q.weight"]
    assert not torch.equal(fused_q, weights["blocks.1.attn1.to_q.weight"])  # the adapter changed it
    theirs = kitchens(quant, fused_q)
    for part, tensor in theirs.items():
        assert torch.equal(raw(stored[f"blocks.1.self_attn.q.{part}"]), raw(tensor)), part
