"""GGUF files as the gguf package and ComfyUI-GGUF's loader read them, the quantization policy of each family, the
fallbacks, bad input, and the verify checks."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from quantized_models import FAMILIES, original_tensors

from cogexport.checkpoint.gguf_file import GgufCheckpoint, is_gguf_file
from cogexport.errors import CogExportError
from cogexport.lazy import LazyTensor
from cogexport.quantize.check import check_gguf
from cogexport.quantize.policy import PlannedTensor, plan_gguf, quantization_policy
from cogexport.write.gguf_file import write_gguf

# ComfyUI-GGUF's loader.py and dequant.py (facts): the architectures it loads as image models and the types it
# dequantizes (F32 and F16 are used as plain tensors).
COMFY_ARCHITECTURES = {"flux", "sd1", "sdxl", "sd3", "aura", "hidream", "cosmos", "ltxv", "hyvid", "wan", "lumina2",
                       "qwen_image"}
COMFY_DEQUANTIZES = {"BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K"}


def lazy(tensor: torch.Tensor, name: str = "") -> LazyTensor:
    return LazyTensor(tensor.shape, tensor.dtype, lambda: tensor, name)


def comfy_gguf_load(path) -> dict[str, torch.Tensor]:
    """The file read by ComfyUI-GGUF's rules (its loader's source, rewritten): general.architecture must be a string
    naming an image architecture it knows; a tensor's shape is comfy.gguf.orig_shape.<name> (an ARRAY of INT32) when
    present, else the tensor info's dims reversed; F32/F16 are viewed in that shape, the other types dequantized."""
    reader = gguf.GGUFReader(path)
    field = reader.get_field("general.architecture")
    assert field.types == [gguf.GGUFValueType.STRING]
    assert str(field.parts[field.data[-1]], encoding="utf-8") in COMFY_ARCHITECTURES
    out = {}
    for tensor in reader.tensors:
        shape_field = reader.get_field(f"comfy.gguf.orig_shape.{tensor.name}")
        if shape_field is not None:
            assert shape_field.types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]
            shape = tuple(int(shape_field.parts[i][0]) for i in shape_field.data)
        else:
            shape = tuple(int(v) for v in reversed(tensor.shape.tolist()))
        kind = gguf.GGMLQuantizationType(tensor.tensor_type)
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            out[tensor.name] = torch.from_numpy(np.array(tensor.data)).view(*shape).float()
        else:
            assert kind.name in COMFY_DEQUANTIZES, kind.name
            out[tensor.name] = torch.from_numpy(gguf.quants.dequantize(tensor.data, kind)).reshape(shape)
    return out


def comfy_gguf_metadata(path) -> dict:
    """What ComfyUI-GGUF's loader hands ComfyUI as the file's metadata (since its PR #399): every key-value field of
    one string or number, by name. ComfyUI's model detection reads the JSON of a string key named ``config``."""
    reader = gguf.GGUFReader(path)
    metadata = {}
    for name, field in reader.fields.items():
        if len(field.types) != 1 or field.types[0] == gguf.GGUFValueType.ARRAY:
            continue
        value = field.parts[field.data[-1]]
        metadata[name] = str(value, encoding="utf-8") if field.types[0] == gguf.GGUFValueType.STRING else value[0]
    return metadata


@pytest.fixture(scope="module", params=list(FAMILIES))
def original(request):
    family = FAMILIES[request.param]
    return family, original_tensors(family, family.build())


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q5_0", "BF16"])
def test_read_back_by_the_gguf_package_and_comfyui_gguf_rules(original, quant, tmp_path):
    family, tensors = original
    policy = quantization_policy(family.key)
    plan = plan_gguf(tensors, policy, quant)
    path = tmp_path / "model.gguf"
    write_gguf(path, plan)
    reader = gguf.GGUFReader(path)
    fields = {name: field.parts[field.data[-1]] for name, field in reader.fields.items() if name.startswith("general.")}
    assert str(fields["general.architecture"], encoding="utf-8") == policy.architecture
    assert int(fields["general.file_type"][0]) == gguf.LlamaFileType[f"MOSTLY_{quant}"]
    assert int(fields["general.quantization_version"][0]) == gguf.GGML_QUANT_VERSION
    assert [(t.name, t.tensor_type.name) for t in reader.tensors] == [(t.name, t.type.name) for t in plan.tensors]
    loaded = comfy_gguf_load(path)
    for name, source in tensors.items():
        value = source.load()
        assert loaded[name].shape == value.shape, name  # 5-D patch embeddings included, no side file
        assert torch.allclose(loaded[name], value, atol=0.25 * value.abs().max().item()), name


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q8_0", "F16"])
def test_verify_finds_every_tensor_equal_to_the_reference(original, quant, tmp_path):
    family, tensors = original
    write_gguf(tmp_path / "model.gguf", plan_gguf(tensors, quantization_policy(family.key), quant))
    with GgufCheckpoint(tmp_path / "model.gguf") as checkpoint:
        assert checkpoint.info.facts.metadata["general.architecture"] == quantization_policy(family.key).architecture
        assert {n: tuple(t.shape) for n, t in checkpoint.items()} == {n: tuple(t.shape) for n, t in tensors.items()}
        checks = check_gguf(checkpoint, tensors)
    assert all(check.exact for check in checks), [c.name for c in checks if not c.exact]
    assert all(check.rms_relative == 0 for check in checks if check.type == "F32")
    assert all(0 < check.rms_relative < 0.08 for check in checks if check.type in ("Q4_K", "Q8_0", "Q6_K", "Q5_K"))


def test_verify_notices_a_changed_byte(original, tmp_path):
    family, tensors = original
    plan = plan_gguf(tensors, quantization_policy(family.key), "Q8_0")
    write_gguf(tmp_path / "model.gguf", plan)
    with GgufCheckpoint(tmp_path / "model.gguf") as checkpoint:
        victim = next(t.name for t in plan.tensors if t.type.name == "Q8_0")
        offset = checkpoint._ranges[victim][0] + 7  # a quant byte of the first block
    data = bytearray((tmp_path / "model.gguf").read_bytes())
    data[offset] ^= 0x10
    (tmp_path / "model.gguf").write_bytes(bytes(data))
    with GgufCheckpoint(tmp_path / "model.gguf") as checkpoint:
        checks = {c.name: c for c in check_gguf(checkpoint, tensors)}
    assert [name for name, check in checks.items() if not check.exact] == [victim]


def test_what_each_family_keeps_in_high_precision():
    names = {
        "wan": {"blocks.0.modulation": ((1, 6, 256), "F32"), "head.modulation": ((1, 2, 256), "F32"),
                "patch_embedding.weight": ((256, 4, 1, 2, 2), "F32"), "text_embedding.0.weight": ((256, 4096), "F16"),
                "text_embedding.2.weight": ((256, 256), "F16"),
                "head.head.weight": ((64, 256), "F16"), "blocks.0.norm3.weight": ((256,), "F32"),
                "blocks.0.self_attn.norm_q.weight": ((256,), "F32"), "blocks.0.self_attn.q.weight": ((256, 256), "Q4_K"),
                "blocks.0.self_attn.v.weight": ((256, 256), "Q6_K"), "blocks.0.ffn.2.weight": ((256, 512), "Q6_K"),
                "blocks.0.ffn.0.bias": ((512,), "F32"), "img_emb.proj.1.weight": ((256, 1280), "F16")},
        "hunyuanvideo": {"img_in.proj.weight": ((256, 16, 1, 2, 2), "F32"), "txt_in.input_embedder.weight": ((256, 4096), "F16"),
                         "final_layer.linear.weight": ((64, 256), "F16"), "time_in.mlp.0.weight": ((256, 256), "F16"),
                         "double_blocks.0.img_attn_qkv.weight": ((768, 256), "Q5_K"),
                         "double_blocks.0.img_attn_q_norm.weight": ((128,), "F32"),
                         "double_blocks.0.img_mlp.fc2.weight": ((256, 1024), "Q4_K"),
                         "double_blocks.0.img_attn_proj.weight": ((256, 256), "Q4_K"),
                         "txt_in.individual_token_refiner.blocks.0.self_attn_qkv.weight": ((768, 256), "F16")},
        "ltx_video": {"scale_shift_table": ((2, 256), "F32"), "transformer_blocks.0.scale_shift_table": ((6, 256), "F32"),
                      "patchify_proj.weight": ((256, 128), "F16"), "proj_out.weight": ((128, 256), "F16"),
                      "adaln_single.linear.weight": ((1536, 256), "F16"),
                      "caption_projection.linear_1.weight": ((256, 4096), "F16"),
                      "adaln_single.emb.timestep_embedder.linear_2.weight": ((256, 256), "F16"),
                      "caption_projection.linear_2.weight": ((256, 256), "F16"),
                      "transformer_blocks.0.attn1.to_v.weight": ((256, 256), "Q6_K"),
                      "transformer_blocks.0.ff.net.2.weight": ((256, 1024), "Q6_K"),
                      "transformer_blocks.0.attn2.to_q.weight": ((256, 256), "Q4_K")},
    }
    for family, expected in names.items():
        tensors = {name: lazy(torch.zeros(shape)) for name, (shape, _) in expected.items()}
        plan = plan_gguf(tensors, quantization_policy(family), "Q4_K_M")
        assert {t.name: t.type.name for t in plan.tensors} == {n: kind for n, (_, kind) in expected.items()}, family


def test_mixes_raise_the_types_the_patch_raises():
    shapes = {f"blocks.{i}.self_attn.v.weight": (256, 256) for i in range(6)}
    shapes.update({"blocks.0.ffn.2.weight": (256, 512), "blocks.0.ffn.0.weight": (512, 256),
                   "blocks.0.self_attn.norm_q.weight": (256,), "text_embedding.2.weight": (256, 256),
                   "head.modulation": (1, 2, 256)})
    tensors = {name: lazy(torch.zeros(shape)) for name, shape in shapes.items()}
    policy = quantization_policy("wan")

    def types(preset):
        return {t.name: t.type.name for t in plan_gguf(tensors, policy, preset).tensors}

    assert types("Q4_0")["blocks.0.ffn.2.weight"] == "Q4_1" and types("Q4_0")["blocks.0.ffn.0.weight"] == "Q4_0"
    assert types("Q5_0")["blocks.0.ffn.2.weight"] == "Q5_1"
    assert types("Q5_K_M")["blocks.3.self_attn.v.weight"] == "Q6_K" and types("Q5_K_M")["blocks.0.ffn.0.weight"] == "Q5_K"
    q4_k_s = types("Q4_K_S")
    assert [q4_k_s[f"blocks.{i}.self_attn.v.weight"] for i in range(6)] == ["Q5_K"] * 4 + ["Q4_K"] * 2
    assert q4_k_s["blocks.0.ffn.2.weight"] == "Q5_K"
    assert set(types("Q8_0").values()) == {"Q8_0", "F32", "F16"}
    assert types("BF16")["blocks.0.ffn.0.weight"] == "BF16" and types("BF16")["head.modulation"] == "F32"


def test_bfloat16_sources_keep_bfloat16_where_not_quantized():
    tensors = {"blocks.0.self_attn.norm_q.weight": lazy(torch.ones(256, dtype=torch.bfloat16)),
               "text_embedding.2.weight": lazy(torch.ones(256, 256, dtype=torch.bfloat16)),
               "head.modulation": lazy(torch.ones(1, 2, 256, dtype=torch.bfloat16))}
    plan = plan_gguf(tensors, quantization_policy("wan"), "Q8_0")
    assert [t.type.name for t in plan.tensors] == ["F32", "BF16", "F32"]


def test_rows_that_do_not_fill_blocks_stay_in_float_and_the_plan_says_so(tmp_path):
    """The standard tiny Wan widths (hidden 32, ffn 48) fit Q8_0's blocks of 32 except ffn.2's rows of 48, and no
    K block at all: those tensors stay F16, and the file still loads in Diffusers."""
    from diffusers import GGUFQuantizationConfig, WanTransformer3DModel
    from wan_fixtures import build_tiny_transformer

    model = build_tiny_transformer("t2v", num_layers=1)
    original = original_tensors(FAMILIES["wan"], model)
    q8 = plan_gguf(original, quantization_policy("wan"), "Q8_0")
    assert [n.split(":")[0] for n in q8.notes] == ["blocks.0.ffn.2.weight"]
    assert "rows of 48 values do not fill Q8_0 blocks of 32; kept in F16" in q8.notes[0]
    k = plan_gguf(original, quantization_policy("wan"), "Q4_K_M")
    assert k.type_counts().get("Q4_K", 0) == k.type_counts().get("Q6_K", 0) == 0 and len(k.notes) == 2
    model.save_config(tmp_path / "config")
    write_gguf(tmp_path / "q8.gguf", q8)
    loaded = WanTransformer3DModel.from_single_file(
        str(tmp_path / "q8.gguf"), config=str(tmp_path / "config"), torch_dtype=torch.float32,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32))
    assert loaded.blocks[0].ffn.net[2].weight.dtype == torch.float32  # the F16 fallback, read as a plain tensor
    assert type(loaded.blocks[0].ffn.net[0].proj.weight).__name__ == "GGUFParameter"


def test_a_reshaped_tensor_carries_its_shape_for_comfyui_gguf(tmp_path):
    weight = torch.randn(8, 4, 1, 2, 16)
    tensors = {"blocks.0.self_attn.norm_q.weight": lazy(torch.ones(256)), "text_embedding.2.weight": lazy(weight),
               "head.modulation": lazy(torch.ones(1, 2, 256))}
    plan = plan_gguf(tensors, quantization_policy("wan"), "Q8_0")
    entry = plan.tensors[1]
    reshaped = PlannedTensor(entry.name, entry.source, entry.type, entry.shape, (32, 32), "reshaped")
    plan = type(plan)(plan.architecture, plan.preset, (plan.tensors[0], reshaped, plan.tensors[2]), ())
    write_gguf(tmp_path / "model.gguf", plan)
    assert comfy_gguf_load(tmp_path / "model.gguf")["text_embedding.2.weight"].shape == weight.shape
    with GgufCheckpoint(tmp_path / "model.gguf") as checkpoint:
        assert checkpoint["text_embedding.2.weight"].shape == weight.shape
        assert torch.equal(checkpoint["text_embedding.2.weight"].load(), weight)  # 5-D: kept in F32


def test_each_tensor_is_loaded_once_and_let_go(original, tmp_path):
    family, tensors = original
    loads = {}

    def counting(name, source):
        def load():
            loads[name] = loads.get(name, 0) + 1
            return source.load()
        return LazyTensor(source.shape, source.dtype, load, name)

    counted = {name: counting(name, source) for name, source in tensors.items()}
    seen = []
    write_gguf(tmp_path / "model.gguf", plan_gguf(counted, quantization_policy(family.key), "Q4_K_M"),
               on_tensor=lambda name, nbytes: seen.append(name))
    assert loads == {name: 1 for name in tensors} and seen == list(tensors)
    assert is_gguf_file(tmp_path / "model.gguf")


def test_bad_input_is_refused_in_one_line_and_nothing_is_left(tmp_path):
    policy = quantization_policy("wan")
    good = {"blocks.0.self_attn.norm_q.weight": lazy(torch.ones(256)), "text_embedding.2.weight": lazy(torch.ones(256, 256)),
            "head.modulation": lazy(torch.ones(1, 2, 256)), "blocks.0.ffn.0.weight": lazy(torch.ones(512, 256))}
    with pytest.raises(CogExportError, match="not in the original wan layout"):
        plan_gguf({"blocks.0.attn1.to_q.weight": lazy(torch.ones(256, 256))}, policy, "Q8_0")
    with pytest.raises(CogExportError, match="unknown GGUF quantization 'Q3_Z'"):
        plan_gguf(good, policy, "Q3_Z")
    with pytest.raises(CogExportError, match="longer than GGUF's 127 bytes"):
        plan_gguf({**good, "x" * 130: lazy(torch.ones(4))}, policy, "Q8_0")
    with pytest.raises(CogExportError, match="holds float tensors"):
        plan_gguf({**good, "blocks.0.index": lazy(torch.ones(4, dtype=torch.int64))}, policy, "Q8_0")
    broken = torch.ones(512, 256)
    broken[3, 3] = float("nan")
    plan = plan_gguf({**good, "blocks.0.ffn.0.weight": lazy(broken)}, policy, "Q8_0")
    with pytest.raises(CogExportError, match="'blocks.0.ffn.0.weight' holds NaN or infinite values"):
        write_gguf(tmp_path / "model.gguf", plan)
    assert not (tmp_path / "model.gguf").exists()
    (tmp_path / "not.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(CogExportError, match="is not a readable GGUF file"):
        GgufCheckpoint(tmp_path / "not.gguf")


def test_every_family_file_is_valid():
    """Every family has quantized outputs: a family ComfyUI-GGUF loads has an architecture its loader accepts, and
    one it does not load has none (its loader refuses the file by that); each either names its ComfyUI quantized
    layers or says why it has none."""
    from cogexport.models.family import families as all_families
    from cogexport.quantize import quantizable_families

    families = quantizable_families()
    assert set(families) == {family.key for family in all_families()}
    for family in families:
        policy = quantization_policy(family)
        assert (policy.architecture in COMFY_ARCHITECTURES) == ("ComfyUI-GGUF" in policy.gguf_loaders), family
        assert bool(policy.fp8_quantize) != bool(policy.fp8_refused) and json.dumps(policy.roles), family
