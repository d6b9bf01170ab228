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
