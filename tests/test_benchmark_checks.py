"""Each benchmark checks every tool's output against ground truth before timing it. Those checks must pass on a
right output and refuse a wrong one: here each is fed real outputs at tiny sizes, then outputs spoiled in one
place (a value, a dtype, a missing or extra tensor)."""

from __future__ import annotations

import json
import re
import shutil
import struct
import sys
import zipfile

import pytest
import torch
from cogvideox_fixtures import tiny_transformer_config
from fixtures import SCRIPTS, DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import load_file, save_file

from cogexport.consolidation import consolidate
from cogexport.errors import CogExportError
from cogexport.exporter import export
from cogexport.universal import universal

sys.path.insert(0, str(SCRIPTS))
from benchmark_consolidate import SKIP_CRC  # noqa: E402
from benchmark_export import TruthMismatch as ExportMismatch  # noqa: E402
from benchmark_export import check_export, meta_model, reference_export, write_run  # noqa: E402
from benchmark_universal import TruthMismatch as UniversalMismatch  # noqa: E402
from benchmark_universal import check_universal  # noqa: E402
from check_against_truth import TruthMismatch, check_consolidated  # noqa: E402
from single_file_benchmark import DIFFUSERS_REPO  # noqa: E402

TOY = DeepSpeedVariant(3, "bf16", 2)  # frozen, tied, float and int buffers, Adam states, flat ZeRO-3 partitions


def spoil(path, name, change) -> None:
    """Rewrite one tensor of a safetensors file."""
    tensors = load_file(path)
    tensors[name] = change(tensors[name])
    save_file(tensors, path)


def flip_first(tensor: torch.Tensor) -> torch.Tensor:
    """The same tensor with its first element changed (by more than any rounding)."""
    spoiled = tensor.clone()
    spoiled.view(-1)[0] += 1
    return spoiled


# consolidate: check_against_truth.py, and the row without CRC-32 checks ----------------------------------------

@pytest.fixture(scope="module")
def toy():
    return deepspeed_checkpoint(TOY)


def test_the_crc_checks_off_row_reads_the_same_without_them(tmp_path, monkeypatch):
    """benchmark_consolidate.py times cogexport with its CRC-32 checks off through the private variable cogexport
    reads: with it, a flipped byte of tensor data goes through unseen; without it, the same file is refused. So the
    row does the same work but the checks, and their cost is the difference of the two rows."""
    path = tmp_path / "state.pt"
    torch.save({"weight": torch.arange(64, dtype=torch.float32)}, path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        member = next(info for info in archive.infolist() if "/data/" in info.filename)
    name_length, extra_length = struct.unpack_from("<HH", data, member.header_offset + 26)
    data[member.header_offset + 30 + name_length + extra_length + 5] ^= 0x40
    path.write_bytes(bytes(data))
    monkeypatch.delenv(SKIP_CRC, raising=False)
    with pytest.raises(CogExportError, match="fails its CRC-32 check"):
        consolidate(path, tmp_path / "checked")
    monkeypatch.setenv(SKIP_CRC, "1")
    consolidate(path, tmp_path / "unchecked")
    weight = load_file(tmp_path / "unchecked" / "model.safetensors")["weight"]
    assert not torch.equal(weight, torch.arange(64, dtype=torch.float32))


def test_consolidate_check_accepts_right_outputs_at_each_dtype(toy, tmp_path):
    for dtype in ("fp32", "bf16"):
        consolidate(toy.checkpoint, tmp_path / dtype, dtype=dtype)
        assert check_consolidated(tmp_path / dtype, toy.root, dtype)["tensors"] == len(toy.truth["order"])
    # zero_to_fp32's default output: a torch .bin file
    torch.save(load_file(tmp_path / "fp32" / "model.safetensors"), tmp_path / "pytorch_model.bin")
    check_consolidated(tmp_path / "pytorch_model.bin", toy.root)


@pytest.mark.parametrize("spoiled, message", [
    ("value", "values differ"), ("dtype", "dtype torch.bfloat16, expected torch.float32"), ("missing", "missing"),
    ("extra", "not in the module's state_dict"), ("int buffer", "values differ"),
])
def test_consolidate_check_refuses_a_wrong_output(toy, tmp_path, spoiled, message):
    consolidate(toy.checkpoint, tmp_path / "out", dtype="fp32")
    path = tmp_path / "out" / "model.safetensors"
    trained = toy.truth["trainable"][0]
    if spoiled == "value":
        spoil(path, trained, flip_first)
    elif spoiled == "dtype":
        spoil(path, trained, lambda tensor: tensor.to(torch.bfloat16))
    elif spoiled == "int buffer":
        spoil(path, "step_count", flip_first)
    else:
        tensors = load_file(path)
        if spoiled == "missing":
            del tensors[trained]
        else:
            tensors["stray.weight"] = torch.zeros(2)
        save_file(tensors, path)
    with pytest.raises(TruthMismatch, match=message):
        check_consolidated(tmp_path / "out", toy.root)


def test_a_bf16_consolidation_is_not_passed_as_fp32(toy, tmp_path):
    """The old script cast the truth to whatever was written and called it bit for bit."""
    consolidate(toy.checkpoint, tmp_path / "out", dtype="bf16")
    with pytest.raises(TruthMismatch, match="expected torch.float32"):
        check_consolidated(tmp_path / "out", toy.root, "fp32")


# universal: benchmark_universal.check_universal -----------------------------------------------------------------

@pytest.fixture(scope="module")
def toy_universal(toy, tmp_path_factory):
    output = tmp_path_factory.mktemp("universal") / "out"
    universal(toy.checkpoint, output)
    return output


def rewrite_state(path, change) -> None:
    saved = torch.load(path, weights_only=False)  # written by this test's own conversion
    if isinstance(saved, dict):
        saved["param"] = change(saved["param"])
    else:
        saved = change(saved)
    torch.save(saved, path)


def test_universal_check_accepts_the_right_output(toy, toy_universal):
    checked = check_universal(toy_universal, toy.root)
    assert checked["states"] == ["fp32", "exp_avg", "exp_avg_sq"]
    assert checked["files_compared"] == 3 * len(toy.truth["trainable"])


@pytest.mark.parametrize("spoiled, message", [
    ("fp32", "values differ"), ("exp_avg_sq", "values differ"), ("dtype", "dtype torch.bfloat16"),
    ("missing", "missing"), ("flat", "shape"),
])
def test_universal_check_refuses_a_wrong_output(toy, toy_universal, tmp_path, spoiled, message):
    output = shutil.copytree(toy_universal, tmp_path / "out")
    folder = output / "zero" / toy.truth["trainable"][0]
    if spoiled == "missing":
        (folder / "exp_avg.pt").unlink()
    elif spoiled == "dtype":
        rewrite_state(folder / "exp_avg.pt", lambda tensor: tensor.to(torch.bfloat16))
    elif spoiled == "flat":
        rewrite_state(folder / "fp32.pt", lambda tensor: tensor.reshape(-1))
    else:
        rewrite_state(folder / f"{spoiled}.pt", flip_first)
    with pytest.raises(UniversalMismatch, match=message):
        check_universal(output, toy.root)


def test_universal_check_takes_flat_tensors_only_where_told(toy, toy_universal, tmp_path):
    """DeepSpeed's ZeRO-3 output is flat: accepted flat when the benchmark says so, but only with the right values."""
    output = shutil.copytree(toy_universal, tmp_path / "out")
    for path in (output / "zero").glob("*/*.pt"):
        if path.stem != "step":
            rewrite_state(path, lambda tensor: tensor.reshape(-1))
    check_universal(output, toy.root, full_shapes=False)
    rewrite_state(output / "zero" / toy.truth["trainable"][0] / "fp32.pt", flip_first)
    with pytest.raises(UniversalMismatch, match="values differ"):
        check_universal(output, toy.root, full_shapes=False)


# export: benchmark_export.check_export --------------------------------------------------------------------------

CONFIG = tiny_transformer_config("2b")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A tiny SAT run written the benchmark's way, exported by cogexport and by the reference path."""
    work = tmp_path_factory.mktemp("export")
    write_run(work / "run", CONFIG)
    meta_model(CONFIG).save_config(work / "base")
    export(work / "run", work / "cogexport", base=work / "base", model_type="t2v")
    reference_export(work / "run", work / "reference", CONFIG)
    return work


def test_export_check_accepts_both_tools_outputs(exports):
    ours = check_export(exports / "cogexport", CONFIG, all_bf16=False)
    # weight and bias of norm1.norm, norm2.norm, norm_q and norm_k in 2 blocks, of norm_final and norm_out.norm
    assert ours["kept_fp32"] == 20 and ours["tensors"] == len(meta_model(CONFIG).state_dict())
    check_export(exports / "reference", CONFIG, all_bf16=True)


def test_export_check_holds_each_tool_to_its_own_dtypes(exports):
    with pytest.raises(ExportMismatch, match="expected torch.bfloat16"):
        check_export(exports / "cogexport", CONFIG, all_bf16=True)
    with pytest.raises(ExportMismatch, match="norm1.norm.weight: dtype torch.bfloat16, expected torch.float32"):
        check_export(exports / "reference", CONFIG, all_bf16=False)


@pytest.mark.parametrize("spoiled, message", [
    ("value", "values differ"), ("norm in bf16", "expected torch.float32"), ("missing", "missing"),
    ("extra", "not in the model"), ("config", "config.json num_layers"),
])
def test_export_check_refuses_a_wrong_output(exports, tmp_path, spoiled, message):
    output = shutil.copytree(exports / "cogexport", tmp_path / "out")
    path = output / "diffusion_pytorch_model.safetensors"
    if spoiled == "value":
        spoil(path, "transformer_blocks.1.norm1.linear.weight", flip_first)
    elif spoiled == "norm in bf16":
        spoil(path, "norm_final.weight", lambda tensor: tensor.to(torch.bfloat16))
    elif spoiled == "config":
        config = json.loads((output / "config.json").read_text())
        (output / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    else:
        tensors = load_file(path)
        if spoiled == "missing":
            del tensors["transformer_blocks.0.attn1.to_k.bias"]
        else:
            tensors["transformer_blocks.9.attn1.to_k.bias"] = torch.zeros(2)
        save_file(tensors, path)
    with pytest.raises(ExportMismatch, match=message):
        check_export(output, CONFIG, all_bf16=False)


# the family benchmarks: single_file_benchmark.compare_outputs ----------------------------------------------------

@pytest.fixture(scope="module")
def single_file_exports(tmp_path_factory):
    """A tiny Wan release made the benchmarks' way (random fp32 weights in the original layout), exported by cogexport
    and by the reference path (from_single_file with a local config, save_pretrained)."""
    from single_file_benchmark import (meta_model, original_names, reference_export, release_setup,
                                       write_random_safetensors)
    from wan_tiny_configs import tiny_transformer_config as tiny_wan_config

    from cogexport.models import wan
    from cogexport.write.diffusers_folders import write_config_json

    work = tmp_path_factory.mktemp("single-file")
    model = meta_model("WanTransformer3DModel", tiny_wan_config("t2v"))
    weights = work / "release" / "diffusion_pytorch_model.safetensors"
    write_random_safetensors(weights, [("", original_names(model, "wan/original_transformer"))], dtype="float32")
    write_config_json(work / "release" / "config.json", wan.original_config(dict(model.config), "t2v"))
    setup = release_setup(work / "release", weights, work / "config", model)
    export(work / "release", work / "cogexport")
    reference_export(weights, "WanTransformer3DModel", work / "config", work / "reference")
    return work, setup


def spoil_wan_output(path, spoiled: str) -> None:
    """Spoil a tiny Wan export's weights file in one place, as ``spoiled`` says."""
    tensors = load_file(path)
    kept = next(name for name, tensor in tensors.items() if tensor.dtype == torch.float32)
    if spoiled == "value":
        spoil(path, "blocks.0.attn1.to_q.weight", flip_first)
    elif spoiled == "kept fp32 value":
        spoil(path, kept, flip_first)
    elif spoiled == "kept fp32 as bf16":
        spoil(path, kept, lambda tensor: tensor.to(torch.bfloat16))
    elif spoiled == "shape":
        spoil(path, "blocks.0.attn1.to_q.bias", lambda tensor: tensor[:-1])
    elif spoiled == "missing":
        del tensors["blocks.0.attn1.to_k.bias"]
        save_file(tensors, path)
    elif spoiled == "extra":
        save_file({**tensors, "blocks.9.attn1.to_k.bias": torch.zeros(2, dtype=torch.bfloat16)}, path)
    else:
        raise ValueError(spoiled)


def test_single_file_compare_accepts_the_two_tools_outputs(single_file_exports):
    from single_file_benchmark import compare_outputs

    work, setup = single_file_exports
    checked = compare_outputs(work / "cogexport", work / "reference")
    assert checked["numel"] == setup["parameters"]
    assert checked["tensors"] == len(load_file(work / "reference" / "diffusion_pytorch_model.safetensors"))
    assert checked["kept_fp32"] > 0  # the class's _keep_in_fp32_modules, compared after the reference's rounding


@pytest.mark.parametrize("spoiled, message", [
    ("value", "values differ"), ("kept fp32 value", "values differ"), ("dtype", r"vs torch.float32 \(reference\)"),
    ("shape", "shape"), ("missing", "only in the reference's"), ("extra", "only in cogexport's"),
    ("config", "config.json num_layers"),
])
def test_single_file_compare_refuses_a_difference(single_file_exports, tmp_path, spoiled, message):
    import click
    from single_file_benchmark import compare_outputs

    work, _ = single_file_exports
    ours = shutil.copytree(work / "cogexport", tmp_path / "ours")
    reference = shutil.copytree(work / "reference", tmp_path / "reference")
    if spoiled == "dtype":  # the reference path must write bf16
        spoil(reference / "diffusion_pytorch_model.safetensors", "blocks.0.attn1.to_q.weight",
              lambda tensor: tensor.float())
    elif spoiled != "config":
        spoil_wan_output(ours / "diffusion_pytorch_model.safetensors", spoiled)
    else:
        config = json.loads((ours / "config.json").read_text())
        (ours / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    with pytest.raises(click.ClickException, match=message):
        compare_outputs(ours, reference)


# the family benchmarks' releases: each made as published, both tools reading it to the same model -----------------

# Wan-Animate-2 at toy size: two blocks, 2 heads of 8 (the CLIP projection, 1280 wide, is a constant of the class)
TINY_ANIMATE2 = {"dim": 16, "ffn_dim": 32, "freq_dim": 8, "text_dim": 12, "num_heads": 2, "num_layers": 2,
                 "in_dim": 36, "out_dim": 16, "text_len": 8}


@pytest.mark.parametrize("variant", ["chronoedit-14b", "animate2-14b"])
def test_wan_variant_releases_read_alike_by_both_tools(variant, tmp_path):
    """benchmark_wan_variants.py's ChronoEdit release (Wan's names, the WanModel config.json recording the RoPE skip
    beside them) and Wan-Animate-2 release (its one bf16 file, no config: cogexport given --base) export with
    cogexport to what from_single_file then save_pretrained writes; ChronoEdit stays ChronoEdit, its RoPE kept."""
    from benchmark_wan_variants import VARIANTS, write_release
    from single_file_benchmark import compare_outputs, release_setup
    from single_file_benchmark import reference_export as single_file_reference
    from wan_tiny_configs import tiny_transformer_config as tiny_wan_config

    chronoedit = variant == "chronoedit-14b"
    config = {**tiny_wan_config("i2v"), "rope_temporal_skip_len": 4} if chronoedit else TINY_ANIMATE2
    release, weights, model = write_release(tmp_path / "release", variant, config)
    setup = release_setup(release, weights, tmp_path / "config", model)
    export(release, tmp_path / "ours", base=None if chronoedit else tmp_path / "config")
    single_file_reference(weights, VARIANTS[variant].class_name, tmp_path / "config", tmp_path / "reference")
    assert compare_outputs(tmp_path / "ours", tmp_path / "reference")["numel"] == setup["parameters"]
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["_class_name"] == VARIANTS[variant].class_name
    assert written.get("rope_temporal_skip_len") == (4 if chronoedit else None)


def test_framepack_release_read_alike_by_both_tools(tmp_path):
    """benchmark_framepack.py's release folder (bf16 shards with their index, the Packed class's config.json)
    exports with cogexport, nothing else given, to what Diffusers' from_pretrained then save_pretrained writes."""
    from benchmark_framepack import reference_export as framepack_reference
    from benchmark_framepack import write_release as write_framepack_release
    from framepack_tiny import PACKED_CLASS, tiny_config
    from single_file_benchmark import compare_outputs, parameter_count

    shards, model = write_framepack_release(tmp_path / "release", tiny_config())
    assert len(shards) == 2 and json.loads((tmp_path / "release" / "config.json").read_text())["_class_name"] == \
        PACKED_CLASS
    export(tmp_path / "release", tmp_path / "ours")
    framepack_reference(tmp_path / "release", tmp_path / "unused", tmp_path / "reference")
    checked = compare_outputs(tmp_path / "ours", tmp_path / "reference")
    assert checked["numel"] == parameter_count(model) and checked["kept_fp32"] > 0  # the q/k norms, the refiner's


def test_kandinsky6_release_read_alike_by_both_tools(tmp_path):
    """benchmark_kandinsky6.py's published transformer folder (bf16 shards of Diffusers' names with their index and
    config.json) exports with cogexport, nothing else given, to what from_pretrained then save_pretrained writes."""
    from benchmark_kandinsky6 import reference_export as kandinsky6_reference
    from benchmark_kandinsky6 import write_release as write_kandinsky6_release
    from kandinsky6_fixtures import TINY_CONFIG
    from single_file_benchmark import compare_outputs, parameter_count

    shards, model = write_kandinsky6_release(tmp_path / "transformer", TINY_CONFIG)
    export(tmp_path / "transformer", tmp_path / "ours")
    kandinsky6_reference(tmp_path / "transformer", tmp_path / "unused", tmp_path / "reference")
    checked = compare_outputs(tmp_path / "ours", tmp_path / "reference")
    assert len(shards) == 2 and checked["numel"] == parameter_count(model) and checked["kept_fp32"] > 0


@pytest.mark.skipif(not DIFFUSERS_REPO.exists(), reason="needs a huggingface/diffusers git directory (its scripts/)")
def test_sana_video_release_read_alike_by_cogexport_and_diffusers_script(tmp_path):
    """benchmark_sana_video.py's release (a torch.save of the state_dict in SanaMSVideo's names) exports with
    cogexport to what Diffusers' conversion script (run by sana_video_judge, bf16, its init_empty_weights) writes."""
    from benchmark_sana_video import CONVERTER, converter_export
    from benchmark_sana_video import write_release as write_sana_release
    from make_tiny_sana_video import tiny_config as tiny_sana_config
    from single_file_benchmark import compare_outputs, keep_reference_source, parameter_count, release_setup

    model = write_sana_release(tmp_path / "release.pth", tiny_sana_config())
    setup = release_setup(tmp_path / "release.pth", tmp_path / "release.pth", tmp_path / "config", model)
    keep_reference_source(DIFFUSERS_REPO, CONVERTER, tmp_path, tmp_path / "config")
    export(tmp_path / "release.pth", tmp_path / "ours", base=tmp_path / "config")
    converter_export(tmp_path / "release.pth", tmp_path / "config", tmp_path / "reference")
    assert compare_outputs(tmp_path / "ours", tmp_path / "reference")["numel"] == parameter_count(model)
    assert setup["parameters"] == parameter_count(model)


# the benchmark at scale: benchmark_at_scale.judge, against the release by Diffusers' converter's names -------------

def test_at_scale_judge_accepts_cogexports_output(single_file_exports):
    from benchmark_at_scale import judge

    work, _ = single_file_exports
    checked = judge(work / "release" / "diffusion_pytorch_model.safetensors", work / "cogexport")
    assert checked["tensors"] == len(load_file(work / "cogexport" / "diffusion_pytorch_model.safetensors"))
    assert checked["kept_fp32"] > 0


@pytest.mark.parametrize("spoiled, message", [
    ("value", "blocks.0.attn1.to_q.weight differs"), ("kept fp32 value", "differs"), ("kept fp32 as bf16", "differs"),
    ("missing", "names differ"), ("extra", "names differ"),
])
def test_at_scale_judge_refuses_a_difference(single_file_exports, tmp_path, spoiled, message):
    import click
    from benchmark_at_scale import judge

    work, _ = single_file_exports
    ours = shutil.copytree(work / "cogexport", tmp_path / "ours")
    spoil_wan_output(ours / "diffusion_pytorch_model.safetensors", spoiled)
    with pytest.raises(click.ClickException, match=message):
        judge(work / "release" / "diffusion_pytorch_model.safetensors", ours)


# GGUF beside llama.cpp's C reference: benchmark_gguf_reference's reference job and its byte comparison ------------

def write_gguf(path, tensors: dict, types: dict) -> None:
    """A GGUF file holding ``tensors`` stored as ``types`` by cogexport's quantizers (raw bytes, as the export does)."""
    import gguf

    from cogexport.quantize import quantize_tensor

    writer = gguf.GGUFWriter(path, "test")
    for name, values in tensors.items():
        kind = gguf.GGMLQuantizationType[types[name]]
        writer.add_tensor(name, quantize_tensor(values, types[name]).numpy(), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_reference_comparison_accepts_right_bytes_and_refuses_one_changed(tmp_path):
    """The reference job (llama.cpp's C quantizers on the release's values, its rows split over 2 threads) makes
    the bytes of every tensor cogexport stored, of each kind of type (K, legacy, float); one byte changed in a
    stored tensor is named."""
    import gguf
    from benchmark_gguf_reference import LIBRARY, differing_tensors, file_plan, reference_job

    if not LIBRARY.is_file():
        pytest.skip(f"llama.cpp's reference quantizers are not built ({LIBRARY}): run scripts/build_ggml_reference.sh")
    generator = torch.Generator().manual_seed(3)
    tensors = {"blocks.0.ffn.weight": torch.randn(6, 512, generator=generator) * 0.02,
               "blocks.0.attn.weight": torch.randn(5, 256, generator=generator) * 0.02,
               "head.weight": torch.randn(3, 64, generator=generator),
               "norm.weight": torch.randn(64, generator=generator)}
    types = {"blocks.0.ffn.weight": "Q6_K", "blocks.0.attn.weight": "Q4_K", "head.weight": "Q8_0", "norm.weight": "F32"}
    release = tmp_path / "release.safetensors"
    save_file(tensors, release)
    write_gguf(tmp_path / "ours.gguf", tensors, types)
    plan = file_plan(tmp_path / "ours.gguf")
    assert [tuple(entry[:2]) for entry in plan] == list(types.items())
    reference_job(release, plan, tmp_path / "reference.bin", 2, LIBRARY)
    assert differing_tensors(tmp_path / "ours.gguf", plan, tmp_path / "reference.bin") == []

    spoiled = gguf.GGUFReader(tmp_path / "ours.gguf")
    data = bytearray((tmp_path / "ours.gguf").read_bytes())
    data[spoiled.tensors[0].data_offset + 5] ^= 0x10
    (tmp_path / "spoiled.gguf").write_bytes(bytes(data))
    assert differing_tensors(tmp_path / "spoiled.gguf", plan, tmp_path / "reference.bin") == ["blocks.0.ffn.weight"]


# megatron: benchmark_megatron.py's compare of megatron-core's stacked tensors with cogexport's per-layer ones ------
FC2 = "decoder.layers.mlp.linear_fc2.weight"  # stacked [L, ...]: layer 3 spoiled


@pytest.mark.parametrize("spoiled, message", [
    (None, None),
    (lambda t: {**t, FC2: torch.cat([t[FC2][:3], flip_first(t[FC2][3:])])}, "decoder.layers.3.mlp.linear_fc2.weight"),
    (lambda t: {k: v for k, v in t.items() if k != "output_layer.weight"}, "output_layer.weight")],
    ids=["right", "a layer's value", "a tensor missing"])
def test_megatron_compare_takes_stacked_tensors_layer_by_layer(spoiled, message, tmp_path, monkeypatch, capsys):
    from benchmark_megatron import COMPARE
    from megatron_fixtures import megatron_run

    run = megatron_run()
    consolidate(run.run, tmp_path / "ours", dtype="fp32")
    theirs = {key: run.tensors[f"iter10.{key}"] for key in run.truth["keys"]}  # what megatron-core's load gives
    save_file(spoiled(theirs) if spoiled else theirs, tmp_path / "theirs.safetensors")
    monkeypatch.setattr(sys, "argv", ["compare", str(tmp_path / "ours" / "model.safetensors"),
                                      str(tmp_path / "theirs.safetensors")])
    if message is None:
        exec(COMPARE, {})  # the script the benchmark runs with python -c, in this process
        assert int(capsys.readouterr().out) == len(run.per_layer(10))
    else:
        with pytest.raises((AssertionError, KeyError), match=re.escape(message)):
            exec(COMPARE, {})
