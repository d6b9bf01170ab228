"""``cogexport verify``: a faithful export passes; a changed tensor or a foreign checkpoint is caught and named."""

from __future__ import annotations

import json

import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, tiny_pipeline, write_sat_run
from safetensors.torch import load_file, save_file

from cogexport.to_diffusers import export


def exported(tmp_path, seed=1):
    original = build_tiny_transformer("1.5-5b", num_layers=2, seed=seed)
    write_sat_run(tmp_path / f"run{seed}", original.state_dict())
    export(tmp_path / f"run{seed}", tmp_path / f"out{seed}", base=config_folder(tmp_path / f"base{seed}", original))
    return tmp_path / f"run{seed}", tmp_path / f"out{seed}"


def test_a_faithful_export_verifies(cli, tmp_path):
    run, out = exported(tmp_path)
    result = cli("verify", out, "--against", run, "--json")
    assert result.exit_code == 0, result.stdout
    (report,) = json.loads(result.stdout)
    assert report["ok"] and report["loads_with_diffusers"] and report["mismatches"] == []
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
    assert "transformer (CogVideoXTransformer3DModel): 64 tensors" in result.stdout
    assert torch.equal(load_file(tmp_path / "out" / "transformer" / "diffusion_pytorch_model.safetensors")[
        "proj_out.weight"], (weights["proj_out.weight"] * 1.5).to(torch.bfloat16))
