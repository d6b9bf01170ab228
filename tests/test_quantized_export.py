"""`--to gguf` and `--to original --dtype fp8` from the inputs cogexport reads (a Diffusers model folder, an original
release, a LoRA run fused first, a two-expert pipeline), through the command line. The judges: Diffusers' own GGUF
loader and single-file converter put the file's tensors back into the model's names (a misnamed tensor would land on
the wrong weight); the F16 file holds exactly the fp16 cast; every block type's weights are within the type's error of
the source; fp8 weights times their scale equal the reference cast (computed here from the model) times scale."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from conftest import assert_refused
from quantize_cases import K_PATHS, use_k_path
from quantized_models import FAMILIES, original_tensors
from safetensors import safe_open
from test_gguf_diffusers import dequantized_state, forward, load_with_diffusers
from wan_fixtures import tiny_wan_pipeline

from cogexport.quantize.fp8 import fp8_cast, fp8_scale

# relative RMS error each type stays under on these Gaussian-like weights (measured: Q8_0 0.005, Q4_K 0.07)
WITHIN = {"F16": 1e-3, "Q8_0": 0.01, "Q4_K_M": 0.1}


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request, tmp_path_factory):
    """A tiny 256-wide model of the family, saved as Diffusers saves it (the input), and its config folder."""
    family = FAMILIES[request.param]
    model = family.build()
    folder = tmp_path_factory.mktemp(family.key)
    model.save_pretrained(folder / "model")
    model.save_config(folder / "config")
    return family, model, folder


def gguf_file(folder):
    (path,) = [p for p in folder.rglob("*.gguf")]
    return path


@pytest.mark.parametrize("quant", list(WITHIN))
def test_gguf_from_a_diffusers_folder_loads_into_the_right_weights(saved, quant, cli, tmp_path, monkeypatch):
    family, model, folder = saved
    result = cli(folder / "model", tmp_path / "out", "--to", "gguf", "--quant", quant)
    assert result.exit_code == 0, result.stderr
    path = gguf_file(tmp_path / "out")
    assert gguf.GGUFReader(path).fields["general.architecture"].contents() == {
        "wan": "wan", "hunyuanvideo": "hyvid", "ltx_video": "ltxv"}[family.key]
    loaded = load_with_diffusers(path, family, folder, monkeypatch)
    weights = dequantized_state(loaded)
    assert weights.keys() == model.state_dict().keys()
    for name, truth in model.state_dict().items():
        if quant == "F16" or weights[name].dtype != torch.float32 or truth.numel() <= 1024:
            continue
        error = (weights[name] - truth).pow(2).mean().sqrt() / truth.pow(2).mean().sqrt().clamp_min(1e-12)
        assert error < WITHIN[quant], (name, float(error))
    if quant == "F16":  # the float file holds the exact casts: F16 where quantizable, F32 where kept
        for name, truth in model.state_dict().items():
            assert torch.equal(weights[name], truth.half().float()) or torch.equal(weights[name], truth), name
    assert torch.isfinite(forward(loaded, family)).all()
    assert "GGUF" in (tmp_path / "out" / "README.md").read_text()


def test_gguf_of_an_original_release_and_of_a_two_expert_pipeline(cli, tmp_path):
    from wan_fixtures import real_wan

    assert cli(real_wan() / "original", tmp_path / "release", "--to", "gguf", "--quant", "Q8_0").exit_code == 0
    reader = gguf.GGUFReader(gguf_file(tmp_path / "release"))
    assert {t.name for t in reader.tensors} >= {"blocks.0.self_attn.q.weight", "head.head.weight"}
    pipeline = tiny_wan_pipeline("t2v-a14b")
    assert cli(pipeline, tmp_path / "experts", "--to", "gguf", "--quant", "F16").exit_code == 0
    for folder, component in (("high_noise_model", "transformer"), ("low_noise_model", "transformer_2")):
        (path,) = (tmp_path / "experts" / folder).glob("*.gguf")
        stored = {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
        with safe_open(pipeline / component / "diffusion_pytorch_model.safetensors", "pt") as handle:
            ffn = handle.get_tensor("blocks.0.ffn.net.0.proj.weight")  # over 1,024 values: not kept in F32
        assert np.array_equal(stored["blocks.0.ffn.0.weight"].reshape(ffn.shape), ffn.half().numpy())


def test_gguf_of_a_lora_run_is_fused_first(cli, tmp_path):
    from test_lora_expert_pairs import MODULES, comfy, fused as read_fused
    from test_lora_wan import make_adapter

    pipeline = tiny_wan_pipeline("t2v-a14b")
    with safe_open(pipeline / "transformer_2" / "diffusion_pytorch_model.safetensors", "pt") as handle:
        weights = {k: handle.get_tensor(k) for k in handle.keys()}
    adapter = make_adapter(weights, MODULES, seed=41)
    path = comfy(tmp_path / "lora" / "run_low_noise.safetensors", adapter)
    assert cli(path, tmp_path / "fused", "--base", pipeline, "--lora", "fuse", "--dtype", "fp32").exit_code == 0
    truth = read_fused(tmp_path / "fused")
    result = cli(path, tmp_path / "out", "--base", pipeline, "--to", "gguf", "--quant", "F16")
    assert result.exit_code == 0, result.stderr
    stored = {t.name: np.array(t.data) for t in gguf.GGUFReader(gguf_file(tmp_path / "out")).tensors}
    ffn = truth["blocks.1.ffn.net.2.weight"]
    assert np.array_equal(stored["blocks.1.ffn.2.weight"].reshape(ffn.shape), ffn.half().numpy())


def test_gguf_quantized_by_worker_threads_and_processes_is_the_one_thread_file_and_a_bad_value_is_refused(
        cli, tmp_path, monkeypatch):
    """With --workers, tensors are quantized ahead in threads, their rows in pieces by the job's quantizing pool (as
    many threads with the compiled K quantizer, worker processes without it: test_quantize_threads.py), and handed
    to the writer in the file's order: the file one thread writes in turn, byte for byte. A NaN met in a piece is
    one line naming its tensor, nothing written."""
    import threading

    from cogexport.quantize import processes, threads as pool_threads
    from cogexport.write import gguf_file as writer

    for module in (processes, pool_threads):  # the tiny model's tensors go to the pool
        monkeypatch.setattr(module, "MIN_PIECE_VALUES", 1 << 14)
    model = FAMILIES["wan"].build()
    model.save_pretrained(tmp_path / "model")
    quantized_in, quantize = [], writer.stored_bytes
    monkeypatch.setattr(writer, "stored_bytes", lambda t, pool=None: quantized_in.append(
        (threading.current_thread().name, pool.count if pool else 0)) or quantize(t, pool))
    threads = {}
    for workers in ("1", "3"):
        quantized_in.clear()
        result = cli(tmp_path / "model", tmp_path / f"w{workers}", "--to", "gguf", "--quant", "Q4_K_M",
                     "--workers", workers)
        assert result.exit_code == 0, result.stderr
        threads[workers] = {(name.split("_")[0], count) for name, count in quantized_in}
    assert threads == {"1": {("MainThread", 1)}, "3": {("cogexport-load", 3)}}
    assert gguf_file(tmp_path / "w1").read_bytes() == gguf_file(tmp_path / "w3").read_bytes()
    state = model.state_dict()
    state["blocks.0.ffn.net.2.weight"][3, 5] = float("nan")
    model.load_state_dict(state)
    model.save_pretrained(tmp_path / "bad")
    (tmp_path / "refusal").mkdir()
    assert_refused(cli, tmp_path / "refusal", [tmp_path / "bad", tmp_path / "refusal" / "out", "--to", "gguf",
                                               "--quant", "Q4_K_M", "--workers", "3"],
                   "ffn.2.weight", "NaN or infinite", inputs=[tmp_path / "bad"])


def test_a_gguf_export_without_the_compiled_quantizer_is_the_same_file_and_says_so_once(cli, tmp_path, monkeypatch):
    """An install without a C compiler quantizes the K types by the torch path: the same file, and the export's notes
    say so once, whatever the number of tensors; with the compiled quantizer nothing is said."""
    FAMILIES["wan"].build().save_pretrained(tmp_path / "model")
    files = {}
    for path in K_PATHS:  # the compiled quantizer first: the torch path's monkeypatch stays to the test's end
        use_k_path(monkeypatch, path)
        result = cli(tmp_path / "model", tmp_path / path, "--to", "gguf", "--quant", "Q4_K_M", "--workers", "1")
        assert result.exit_code == 0, result.stderr
        assert result.stderr.count("compiled K-type quantizer is not built") == (path == "torch")
        files[path] = gguf_file(tmp_path / path).read_bytes()
    assert files["compiled"] == files["torch"]


@pytest.mark.parametrize("dtype, fp8", [("fp8", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_weights_times_scale_equal_the_reference_cast(saved, dtype, fp8, cli, tmp_path):
    family, model, folder = saved
    result = cli(folder / "model", tmp_path / "out", "--to", "original", "--dtype", dtype)
    assert result.exit_code == 0, result.stderr
    (path,) = (tmp_path / "out").glob("*_scaled.safetensors")
    with safe_open(path, "pt") as handle:
        stored = {k: handle.get_tensor(k) for k in handle.keys()}
    layers = [name[: -len(".weight_scale")] for name in stored if name.endswith(".weight_scale")]
    assert layers and all(stored[f"{layer}.weight"].dtype == fp8 for layer in layers)
    dequantized = {name: t.float() for name, t in stored.items() if not name.endswith(("weight_scale", "comfy_quant"))}
    source = {name: t.load() for name, t in original_tensors(family, model).items()}  # the values, by original name
    for layer in layers:
        dequantized[f"{layer}.weight"] = stored[f"{layer}.weight"].float() * stored[f"{layer}.weight_scale"]
        weight = source[f"{layer}.weight"]
        scale = fp8_scale(weight, fp8)  # max |W| / the type's largest finite value, over the whole stored tensor
        assert torch.equal(dequantized[f"{layer}.weight"], fp8_cast(weight, scale, fp8).float() * scale), layer
    # the names: Diffusers' converter puts every tensor back on its weight; the others hold the bf16 (or fp32) cast
    in_diffusers_names = family.converter_function()(dict(dequantized))  # (the converters pop what they read)
    assert in_diffusers_names.keys() == model.state_dict().keys()
    quantized = {f"{layer}.weight" for layer in layers}
    kept = {name: t for name, t in source.items() if name not in quantized}
    for name, weight in kept.items():
        assert torch.equal(dequantized[name], weight.bfloat16().float()) or torch.equal(dequantized[name], weight), name


def test_quantized_options_are_checked(cli, tmp_path):
    model = tiny_wan_pipeline("t2v") / "transformer"
    assert_refused(cli, tmp_path, [model, tmp_path / "o", "--to", "gguf"], "--to gguf needs --quant", inputs=[model])
    assert_refused(cli, tmp_path, [model, tmp_path / "o", "--to", "gguf", "--quant", "Q3_X"], "--quant 'Q3_X' is not",
                   inputs=[model])
    assert_refused(cli, tmp_path, [model, tmp_path / "o", "--quant", "Q8_0"], "give --to gguf", inputs=[model])
    assert_refused(cli, tmp_path, [model, tmp_path / "o", "--dtype", "fp8"], "give --to original", inputs=[model])
    assert_refused(cli, tmp_path, [model, tmp_path / "o", "--to", "gguf", "--quant", "Q8_0", "--component", "vae"],
                   "--to gguf writes the transformer", inputs=[model])


def test_inspect_and_verify_read_quantized_files(cli, tmp_path):
    """inspect says what a GGUF and a scaled-fp8 file hold; verify compares every tensor with the reference's bytes
    of the source, reports what quantizing cost, and fails on one flipped byte."""
    from wan_fixtures import real_wan

    release = real_wan() / "original"
    exported = {folder: json.loads(cli(release, tmp_path / folder, *arguments, "--json").stdout)
                for folder, arguments in (("gguf", ("--to", "gguf", "--quant", "Q8_0")),
                                          ("fp8", ("--to", "original", "--dtype", "fp8")))}
    text = cli("inspect", tmp_path / "gguf").stdout
    assert "GGUF, architecture wan" in text and "Q8_0 4" in text and "Wan original layout" in text
    assert "scaled fp8: 20 weights" in cli("inspect", tmp_path / "fp8").stdout
    for folder in ("gguf", "fp8"):
        result = cli("verify", tmp_path / folder, "--against", release, "--json")
        (report,) = json.loads(result.stdout)["reports"]
        # counted as the export counts them: the file's tensors (the fp8 file's scales and markers too)
        assert result.exit_code == 0 and report["ok"]
        assert report["exact"] == report["tensors"] == exported[folder]["tensors"] == {"gguf": 69, "fp8": 109}[folder]
        assert max(error["rms_relative"] for error in report["errors"]) < 0.05
    path = gguf_file(tmp_path / "gguf")
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x40  # a byte of the last tensor's data
    path.write_bytes(bytes(data))
    result = cli("verify", tmp_path / "gguf", "--against", release)
    assert result.exit_code == 1 and "is not what" in result.stdout
