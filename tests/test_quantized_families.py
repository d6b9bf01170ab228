"""The families whose quantized outputs came after Wan, HunyuanVideo and LTX-Video (Wan VACE, Wan Animate,
SkyReels-V2, HunyuanVideo 1.5, LTX-2, Mochi, Cosmos, Wan-Animate-2, MiniMax-H3), judged as those are
(test_gguf_file.py, test_gguf_diffusers.py, test_fp8_file.py) at fewer quantization types: each GGUF file read by
ComfyUI-GGUF's loader rules where it loads the family (else refused by them) and by the gguf package, every tensor the
reference's bytes of its source; loaded by Diffusers' GGUF loader where its single-file table has the class, giving
exactly the forward output of its dequantized weights; what each family keeps in high precision (HunyuanVideo 1.5's
cond_type_embedding, LTX-2's tables, Animate's motion encoder); LTX-2's ``config`` key, the release's own; and
ComfyUI's quantized safetensors of each family, the names put back on their weights by the family's judge. The GGUF
files no loader reads (CogVideoX, HunyuanVideo FramePack, Kandinsky 5, Kandinsky 6 and its SR model, SanaVideo) are
judged by the forward of their weights put back in Diffusers' names by an independent path, and from a release, a
DeepSpeed run and a LoRA run fused first."""

from __future__ import annotations

import json
import sys

import gguf
import numpy as np
import pytest
import torch
from conftest import assert_same_tensors
from fixtures import SCRIPTS
from quantized_models import MORE_FAMILIES, NO_LOADER_FAMILIES, original_tensors, saved_tiny
from safetensors import safe_open
from test_gguf_diffusers import dequantized_state, forward, gguf_package_weights, load_with_diffusers
from test_gguf_file import COMFY_ARCHITECTURES, comfy_gguf_load, comfy_gguf_metadata, lazy

from cogexport.checkpoint.gguf_file import GgufCheckpoint
from cogexport.models.family import family_named
from cogexport.quantize.check import check_gguf, reference_bytes
from cogexport.quantize.comfy_quant import comfy_quantization
from cogexport.quantize.policy import plan_gguf, quantization_policy
from cogexport.write.comfy_quant_file import plan_comfy_quant, write_comfy_quant
from cogexport.write.gguf_file import write_gguf

RUNS_IN_DIFFUSERS = [key for key, family in MORE_FAMILIES.items() if family.diffusers_loads]
# the families with ComfyUI quantized files (the others' quantized.toml says why they have none)
COMFY_QUANTIZED = [key for key in MORE_FAMILIES if quantization_policy(key).fp8_quantize]


# (the families no loader reads are judged through the command line below, verify comparing every tensor with the
# reference's bytes as the read-back test does)
@pytest.fixture(scope="module", params=[key for key in MORE_FAMILIES if key not in NO_LOADER_FAMILIES])
def tiny(request, tmp_path_factory):
    return saved_tiny(MORE_FAMILIES[request.param], tmp_path_factory)


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q8_0"])
def test_gguf_read_back_by_its_loaders_rules_and_verified(tiny, quant, tmp_path):
    family, _, tensors, _ = tiny
    policy = quantization_policy(family.key)
    plan = plan_gguf(tensors, policy, quant)
    assert not plan.notes  # every row of these widths fills its blocks
    write_gguf(tmp_path / "model.gguf", plan)
    if "ComfyUI-GGUF" in policy.gguf_loaders:
        loaded = comfy_gguf_load(tmp_path / "model.gguf")
        assert {name: tuple(t.shape) for name, t in loaded.items()} == {n: tuple(t.shape) for n, t in tensors.items()}
    else:  # no ComfyUI-GGUF architecture: its loader refuses the file by name
        assert policy.architecture not in COMFY_ARCHITECTURES
    with GgufCheckpoint(tmp_path / "model.gguf") as checkpoint:
        checks = check_gguf(checkpoint, tensors)
    assert all(check.exact for check in checks), [check.name for check in checks if not check.exact]
    assert max(check.rms_relative for check in checks) < 0.1


@pytest.mark.parametrize("key", RUNS_IN_DIFFUSERS)
def test_diffusers_loads_the_gguf_file_and_runs_it_as_its_dequantized_weights(key, tmp_path, monkeypatch):
    family = MORE_FAMILIES[key]
    model = family.build()
    model.save_config(tmp_path / "config")
    path = tmp_path / "model.gguf"
    write_gguf(path, plan_gguf(original_tensors(family, model), quantization_policy(key), "Q4_K_M"))
    loaded = load_with_diffusers(path, family, tmp_path, monkeypatch)
    by_diffusers, by_gguf_package = dequantized_state(loaded), gguf_package_weights(path, family)
    assert by_diffusers.keys() == model.state_dict().keys()
    for name, weight in by_diffusers.items():  # Diffusers dequantizes the block types in float16 arithmetic
        reference = by_gguf_package[name]
        assert torch.allclose(weight, reference, rtol=0, atol=2e-3 * reference.abs().max().item()), name
    plain = family.model_class()(**family.config).eval()
    plain.load_state_dict(by_diffusers, strict=True)
    if family.runs_forward:
        assert torch.equal(forward(loaded, family), forward(plain, family))
    else:  # judged by its weights: each the model's own up to the quantization (a row order gone wrong is not)
        for name, weight in model.state_dict().items():
            error = (by_diffusers[name] - weight).norm() / weight.norm().clamp_min(1e-12)
            assert error < 0.1, (name, error)


# name -> (shape, its type in a Q4_K_M file of a float32 source)
KEPT = {
    "wan_vace": {"vace_patch_embedding.weight": ((256, 8, 1, 2, 2), "F32"), "vace_blocks.0.modulation": ((1, 6, 256), "F32"),
                 "vace_blocks.0.self_attn.v.weight": ((256, 256), "Q6_K"), "vace_blocks.0.ffn.2.weight": ((256, 512), "Q6_K"),
                 "vace_blocks.0.after_proj.weight": ((256, 256), "Q4_K"), "text_embedding.2.weight": ((256, 256), "F16")},
    "wan_animate": {"motion_encoder.enc.fc.0.weight": ((512, 512), "F32"),
                    "motion_encoder.enc.net_app.convs.1.conv1.0.weight": ((64, 64, 3, 3), "F32"),
                    "face_encoder.padding_tokens": ((1, 1, 1, 5120), "F32"),
                    "face_adapter.fuser_blocks.0.linear1_q.weight": ((256, 256), "Q4_K"),
                    "pose_patch_embedding.weight": ((256, 4, 1, 2, 2), "F32"),
                    "blocks.0.cross_attn.v_img.weight": ((256, 256), "Q4_K")},
    "skyreels_v2": {"fps_embedding.weight": ((2, 5120), "F32"), "fps_projection.0.weight": ((256, 256), "F16"),
                    "blocks.0.self_attn.v.weight": ((256, 256), "Q6_K")},
    "hunyuanvideo15": {"cond_type_embedding.weight": ((3, 2048), "F32"), "byt5_in.fc2.weight": ((2048, 2048), "F16"),
                       "vision_in.proj.1.weight": ((256, 256), "F16"), "time_r_in.mlp.0.weight": ((256, 256), "F16"),
                       "double_blocks.0.img_attn_v.weight": ((256, 256), "Q6_K"),
                       "double_blocks.0.img_attn_q.weight": ((256, 256), "Q4_K"),
                       "double_blocks.0.img_mlp.fc2.weight": ((256, 1024), "Q4_K"),
                       "txt_in.individual_token_refiner.blocks.0.self_attn_qkv.weight": ((768, 256), "F16")},
    "ltx2": {"scale_shift_table": ((2, 256), "F32"), "transformer_blocks.0.audio_scale_shift_table": ((6, 256), "F32"),
             "transformer_blocks.0.scale_shift_table_a2v_ca_video": ((5, 256), "F32"),
             "keyframes_abs_pos_embedding": ((4096, 256), "F32"),
             "av_ca_video_scale_shift_adaln_single.linear.weight": ((1024, 256), "F16"),
             "audio_patchify_proj.weight": ((256, 128), "F16"), "audio_proj_out.weight": ((128, 256), "F16"),
             "transformer_blocks.0.audio_to_video_attn.to_v.weight": ((256, 256), "Q6_K"),
             "transformer_blocks.0.ff.net.2.weight": ((256, 1024), "Q6_K"),
             "transformer_blocks.0.audio_ff.net.2.weight": ((256, 1024), "Q4_K")},
    "cosmos": {"pos_embedder.seq": ((128,), "F32"), "pos_embedder.dim_spatial_range": ((2048,), "F32"),
               "x_embedder.proj.1.weight": ((256, 16), "F16"), "t_embedder.1.linear_2.weight": ((768, 256), "F16"),
               "t_embedding_norm.weight": ((256,), "F32"), "final_layer.linear.weight": ((16, 256), "F16"),
               "final_layer.adaln_modulation.1.weight": ((256, 256), "F16"),
               "blocks.0.self_attn.v_proj.weight": ((256, 256), "Q6_K"),
               "blocks.0.cross_attn.v_proj.weight": ((256, 256), "Q6_K"),
               "blocks.0.self_attn.q_proj.weight": ((256, 256), "Q4_K"),
               "blocks.0.mlp.layer2.weight": ((256, 1024), "Q6_K"),
               "blocks.0.adaln_modulation_mlp.2.weight": ((768, 256), "Q6_K"),
               "blocks.0.adaln_modulation_mlp.1.weight": ((256, 256), "Q4_K"),
               "crossattn_proj.0.weight": ((256, 1024), "Q4_K")},
    "wan_animate2": {"blocks.0.block.modulation": ((1, 6, 256), "F32"), "head.modulation": ((1, 2, 256), "F32"),
                     "blocks.0.block.self_attn.v.weight": ((256, 256), "Q6_K"),
                     "blocks.0.block.cross_attn.v_img.weight": ((256, 256), "Q4_K"),
                     "blocks.0.block.ffn.2.weight": ((256, 512), "Q6_K"),
                     "blocks.0.block.cross_attn.k_img.weight": ((256, 256), "Q4_K"),
                     "img_emb.proj.1.weight": ((256, 1280), "F16"), "time_projection.1.weight": ((1536, 256), "F16")},
    "mochi": {"pos_frequencies": ((3, 2, 64), "F32"), "x_embedder.proj.weight": ((768, 4, 2, 2), "F16"),
              "t5_y_embedder.to_kv.weight": ((512, 256), "F16"), "final_layer.linear.weight": ((16, 768), "F16"),
              "blocks.0.attn.qkv_x.weight": ((2304, 768), "Q4_K"), "blocks.0.mlp_y.w2.weight": ((768, 2048), "Q4_K")},
    # the families no loader reads: ComfyUI-GGUF's rules on their names (`^`: a top-level module, not the blocks')
    "cogvideox": {"mixins.pos_embed.pos_embedding": ((1, 1234, 256), "F32"),
                  "mixins.patch_embed.text_proj.weight": ((256, 256), "F16"),
                  "time_embed.0.weight": ((256, 256), "F16"),
                  "ofs_embed.2.weight": ((256, 256), "F16"), "mixins.final_layer.linear.weight": ((16, 256), "F16"),
                  "transformer.layers.0.attention.query_key_value.weight": ((768, 256), "Q5_K"),
                  "transformer.layers.0.mlp.dense_4h_to_h.weight": ((256, 1024), "Q6_K"),
                  "mixins.adaln_layer.adaLN_modulations.0.1.weight": ((3072, 256), "Q4_K")},
    "framepack": {"proj_out.weight": ((16, 256), "F16"),
                  "single_transformer_blocks.0.proj_out.weight": ((256, 1280), "Q4_K"),
                  "norm_out.linear.weight": ((512, 256), "F16"), "image_projection.up.weight": ((768, 256), "F16"),
                  "context_embedder.token_refiner.refiner_blocks.0.attn.to_v.weight": ((256, 256), "F16"),
                  "clean_x_embedder.proj_4x.weight": ((256, 4, 4, 8, 8), "F32"),
                  "transformer_blocks.0.attn.add_v_proj.weight": ((256, 256), "Q6_K"),
                  "transformer_blocks.0.ff_context.net.2.weight": ((256, 1024), "Q6_K")},
    "kandinsky5": {"out_layer.out_layer.weight": ((16, 256), "F16"),
                   "out_layer.modulation.out_layer.weight": ((512, 256), "F16"),
                   "visual_transformer_blocks.0.feed_forward.out_layer.weight": ((256, 512), "Q6_K"),
                   "visual_transformer_blocks.0.self_attention.out_layer.weight": ((256, 256), "Q4_K"),
                   "visual_transformer_blocks.0.cross_attention.to_value.weight": ((256, 256), "Q6_K"),
                   "time_embeddings.in_layer.weight": ((256, 256), "F16")},
    "kandinsky6": {"audio_outLayer.out_layer.weight": ((8, 256), "F16"),
                   "out_layer.out_layer.weight": ((16, 256), "F16"),
                   "visual_token_type_embeddings.weight": ((2, 4096), "F16"),
                   "audio_pooled_text_embeddings.in_layer.weight": ((256, 256), "F16"),
                   "visual_blocks.0.av_cross_attention.to_value.weight": ((256, 256), "Q6_K"),
                   "visual_blocks.0.videoT.feed_forward.out_layer.weight": ((256, 512), "Q6_K"),
                   "visual_blocks.0.va_modulation.out_layer.weight": ((768, 256), "Q4_K")},
    "kandinsky6_sr": {"out_layer.modulation.out_layer.weight": ((512, 256), "F16"), "pooled_bias": ((256,), "F32"),
                      "visual_transformer_blocks.0.self_attention.to_value.weight": ((256, 256), "Q6_K")},
    "sana_video": {"y_embedder.y_embedding": ((300, 256), "F32"), "blocks.0.scale_shift_table": ((6, 256), "F32"),
                   "final_layer.scale_shift_table": ((2, 2240), "F32"), "pos_embed": ((1, 16, 256), "F16"),
                   "logvar_linear.weight": ((1, 2240), "F16"), "t_block.1.weight": ((1536, 256), "F16"),
                   "blocks.0.mlp.inverted_conv.conv.weight": ((1024, 256, 1, 1), "F16"),
                   "blocks.0.attn.qkv.weight": ((768, 256), "Q5_K"),
                   "blocks.0.cross_attn.kv_linear.weight": ((512, 256), "Q5_K"),
                   "blocks.0.cross_attn.q_linear.weight": ((256, 256), "Q4_K")},
}


def test_what_each_family_keeps_in_high_precision():
    for family, expected in KEPT.items():
        policy = quantization_policy(family)
        signature = {glob.replace("*", "0"): lazy(torch.zeros(4)) for glob in policy.signature}  # the names it needs
        tensors = {**signature, **{name: lazy(torch.zeros(shape)) for name, (shape, _) in expected.items()}}
        types = {t.name: t.type.name for t in plan_gguf(tensors, policy, "Q4_K_M").tensors}
        assert {name: types[name] for name in expected} == {n: kind for n, (_, kind) in expected.items()}, family


@pytest.mark.parametrize("dtype, kept", [(torch.float32, "F32"), (torch.bfloat16, "F32"), (torch.float16, "F16")])
def test_hunyuanvideo15_cond_type_embedding_is_never_quantized(dtype, kept):
    """Quantized, ComfyUI no longer loads it (ComfyUI-GGUF PR #364); from fp32 or bf16, F32 as convert.py keeps
    parameters a BF16 copy would break; from fp16 the file's float type."""
    tensors = {name: lazy(torch.ones(shape, dtype=dtype)) for name, shape in (
        ("cond_type_embedding.weight", (3, 2048)), ("double_blocks.0.img_attn_proj.weight", (2048, 2048)),
        ("txt_in.individual_token_refiner.blocks.0.self_attn_qkv.weight", (6144, 2048)),
        ("byt5_in.fc1.weight", (2048, 1472)))}  # the family's signature, a release's shapes
    for quant in ("Q8_0", "Q4_K_M", "Q4_0"):
        types = {t.name: t.type.name for t in plan_gguf(tensors, quantization_policy("hunyuanvideo15"), quant).tensors}
        assert types["cond_type_embedding.weight"] == kept and types["double_blocks.0.img_attn_proj.weight"] != kept


def test_ltx2_gguf_holds_the_release_config_comfyui_detects_it_by(cli, tmp_path):
    """ComfyUI-GGUF hands the file's string keys on; ComfyUI's detection of an LTX-2 model reads the transformer
    section of ``config``: the same JSON --to original writes into the release file's metadata."""
    family = MORE_FAMILIES["ltx2"]
    family.build().save_pretrained(tmp_path / "model")
    assert cli(tmp_path / "model", tmp_path / "gguf", "--to", "gguf", "--quant", "Q8_0").exit_code == 0
    assert cli(tmp_path / "model", tmp_path / "release", "--to", "original").exit_code == 0
    (path,) = (tmp_path / "gguf").glob("*.gguf")
    (release,) = (tmp_path / "release").glob("*.safetensors")
    metadata = comfy_gguf_metadata(path)
    with safe_open(release, "pt") as handle:
        assert metadata["config"] == handle.metadata()["config"]
    transformer = json.loads(metadata["config"])["transformer"]
    assert (transformer["num_layers"], transformer["attention_head_dim"], transformer["cross_attention_dim"]) == (1, 128,
                                                                                                               256)
    assert metadata["general.architecture"] == "ltxv"
    assert "LTX-2" in cli("inspect", path).stdout


@pytest.mark.parametrize("key", COMFY_QUANTIZED)
def test_comfyui_fp8_quantizes_the_family_layers_and_the_judge_puts_every_name_back(key, tmp_path):
    family = MORE_FAMILIES[key]
    model = family.build()
    tensors = original_tensors(family, model)
    plan = plan_comfy_quant(tensors, quantization_policy(key), comfy_quantization("fp8"), keep_dtype=torch.bfloat16)
    assert plan.layers and not plan.notes
    write_comfy_quant(tmp_path / "model.safetensors", plan)
    with safe_open(tmp_path / "model.safetensors", "pt") as handle:
        stored = {name: handle.get_tensor(name) for name in handle.keys()}
    dequantized = {name: t.float() for name, t in stored.items() if not name.endswith(("weight_scale", "comfy_quant"))}
    for layer in plan.layers:
        assert stored[f"{layer}.weight"].dtype == torch.float8_e4m3fn
        dequantized[f"{layer}.weight"] = stored[f"{layer}.weight"].float() * stored[f"{layer}.weight_scale"]
    assert family.converter_function()(dequantized).keys() == model.state_dict().keys()


def test_cosmos_gguf_leaves_out_what_convert_py_ignores_and_keeps_the_rope_tables_in_f32(cli, tmp_path):
    """NVIDIA's release -> Diffusers (its training counters and Transformer Engine's bytes kept beside) -> GGUF: as
    ComfyUI-GGUF's convert.py makes it, without _extra_state / accum_* (no float tensors: the file could not hold
    them), the RoPE tables (pos_embedder.*) in F32, every other tensor of the release present; verified against the
    Diffusers folder it was made from."""
    sys.path.insert(0, str(SCRIPTS))
    from make_tiny_cosmos import build_transformer, write_release_files

    model = build_transformer("2", seed=0)
    model.save_pretrained(tmp_path / "base")
    release = write_release_files(tmp_path / "release", model, model)["model_ema_bf16.pt"]
    assert cli(release, tmp_path / "diffusers", "--base", tmp_path / "base").exit_code == 0
    result = cli(tmp_path / "diffusers", tmp_path / "gguf", "--to", "gguf", "--quant", "Q8_0")
    assert result.exit_code == 0, result.stderr
    (path,) = (tmp_path / "gguf").glob("*.gguf")
    loaded = comfy_gguf_load(path)
    names = {name.removeprefix("net.") for name in torch.load(release, weights_only=True)}
    ignored = {name for name in names if "_extra_state" in name or "accum_" in name}
    assert ignored and set(loaded) == names - ignored
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert {types[name] for name in loaded if name.startswith("pos_embedder.")} == {"F32"}
    assert comfy_gguf_metadata(path)["general.architecture"] == "cosmos"
    # verify asks the way back for what it adds beside the Diffusers weights (the RoPE tables), as the export did
    verified = cli("verify", tmp_path / "gguf", "--against", tmp_path / "diffusers")
    assert verified.exit_code == 0, verified.stdout + verified.stderr


def test_minimax_h3_quantized_files_hold_comfyuis_single_file_layout(cli, tmp_path):
    """MiniMax-H3's quantized files are in the layout of the single files people load (qkv_proj's rows stacked
    [q; k; v]), not the release's shards' (interleaved per head): Diffusers' converter, taking a single file as
    stacked (as its GGUF loader does, test_diffusers_loads_the_gguf_file...), gets the model's own weights back from
    the file; verify agrees; the fp8 file's qkv_proj is the stacked one."""
    from safetensors.torch import load_file

    family = MORE_FAMILIES["minimax_h3"]
    model = family.build()
    model.save_pretrained(tmp_path / "model")
    assert cli(tmp_path / "model", tmp_path / "gguf", "--to", "gguf", "--quant", "Q8_0").exit_code == 0
    (path,) = (tmp_path / "gguf").glob("*.gguf")
    read_back = gguf_package_weights(path, family)
    for name, weight in model.state_dict().items():
        assert (read_back[name] - weight).norm() / weight.norm() < 0.01, name
    verified = cli("verify", tmp_path / "gguf", "--against", tmp_path / "model")
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert cli(tmp_path / "model", tmp_path / "fp8", "--to", "comfyui", "--quant", "fp8").exit_code == 0
    stored = load_file(next((tmp_path / "fp8").glob("*.safetensors")))
    qkv = stored["blocks.0.attn.qkv_proj.weight"].float() * stored["blocks.0.attn.qkv_proj.weight_scale"]
    state = model.state_dict()
    stacked = torch.cat([state[f"transformer_blocks.0.attn.to_{p}.weight"] for p in "qkv"])
    assert (qkv - stacked).norm() / stacked.norm() < 0.05


def _dequantized(stored: np.ndarray, kind: str, shape: tuple[int, ...]) -> torch.Tensor:
    values = gguf.quants.dequantize(stored, gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(shape)


def _loaded(family, weights: dict[str, torch.Tensor]):
    model = family.model_class()(**family.config).eval()
    model.load_state_dict(weights, strict=True)
    return model


@pytest.mark.parametrize("key", list(NO_LOADER_FAMILIES))
def test_a_gguf_no_loader_reads_runs_as_the_reference_quantization_of_its_weights(key, cli, tmp_path):
    """A Diffusers folder through the command line, for a family no GGUF loader reads (the run says so): the file
    read by the gguf package and put back in Diffusers' names by a path independent of cogexport's tables (the
    family's converter, which gives the model's own tensors back from the unquantized original names) gives a model
    whose forward output is exactly that of the model's weights quantized by the reference quantizers at the file's
    types and dequantized the same way; verify agrees, inspect names the family."""
    family = NO_LOADER_FAMILIES[key]
    model = family.build()
    model.save_pretrained(tmp_path / "model")
    result = cli(tmp_path / "model", tmp_path / "gguf", "--to", "gguf", "--quant", "Q4_K_M")
    assert result.exit_code == 0, result.stderr
    name = family_named(key).name
    assert f"no GGUF loader (ComfyUI-GGUF, Diffusers) reads {name} GGUF files today" in result.stderr
    (path,) = (tmp_path / "gguf").glob("*.gguf")
    truth = {name: tensor.load() for name, tensor in original_tensors(family, model).items()}
    converter = family.converter_function()
    assert_same_tensors(converter(truth), model.state_dict())  # the judge of the names
    by_file, by_reference = {}, {}
    for tensor in gguf.GGUFReader(path).tensors:
        shape, kind = tuple(reversed(tensor.shape.tolist())), tensor.tensor_type.name
        by_file[tensor.name] = _dequantized(np.array(tensor.data), kind, shape)
        by_reference[tensor.name] = _dequantized(reference_bytes(truth[tensor.name], kind)[0], kind, shape)
    assert by_file.keys() == truth.keys()
    output = forward(_loaded(family, converter(by_file)), family)
    assert torch.equal(output, forward(_loaded(family, converter(by_reference)), family))
    unquantized = forward(model, family)
    assert ((output - unquantized).norm() / unquantized.norm()).item() < 0.25
    policy = quantization_policy(key)  # its architecture cogexport's own: ComfyUI-GGUF's loader refuses the file by it
    assert comfy_gguf_metadata(path)["general.architecture"] == policy.architecture not in COMFY_ARCHITECTURES
    assert not policy.gguf_loaders
    verified = cli("verify", tmp_path / "gguf", "--against", tmp_path / "model")
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    assert name in cli("inspect", path).stdout


def test_sana_video_gguf_from_the_release_keeps_its_null_caption_and_tables_in_f32(cli, tmp_path):
    """NVlabs' release -> Diffusers (what its class has no place for kept beside) -> GGUF: every tensor of the
    release under its name (make_tiny_sana_video.py writes it independently of the key maps), the learned null caption
    and the scale-shift tables in F32, the position buffer and the logvar head not quantized; verified against the
    Diffusers folder it was made from."""
    sys.path.insert(0, str(SCRIPTS))
    from make_tiny_sana_video import release_state_dict, write_release

    model = NO_LOADER_FAMILIES["sana_video"].build()
    model.save_pretrained(tmp_path / "base")
    release = write_release(tmp_path / "release", model)["pth"]
    assert cli(release, tmp_path / "diffusers", "--base", tmp_path / "base", "--dtype", "fp32").exit_code == 0
    result = cli(tmp_path / "diffusers", tmp_path / "gguf", "--to", "gguf", "--quant", "Q8_0")
    assert result.exit_code == 0, result.stderr
    (path,) = (tmp_path / "gguf").glob("*.gguf")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    truth = release_state_dict(model)
    assert set(types) == set(truth)
    assert {types[name] for name in truth if "scale_shift_table" in name} == {"F32"}
    assert (types["y_embedder.y_embedding"], types["pos_embed"], types["blocks.0.attn.qkv.weight"]) == ("F32", "F16",
                                                                                                        "Q8_0")
    assert types["logvar_linear.weight"] in ("F32", "F16")
    with GgufCheckpoint(path) as checkpoint:  # every tensor the reference's bytes of the independent writer's
        assert all(check.exact for check in check_gguf(checkpoint, {n: lazy(t) for n, t in truth.items()}))
    verified = cli("verify", tmp_path / "gguf", "--against", tmp_path / "diffusers")
    assert verified.exit_code == 0, verified.stdout + verified.stderr


def test_gguf_of_a_deepspeed_run_of_a_family_no_loader_reads_is_its_fp32_masters_quantized(cli, tmp_path):
    """A SanaVideo fine-tune under DeepSpeed ZeRO-2 (bf16, 2 ranks): the file holds the fp32 masters taken in
    training (not the bf16 module copies), each tensor the reference's bytes of them in the release's names (an
    independent writer's)."""
    sys.path.insert(0, str(SCRIPTS))
    from make_tiny_sana_video import release_state_dict
    from sana_video_fixtures import build_transformer, deepspeed_finetune

    run = deepspeed_finetune()
    trained = build_transformer(seed=0)
    trained.save_pretrained(tmp_path / "base")
    trained.load_state_dict(run.expected_state_dict(), strict=True)
    result = cli(run.checkpoint, tmp_path / "gguf", "--base", tmp_path / "base", "--to", "gguf", "--quant", "Q8_0")
    assert result.exit_code == 0, result.stderr
    (path,) = (tmp_path / "gguf").glob("*.gguf")
    buffers = ("y_embedder.y_embedding", "pos_embed", "logvar")  # the release's own, which the run never had
    truth = {name: t for name, t in release_state_dict(trained).items() if not name.startswith(buffers)}
    with GgufCheckpoint(path) as checkpoint:
        assert set(checkpoint) == set(truth)
        checks = check_gguf(checkpoint, {n: lazy(t) for n, t in truth.items()})
        assert all(check.exact for check in checks), [check.name for check in checks if not check.exact]
        # the run's tensors are small (most of at most 1,024 values: F32, the masters bit for bit), which a bf16
        # copy would miss as the F16 ones would
        assert {check.type for check in checks} == {"F32", "F16"}


def test_gguf_of_a_lora_run_of_a_family_no_loader_reads_is_fused_first(cli, tmp_path):
    """A Diffusers Kandinsky 5 LoRA (the pipeline's own save_lora_weights) on a Diffusers folder: fused, then
    quantized; every tensor the reference's bytes of the fused weights (Kandinsky 5's release names are Diffusers'
    own)."""
    from diffusers import Kandinsky5T2VPipeline
    from lora_helpers import merged, random_modules, write_diffusers_lora

    model = NO_LOADER_FAMILIES["kandinsky5"].build()
    model.save_pretrained(tmp_path / "base")
    weights = model.state_dict()
    layers = [f"visual_transformer_blocks.0.{module}" for module in (
        "self_attention.to_query", "self_attention.to_value", "cross_attention.out_layer", "feed_forward.out_layer")]
    modules = random_modules({n: t.shape for n, t in weights.items()}, layers, 0, ((4, 8.0), (8, 4.0)))
    lora = write_diffusers_lora(Kandinsky5T2VPipeline, tmp_path / "lora", modules)
    truth = merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in modules.items()})
    result = cli(lora, tmp_path / "gguf", "--base", tmp_path / "base", "--to", "gguf", "--quant", "Q4_K_M")
    assert result.exit_code == 0, result.stderr
    (path,) = (tmp_path / "gguf").glob("*.gguf")
    with GgufCheckpoint(path) as checkpoint:
        assert set(checkpoint) == set(truth)
        checks = check_gguf(checkpoint, {n: lazy(t) for n, t in truth.items()})
    assert all(check.exact for check in checks), [check.name for check in checks if not check.exact]
    assert all(not torch.equal(truth[f"{layer}.weight"], weights[f"{layer}.weight"]) for layer in layers)
