"""``cogexport verify`` of fused LoRA folders: against the run and, for an adapter saved alone, the --base it was
fused into; PEFT's own merge gives the second opinion; a changed value is caught by both."""

from __future__ import annotations

import json

import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, finetune, write_sat_run
from conftest import assert_refusal
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cogexport.exporter import export

ADAPTED = "transformer_blocks.0.attn1.to_q.weight"


def fused_adapter_alone(cli, tmp_path):
    """An adapter saved without the model's weights (finetune/'s pytorch_lora_weights.safetensors), fused into the
    base pipeline's transformer at fp32."""
    run = finetune("t2v", 2, 2, lora_rank=4)
    lora_file = run.root / "pytorch_lora_weights.safetensors"
    result = cli(lora_file, tmp_path / "fused", "--base", run.base, "--lora", "fuse", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    return lora_file, run.base, tmp_path / "fused"


def change_one_value(weights_file, name: str) -> None:
    tensors = load_file(weights_file)
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1e-3
    save_file(tensors, weights_file, metadata={"format": "pt"})


def test_a_fused_adapter_alone_verifies_against_the_adapter_and_base(cli, tmp_path):
    lora_file, base, fused = fused_adapter_alone(cli, tmp_path)
    result = cli("verify", fused, "--against", lora_file, "--base", base, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["reports"]
    assert report["kind"] == "fused model" and report["ok"] and report["loads_with_diffusers"]
    assert report["tensors"] == report["exact"] == 64
    assert report["judge"].startswith("PEFT's LoRA merge") and report["judged"] == 8  # the adapter's 8 modules
    assert any("independent of cogexport's merge" in claim for claim in report["proves"])

    text = cli("verify", fused, "--against", lora_file, "--base", base / "transformer", "--no-load").stdout
    assert "second opinion: PEFT's LoRA merge (peft.tuners.lora.Linear.merge) makes the same 8 tensors" in text


def test_a_fused_adapter_alone_without_base_is_refused_naming_base(cli, tmp_path):
    lora_file, _, fused = fused_adapter_alone(cli, tmp_path)
    assert_refusal(cli("verify", fused, "--against", lora_file), "holds only a LoRA adapter", "pass --base")


def test_a_changed_value_of_a_fused_weight_is_caught_by_both_checks(cli, tmp_path):
    lora_file, base, fused = fused_adapter_alone(cli, tmp_path)
    change_one_value(fused / "diffusion_pytorch_model.safetensors", ADAPTED)
    result = cli("verify", fused, "--against", lora_file, "--base", base, "--no-load", "--json")
    assert result.exit_code == 1
    (report,) = json.loads(result.stdout)["reports"]
    assert report["mismatches"] == [f"{ADAPTED}: values differ from the checkpoint's"]
    assert report["judge_mismatches"] == [f"{ADAPTED} differs from what PEFT's LoRA merge "
                                          "(peft.tuners.lora.Linear.merge) makes of the base weight"]


def test_a_fused_folder_of_another_base_is_caught(cli, tmp_path):
    lora_file, base, fused = fused_adapter_alone(cli, tmp_path)
    other = tmp_path / "other-base"
    other.mkdir()
    for path in (base / "transformer").iterdir():
        (other / path.name).write_bytes(path.read_bytes())
    change_one_value(other / "diffusion_pytorch_model.safetensors", ADAPTED)
    result = cli("verify", fused, "--against", lora_file, "--base", other, "--no-load", "--json")
    assert result.exit_code == 1
    (report,) = json.loads(result.stdout)["reports"]
    assert f"{ADAPTED}: values differ from the checkpoint's" in report["mismatches"]
    assert len(report["judge_mismatches"]) == 1


def test_a_sat_lora_run_with_its_base_weights_gets_peft_as_second_opinion(cli, tmp_path):
    original = build_tiny_transformer("2b", num_layers=2, seed=3)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=4, dtype=torch.float32)
    export(run.run_dir, tmp_path / "fused", base=config_folder(tmp_path / "base", original), lora="fuse")
    (report,) = json.loads(cli("verify", tmp_path / "fused", "--against", run.run_dir, "--no-load", "--json").stdout)["reports"]
    assert report["ok"] and report["judged"] == 8 and report["cast_exact"] > 0, report


def test_a_wrong_strength_in_the_merge_passes_consistency_but_not_peft(cli, tmp_path, monkeypatch):
    """Export and verify share cogexport's merge: a wrong scale there replans the same wrong folder, and only the
    second opinion, PEFT's merge from the adapter's rank and alpha, catches it."""
    from cogexport.lora.adapter import LoraModule

    real = LoraModule.scale
    monkeypatch.setattr(LoraModule, "scale", lambda module, rslora: 2 * real(module, rslora))
    lora_file, base, fused = fused_adapter_alone(cli, tmp_path)
    result = cli("verify", fused, "--against", lora_file, "--base", base, "--no-load", "--json")
    assert result.exit_code == 1
    (report,) = json.loads(result.stdout)["reports"]
    assert report["mismatches"] == [] and len(report["judge_mismatches"]) == report["tensors"] - 56 == 8


def test_a_quantized_file_of_a_lora_run_verifies_against_the_adapter_and_base(cli, tmp_path):
    """A LoRA run quantized directly (--to gguf, fused first with --base's weights): verify fuses it the same way."""
    from test_lora_expert_pairs import MODULES, comfy
    from test_lora_wan import make_adapter
    from wan_fixtures import tiny_wan_pipeline

    pipeline = tiny_wan_pipeline("t2v-a14b")
    weights = load_file(pipeline / "transformer_2" / "diffusion_pytorch_model.safetensors")
    path = comfy(tmp_path / "lora" / "run_low_noise.safetensors", make_adapter(weights, MODULES, seed=41))
    assert cli(path, tmp_path / "out", "--base", pipeline, "--to", "gguf", "--quant", "Q8_0").exit_code == 0
    result = cli("verify", tmp_path / "out", "--against", path, "--base", pipeline, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["reports"]
    assert report["kind"] == "quantized file" and report["ok"] and report["exact"] == report["tensors"] == 69
    assert_refusal(cli("verify", tmp_path / "out", "--against", path), "holds only a LoRA adapter", "pass --base")
    unfused = cli("verify", tmp_path / "out", "--against", pipeline / "transformer_2", "--json")
    assert unfused.exit_code == 1 and json.loads(unfused.stdout)["reports"][0]["mismatches"]

    (file,) = (tmp_path / "out").rglob("*.gguf")
    data = bytearray(file.read_bytes())
    data[-10] ^= 0x40  # a byte of the last tensor's data
    file.write_bytes(bytes(data))
    damaged = cli("verify", tmp_path / "out", "--against", path, "--base", pipeline)
    assert damaged.exit_code == 1 and "is not what" in damaged.stdout


def test_an_adapter_whose_names_several_families_share_verifies_with_base(cli, tmp_path):
    """finetune/'s adapter file fits CogVideoX, Cosmos, LTX-2 and LTX-Video by its names: --base says which, as it did
    for the export; without it the refusal names --base, which verify takes."""
    run = finetune("t2v", 2, 2, lora_rank=4)
    lora_file = run.root / "pytorch_lora_weights.safetensors"
    assert cli(lora_file, tmp_path / "adapter", "--base", run.base).exit_code == 0
    assert_refusal(cli("verify", tmp_path / "adapter", "--against", lora_file), "pass --base")
    result = cli("verify", tmp_path / "adapter", "--against", lora_file, "--base", run.base, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["reports"]
    assert report["kind"] == "LoRA adapter" and report["ok"] and report["tensors"] == 16

    weights = tmp_path / "adapter" / "pytorch_lora_weights.safetensors"
    name = next(key for key in load_file(weights) if ".lora_B." in key)
    with safe_open(weights, "pt") as handle:
        tensors, metadata = {key: handle.get_tensor(key) for key in handle.keys()}, handle.metadata()
    tensors[name].view(-1)[0] += 1e-3
    save_file(tensors, weights, metadata=metadata)
    damaged = cli("verify", tmp_path / "adapter", "--against", lora_file, "--base", run.base)
    assert damaged.exit_code == 1 and "differs from the run's" in damaged.stdout


def test_the_base_given_as_a_second_against_is_refused_naming_base(cli, tmp_path):
    lora_file, base, fused = fused_adapter_alone(cli, tmp_path)
    for given in (base, base / "transformer" / "diffusion_pytorch_model.safetensors"):
        assert_refusal(cli("verify", fused, "--against", lora_file, "--against", given),
                       f"--against {lora_file} is a LoRA", "with --base")
