"""``cogexport verify``: a faithful export passes; a changed tensor or a foreign checkpoint is caught and named."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, tiny_pipeline, write_sat_run
from conftest import assert_refusal
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from wan_fixtures import real_wan

from cogexport.exporter import export


def exported(tmp_path, seed=1):
    original = build_tiny_transformer("1.5-5b", num_layers=2, seed=seed)
    write_sat_run(tmp_path / f"run{seed}", original.state_dict())
    export(tmp_path / f"run{seed}", tmp_path / f"out{seed}", base=config_folder(tmp_path / f"base{seed}", original))
    return tmp_path / f"run{seed}", tmp_path / f"out{seed}"


def test_a_faithful_export_verifies(cli, tmp_path):
    run, out = exported(tmp_path)
    result = cli("verify", out, "--against", run, "--json")
    assert result.exit_code == 0, result.stdout
    (report,) = json.loads(result.stdout)["reports"]
    assert report["ok"] and report["loads_with_diffusers"] and report["mismatches"] == [] and report["kind"] == "model"
    assert report["tensors"] == report["exact"] + report["cast_exact"] == 64
    assert report["cast_exact"] > 0, "the fp32-kept norms are checked against the upcast bf16 source"


def test_a_changed_tensor_is_caught(cli, tmp_path):
    run, out = exported(tmp_path)
    weights = out / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    tensors["proj_out.bias"] = tensors["proj_out.bias"] + 1
    save_file(tensors, weights, metadata={"format": "pt"})
    result = cli("verify", out, "--against", run)
    assert result.exit_code == 1
    assert "FAILED" in result.stdout and "proj_out.bias: values differ" in result.stdout


def test_a_foreign_checkpoint_is_caught(cli, tmp_path):
    run1, out1 = exported(tmp_path, seed=1)
    run2, _ = exported(tmp_path, seed=2)
    result = cli("verify", out1, "--against", run2, "--no-load")
    assert result.exit_code == 1 and "values differ" in result.stdout


def test_a_pipeline_folder_verifies_its_transformer(cli, tmp_path):
    base = tiny_pipeline("t2v")
    from diffusers import CogVideoXTransformer3DModel

    weights = CogVideoXTransformer3DModel.from_pretrained(base / "transformer").state_dict()
    write_sat_run(tmp_path / "run", {n: t * 1.5 for n, t in weights.items()})
    export(tmp_path / "run", tmp_path / "out", base=base)
    result = cli("verify", tmp_path / "out", "--against", tmp_path / "run")
    assert result.exit_code == 0, result.stdout
    assert "transformer (model, CogVideoXTransformer3DModel): 64 tensors" in result.stdout
    assert torch.equal(load_file(tmp_path / "out" / "transformer" / "diffusion_pytorch_model.safetensors")[
        "proj_out.weight"], (weights["proj_out.weight"] * 1.5).to(torch.bfloat16))


def test_a_variant_export_verifies(cli, tmp_path):
    original = build_tiny_transformer("2b", num_layers=2, seed=3)
    write_sat_run(tmp_path / "run", original.state_dict())
    export(tmp_path / "run", tmp_path / "out", base=config_folder(tmp_path / "base", original), variant="bf16")
    result = cli("verify", tmp_path / "out", "--against", tmp_path / "run")
    assert result.exit_code == 0 and "loads with Diffusers" in result.stdout, result.stdout


def test_a_pipeline_with_an_exported_vae_verifies_both(cli, tmp_path):
    from cogvideox_fixtures import build_tiny_vae, num_vae_up_blocks, write_sat_vae
    from diffusers import CogVideoXTransformer3DModel

    base = tiny_pipeline("t2v")
    weights = CogVideoXTransformer3DModel.from_pretrained(base / "transformer").state_dict()
    write_sat_run(tmp_path / "run", weights)
    vae = build_tiny_vae(seed=4).state_dict()
    write_sat_vae(tmp_path / "3d-vae.pt", vae, num_vae_up_blocks(vae))
    export(tmp_path / "run", tmp_path / "out", base=base, vae=tmp_path / "3d-vae.pt")
    result = cli("verify", tmp_path / "out", "--against", tmp_path / "run", "--vae-against", tmp_path / "3d-vae.pt")
    assert result.exit_code == 0 and result.stdout.count("ok: ") == 2, result.stdout

    written = tmp_path / "out" / "vae" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(written)
    changed = next(name for name in tensors if name.startswith("decoder."))
    tensors[changed] = tensors[changed] * 2 + 1
    save_file(tensors, written, metadata={"format": "pt"})
    result = cli("verify", tmp_path / "out", "--against", tmp_path / "run", "--vae-against", tmp_path / "3d-vae.pt")
    assert result.exit_code == 1 and f"{changed}: values differ" in result.stdout
    unchecked = cli("verify", tmp_path / "out", "--against", tmp_path / "run")
    assert unchecked.exit_code == 0 and "vae not checked" in unchecked.stderr


def test_verify_says_what_it_proves_and_why_there_is_no_second_opinion(cli, tmp_path):
    run, out = exported(tmp_path)
    (report,) = json.loads(cli("verify", out, "--against", run, "--json").stdout)["reports"]
    assert report["judge"] is None and "Diffusers' package has no converter for SAT CogVideoX" in report["judge_note"]
    assert any("a wrong rule would pass this check" in claim for claim in report["proves"])
    text = cli("verify", out, "--against", run).stdout
    assert "no second opinion:" in text and "this proves:" in text


@pytest.fixture
def wan_original() -> Path:
    """The Wan repo's own model class wrote it (../shared/fixtures); skipped where that folder is not."""
    return real_wan() / "original"


def scrambled_wan_table(monkeypatch, user=None):
    """Export with a wrong rule: self-attention's q/k norms swapped with cross-attention's (in the tables ``user``
    loads: the module choosing the table, recognize.py by default)."""
    from cogexport.keymap import table as tables
    from cogexport.models import recognize

    real = tables.load_table

    def load(name):
        if name != "wan/original_transformer":
            return real(name)
        text = resources.files("cogexport.key_maps").joinpath("wan", "original_transformer.toml").read_text()
        text = text.replace("attn1.norm_{qk}", "@@").replace("attn2.norm_{qk}", "attn1.norm_{qk}").replace(
            "@@", "attn2.norm_{qk}")
        return tables.parse_table(text, name)

    monkeypatch.setattr(user or recognize, "load_table", load)


def test_a_wrong_rule_passes_the_consistency_check_but_not_diffusers_own_converter(cli, tmp_path, monkeypatch,
                                                                                   wan_original):
    scrambled_wan_table(monkeypatch)
    assert cli(wan_original, tmp_path / "out", "--dtype", "fp32").exit_code == 0
    result = cli("verify", tmp_path / "out", "--against", wan_original, "--json")
    assert result.exit_code == 1
    (report,) = json.loads(result.stdout)["reports"]
    assert report["mismatches"] == [], "the same wrong table replans the same wrong folder"
    assert report["judge"] == "convert_wan_transformer_to_diffusers"
    assert any("blocks.0.attn1.norm_q.weight differs from what Diffusers' convert_wan_transformer_to_diffusers"
               in line for line in report["judge_mismatches"])


def test_a_faithful_wan_export_agrees_with_diffusers_own_converter(cli, tmp_path, wan_original):
    assert cli(wan_original, tmp_path / "out").exit_code == 0
    (report,) = json.loads(cli("verify", tmp_path / "out", "--against", wan_original, "--json").stdout)["reports"]
    assert report["ok"] and report["judged"] == report["tensors"] == 69 and report["judge_mismatches"] == []
    (report,) = json.loads(cli("verify", tmp_path / "out", "--against", wan_original, "--judge-limit", "1000",
                               "--json").stdout)["reports"]
    assert report["ok"] and report["judge"] is None and "over the 0.0 GB limit" in report["judge_note"]


def lora_run(tmp_path):
    original = build_tiny_transformer("2b", num_layers=2, seed=3)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=4, dtype=torch.float32)
    return run, config_folder(tmp_path / "base", original)


def test_verify_checks_a_lora_adapter_folder(cli, tmp_path):
    run, base = lora_run(tmp_path)
    export(run.run_dir, tmp_path / "adapter", base=base)
    result = cli("verify", tmp_path / "adapter", "--against", run.run_dir, "--json")
    assert result.exit_code == 0, result.stdout
    (report,) = json.loads(result.stdout)["reports"]
    assert report["kind"] == "LoRA adapter" and report["tensors"] == 16 and report["ok"]

    weights = tmp_path / "adapter" / "pytorch_lora_weights.safetensors"
    with safe_open(weights, "pt") as handle:
        metadata, tensors = handle.metadata(), {k: handle.get_tensor(k) for k in handle.keys()}
    recorded = json.loads(metadata["lora_adapter_metadata"])
    save_file(tensors, weights, metadata={**metadata, "lora_adapter_metadata": json.dumps(
        {**recorded, "transformer.lora_alpha": 4.0})})
    result = cli("verify", tmp_path / "adapter", "--against", run.run_dir)
    assert result.exit_code == 1 and "applied at 1, the run's strength is 0.25 (alpha 1, rank 4)" in result.stdout


def test_verify_checks_a_fused_lora_folder(cli, tmp_path):
    run, base = lora_run(tmp_path)
    export(run.run_dir, tmp_path / "fused", base=base, lora="fuse")
    result = cli("verify", tmp_path / "fused", "--against", run.run_dir, "--json")
    assert result.exit_code == 0, result.stdout
    (report,) = json.loads(result.stdout)["reports"]
    assert report["kind"] == "fused model" and report["tensors"] == 64 and report["loads_with_diffusers"]

    weights = tmp_path / "fused" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    unfused = {name: tensor for name, tensor in run.expected.items()}  # the base weights without the adapter
    tensors["transformer_blocks.0.attn1.to_q.weight"] = unfused["transformer_blocks.0.attn1.to_q.weight"].to(
        tensors["transformer_blocks.0.attn1.to_q.weight"].dtype)
    save_file(tensors, weights, metadata={"format": "pt"})
    result = cli("verify", tmp_path / "fused", "--against", run.run_dir, "--no-load")
    assert result.exit_code == 1 and "transformer_blocks.0.attn1.to_q.weight: values differ" in result.stdout


def test_a_checkpoint_of_another_family_is_refused_naming_no_export_option(cli, tmp_path):
    from wan_fixtures import tiny_wan_pipeline

    _, out = exported(tmp_path)
    message = assert_refusal(cli("verify", out, "--against", tiny_wan_pipeline("t2v") / "transformer"),
                             "holds a Wan transformer, not a CogVideoX one", "give --against the checkpoint this "
                             "folder was exported from")
    assert "--base" not in message and "--model-name" not in message
