"""``cogexport verify`` of ``--to original`` output: each tensor against the source planned again, Diffusers' own
single-file converter reading the file back as the model it came from; a changed value and a wrong rule are caught."""

from __future__ import annotations

import json

from cogvideox_fixtures import finetune, tiny_pipeline
from safetensors.torch import load_file, save_file
from wan_fixtures import tiny_wan_pipeline

from cogexport.exporter import export_original

CHANGED = "blocks.0.self_attn.q.weight"


def wan_original(tmp_path, **options):
    pipeline = tiny_wan_pipeline("t2v")
    export_original(pipeline, tmp_path / "original", progress=False, **options)
    return pipeline, tmp_path / "original"


def test_a_wan_original_file_verifies_and_diffusers_converter_reads_it_back(cli, tmp_path):
    pipeline, original = wan_original(tmp_path)
    result = cli("verify", original, "--against", pipeline, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["reports"]
    assert report["kind"] == "original layout" and report["ok"]
    assert report["tensors"] == report["exact"] + report["cast_exact"] == 69 and report["cast_exact"] > 0  # bf16
    assert report["judge"] == "convert_wan_transformer_to_diffusers" and report["judged"] == 69
    text = cli("verify", original, "--against", pipeline).stdout
    assert text.startswith(f"ok: {original} (original layout, Wan original layout")


def test_a_changed_value_in_an_original_file_is_caught(cli, tmp_path):
    pipeline, original = wan_original(tmp_path, dtype="fp32")
    weights = original / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    tensors[CHANGED].view(-1)[3] += 1e-3
    save_file(tensors, weights)
    result = cli("verify", original, "--against", pipeline, "--json")
    assert result.exit_code == 1
    (report,) = json.loads(result.stdout)["reports"]
    assert report["mismatches"] == [f"{CHANGED}: values differ from the checkpoint's"]
    assert report["judge_mismatches"] == ["blocks.0.attn1.to_q.weight: Diffusers' convert_wan_transformer_to_diffusers "
                                          "reads the written file as another value than the model it came from"]


def test_a_wrong_rule_passes_consistency_but_not_diffusers_converter(cli, tmp_path, monkeypatch):
    from test_verify import scrambled_wan_table

    from cogexport.exporter import original_parts

    scrambled_wan_table(monkeypatch, original_parts)
    pipeline, original = wan_original(tmp_path)
    (report,) = json.loads(cli("verify", original, "--against", pipeline, "--json").stdout)["reports"]
    assert report["mismatches"] == [] and not report["ok"]
    assert "blocks.0.attn1.norm_q.weight: Diffusers' convert_wan_transformer_to_diffusers reads the written file as " \
           "another value than the model it came from" in report["judge_mismatches"]


def test_a_sat_original_verifies_and_says_why_there_is_no_converter(cli, tmp_path):
    pipeline = tiny_pipeline("t2v")
    export_original(pipeline, tmp_path / "sat", progress=False)
    (report,) = json.loads(cli("verify", tmp_path / "sat", "--against", pipeline, "--json").stdout)["reports"]
    assert report["ok"] and report["tensors"] == 52 and report["judge"] is None
    assert "no converter for SAT CogVideoX" in report["judge_note"]


def test_a_fused_adapter_alone_in_the_original_layout_verifies_with_base(cli, tmp_path):
    run = finetune("t2v", 2, 2, lora_rank=4)
    lora_file = run.root / "pytorch_lora_weights.safetensors"
    result = cli(lora_file, tmp_path / "sat", "--to", "original", "--base", run.base, "--lora", "fuse")
    assert result.exit_code == 0, result.stderr
    (report,) = json.loads(cli("verify", tmp_path / "sat", "--against", lora_file, "--base", run.base,
                               "--json").stdout)["reports"]
    assert report["ok"] and report["tensors"] == 52, report
    unfused = cli("verify", tmp_path / "sat", "--against", run.base, "--json")
    assert unfused.exit_code == 1 and len(json.loads(unfused.stdout)["reports"][0]["mismatches"]) == 4  # the adapted layers


def test_each_expert_of_a_two_expert_release_is_checked_against_its_own_model(cli, tmp_path):
    pipeline = tiny_wan_pipeline("t2v-a14b")
    export_original(pipeline, tmp_path / "release", progress=False)
    result = cli("verify", tmp_path / "release", "--against", pipeline, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    reports = json.loads(result.stdout)["reports"]
    assert [report["folder"] for report in reports] == [str(tmp_path / "release" / name)
                                                        for name in ("high_noise_model", "low_noise_model")]
    assert all(report["ok"] and report["judged"] == 69 for report in reports)

    # the experts' files swapped: each is the other expert's model
    high, low = (tmp_path / "release" / name / "diffusion_pytorch_model.safetensors"
                 for name in ("high_noise_model", "low_noise_model"))
    high.rename(tmp_path / "high")
    low.rename(high)
    (tmp_path / "high").rename(low)
    swapped = json.loads(cli("verify", tmp_path / "release", "--against", pipeline, "--json").stdout)["reports"]
    assert all(report["mismatches"] and report["judge_mismatches"] for report in swapped)


def test_a_lora_adapter_in_original_module_names_is_checked_as_an_adapter(cli, tmp_path):
    """A ComfyUI-layout adapter carries the original layout's module names: it is an adapter, not an original file."""
    from test_lora_expert_pairs import MODULES, comfy
    from test_lora_wan import make_adapter

    pipeline = tiny_wan_pipeline("t2v")
    weights = load_file(pipeline / "transformer" / "diffusion_pytorch_model.safetensors")
    path = comfy(tmp_path / "lora" / "run.safetensors", make_adapter(weights, MODULES, seed=5))
    result = cli(path, tmp_path / "adapter", "--base", pipeline, "--lora-format", "comfyui")
    assert result.exit_code == 0, result.stderr
    (report,) = json.loads(cli("verify", tmp_path / "adapter", "--against", path, "--json").stdout)["reports"]
    assert report["kind"] == "LoRA adapter" and report["ok"], report
