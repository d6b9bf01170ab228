"""LoRA runs export to adapters that Diffusers itself loads and fuses at scale 1.0 to exactly W + (alpha/r) B A, and
to fused models equal to the same; alpha comes from the run when it is recorded, else a documented default."""

from __future__ import annotations

import json

import pytest
import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, finetune, write_sat_run
from diffusers import CogVideoXPipeline, CogVideoXTransformer3DModel
from safetensors import safe_open
from safetensors.torch import load_file

from cogexport.to_diffusers import export


def diffusers_fuse(folder, config, weights) -> dict[str, torch.Tensor]:
    """What Diffusers makes of an adapter folder: load it into the base transformer and fuse at scale 1.0."""
    model = CogVideoXTransformer3DModel.from_config(config)
    model.load_state_dict({n: t.float() for n, t in weights.items()})
    state_dict, metadata = CogVideoXPipeline.lora_state_dict(folder, return_lora_metadata=True)
    model.load_lora_adapter(state_dict, prefix="transformer", metadata=metadata, adapter_name="trained")
    model.fuse_lora(lora_scale=1.0)
    model.unload_lora()
    return model.state_dict()


def merged(weights, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], alpha: float, rank: int):
    out = {name: tensor.float() for name, tensor in weights.items()}
    for module, (down, up) in pairs.items():
        out[f"{module}.weight"] = out[f"{module}.weight"] + (up.float() @ down.float()) * (alpha / rank)
    return out


def assert_all_equal(actual, expected):
    assert set(actual) == set(expected)
    wrong = [name for name in expected if not torch.equal(actual[name], expected[name])]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("variant, layers", [("2b", 1), ("5b", 3), ("1.5-5b-i2v", 2)])
def test_sat_lora_adapter_fuses_in_diffusers_to_the_trained_weights(variant, layers, tmp_path, cli):
    original = build_tiny_transformer(variant, num_layers=layers, seed=layers)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=4, dtype=torch.float32)
    base = config_folder(tmp_path / "base", original)
    result = cli(run.run_dir, tmp_path / "adapter", "--base", base, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["component"] == "lora adapter"
    assert (report["lora"]["rank"], report["lora"]["alpha"], report["lora"]["layers"]) == (4, 1.0, layers)
    with safe_open(tmp_path / "adapter" / "pytorch_lora_weights.safetensors", "pt") as handle:
        assert json.loads(handle.metadata()["lora_adapter_metadata"]) == {
            "transformer.r": 4, "transformer.lora_alpha": 1.0,
            "transformer.target_modules": ["to_k", "to_out.0", "to_q", "to_v"]}
        assert len(list(handle.keys())) == 8 * layers
    expected = run.expected_merged()  # the independent writer's W + (1/r) B A
    assert_all_equal(diffusers_fuse(tmp_path / "adapter", original.config, run.expected), expected)

    export(run.run_dir, tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), expected)


def test_sat_lora_alpha_from_the_runs_saved_config_or_the_command_line(tmp_path):
    original = build_tiny_transformer("2b", num_layers=2)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=8, dtype=torch.float32)
    base = config_folder(tmp_path / "base", original)
    (run.run_dir / "model_config.json").write_text(json.dumps({"model_class": "Lora", "lora_alpha": 16}))
    recorded = export(run.run_dir, tmp_path / "a", base=base)
    assert recorded.lora["alpha"] == 16 and "model_config.json" in recorded.lora["alpha_source"] and not recorded.notes
    given = export(run.run_dir, tmp_path / "b", base=base, lora_alpha=4.0)
    assert given.lora["alpha"] == 4.0 and given.lora["scale"] == 0.5
    fused = export(run.run_dir, tmp_path / "c", base=base, lora="fuse", dtype="fp32", lora_alpha=4.0)
    assert fused.component == "transformer"
    assert_all_equal(load_file(tmp_path / "c" / "diffusion_pytorch_model.safetensors"),
                     merged(run.expected, run.lora_pairs, 4.0, 8))


def test_peft_lora_trained_under_deepspeed(tmp_path, cli):
    run = finetune("t2v", 2, 2, lora_rank=4)
    rank, alpha = run.truth["settings"]["lora_rank"], run.truth["settings"]["lora_alpha"]
    result = cli(run.checkpoint, tmp_path / "adapter", "--base", run.base, "--lora-alpha", alpha, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["lora"]["rank"] == rank

    written = load_file(tmp_path / "adapter" / "pytorch_lora_weights.safetensors")
    for name in run.truth["trainable"]:  # ...to_q.lora_A.default.weight: fp32 masters, bit for bit
        assert torch.equal(written["transformer." + name.replace(".default", "")], run.tensors[name]), name
    base = {name.replace(".base_layer", ""): run.tensors[name] for name in run.truth["frozen"]}
    pairs = {name[: -len(".lora_A.default.weight")]: (run.tensors[name], run.tensors[name.replace("lora_A", "lora_B")])
             for name in run.truth["trainable"] if ".lora_A." in name}
    expected = merged(base, pairs, alpha, rank)
    config = CogVideoXTransformer3DModel.load_config(run.base / "transformer")
    assert_all_equal(diffusers_fuse(tmp_path / "adapter", config, base), expected)

    export(run.checkpoint, tmp_path / "fused", lora="fuse", lora_alpha=alpha, base=run.base,
           component="transformer", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), expected)


def test_a_lora_file_without_alpha_gets_the_documented_default_and_a_warning(tmp_path, cli):
    run = finetune("t2v", 2, 2, lora_rank=4)
    lora_file = run.root / "pytorch_lora_weights.safetensors"  # what finetune/ writes at the end: no alpha
    result = cli(lora_file, tmp_path / "adapter", "--base", run.base)
    assert result.exit_code == 0, result.stderr
    assert "does not record its LoRA alpha; using 64" in result.stderr and "--lora-alpha" in result.stderr
    with safe_open(tmp_path / "adapter" / "pytorch_lora_weights.safetensors", "pt") as handle:
        assert json.loads(handle.metadata()["lora_adapter_metadata"])["transformer.lora_alpha"] == 64.0

    # Fused into a whole pipeline: the base weights come from --base.
    fused = cli(lora_file, tmp_path / "pipeline", "--base", run.base, "--lora", "fuse", "--component", "pipeline",
                "--dtype", "fp32")
    assert fused.exit_code == 0, fused.stderr
    base = load_file(run.base / "transformer" / "diffusion_pytorch_model.safetensors")
    adapter = load_file(lora_file)
    pairs = {name[len("transformer."): -len(".lora_A.weight")]: (adapter[name], adapter[name.replace("lora_A", "lora_B")])
             for name in adapter if ".lora_A." in name}
    assert_all_equal(load_file(tmp_path / "pipeline" / "transformer" / "diffusion_pytorch_model.safetensors"),
                     merged(base, pairs, 64.0, 4))
    assert (tmp_path / "pipeline" / "model_index.json").exists()


def test_inspect_reports_the_adapter(cli, tmp_path):
    run = finetune("t2v", 2, 2, lora_rank=4)
    report = json.loads(cli("inspect", run.root / "pytorch_lora_weights.safetensors", "--json").stdout)
    assert report["models"]["lora"] == {
        "layout": "diffusers_lora", "description": "Diffusers LoRA weights (pytorch_lora_weights.safetensors)",
        "rank": 4, "alpha": None, "alpha_source": "CogVideo finetune/'s default lora_alpha",
        "target_modules": ["to_k", "to_out.0", "to_q", "to_v"], "modules": 8, "layers": 2, "base_weights": False}
    text = cli("inspect", run.checkpoint).stdout
    assert "rank 4, alpha not recorded" in text and "8 modules in 2 layers" in text


def assert_refused(result, *phrases):
    assert result.exit_code == 2 and len(result.error_lines) == 1, result.stderr
    assert all(phrase in result.error_lines[0] for phrase in phrases), result.error_lines[0]


def test_bad_lora_input(cli, tmp_path):
    original = build_tiny_transformer("2b", num_layers=2)
    full = write_sat_run(tmp_path / "full", original.state_dict())
    base = config_folder(tmp_path / "base", original)
    assert_refused(cli(full.run_dir, tmp_path / "o1", "--base", base, "--lora", "adapter"), "holds no LoRA adapter")

    run = finetune("t2v", 2, 2, lora_rank=4)
    lora_file = run.root / "pytorch_lora_weights.safetensors"
    assert_refused(cli(lora_file, tmp_path / "o2", "--lora", "fuse", "--base", base), "needs the base weights")
    other = config_folder(tmp_path / "other", build_tiny_transformer("5b", num_layers=2))
    assert_refused(cli(lora_file, tmp_path / "o3", "--base", other), "does not fit the base model")
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3"))
