"""Real SAT training checkpoints (written by CogVideo's sat/ training loop, not by a writer of ours) export to
exactly what Diffusers' own conversion script makes of them, and the defects found exporting them stay fixed.

The checkpoints and their reference conversions live in ../shared/fixtures/sat-real (read-only; its README says
how they were made). The judge is the reference conversion, never our own key maps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, write_sat_run
from diffusers import CogVideoXPipeline, CogVideoXTransformer3DModel
from safetensors.torch import load_file
from wan_fixtures import SHARED

from cogexport.inspect_report import inspect_checkpoint

SAT_REAL = SHARED / "fixtures" / "sat-real"
pytestmark = pytest.mark.skipif(not SAT_REAL.is_dir(), reason=f"real SAT fixtures not found at {SAT_REAL}")
RUN = "checkpoint/tiny-11-23-11-51"


def case(name: str) -> Path:
    return SAT_REAL / name


def reference(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "reference_transformer_fp32.safetensors")


def exported(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "diffusion_pytorch_model.safetensors")


def export_cli(cli, case_dir: Path, output: Path, *options: object) -> None:
    result = cli("--model-type", "t2v", case_dir / RUN, output, "--base", case_dir / "base" / "transformer", *options)
    assert result.exit_code == 0, result.stderr


def layer_norm_parameters(config: dict) -> set[str]:
    """The fp32 allowlist from the model itself: every parameter of a LayerNorm (README: the transformer's
    LayerNorm weights; CogVideoX-5b-I2V's learned position table is not in a 2B model)."""
    with torch.device("meta"):
        model = CogVideoXTransformer3DModel.from_config(config)
    return {f"{module_name}.{name}" for module_name, module in model.named_modules()
            if isinstance(module, torch.nn.LayerNorm) for name, _ in module.named_parameters(recurse=False)}


def assert_equal(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(actual) == set(expected)
    wrong = [name for name in expected if not torch.equal(actual[name], expected[name])]
    assert not wrong, wrong


def test_fp32_export_equals_the_diffusers_conversion(cli, tmp_path):
    export_cli(cli, case("t2v_2b"), tmp_path / "out", "--dtype", "fp32")
    ours, expected = exported(tmp_path / "out"), reference(case("t2v_2b") / "reference")
    assert all(t.dtype == torch.float32 for t in ours.values())
    assert_equal(ours, expected)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    reference_config = json.loads((case("t2v_2b") / "reference" / "config.json").read_text())
    assert {k: v for k, v in config.items() if not k.startswith("_")} == \
        {k: v for k, v in reference_config.items() if not k.startswith("_")}


def test_bf16_export_equals_the_conversion_cast_to_bf16_except_the_layer_norms(cli, tmp_path):
    export_cli(cli, case("t2v_2b"), tmp_path / "out")
    ours, expected = exported(tmp_path / "out"), reference(case("t2v_2b") / "reference")
    kept = layer_norm_parameters(json.loads((case("t2v_2b") / "reference" / "config.json").read_text()))
    assert kept and {n for n, t in ours.items() if t.dtype == torch.float32} == kept
    assert all(ours[n].dtype == torch.bfloat16 for n in ours if n not in kept)
    assert_equal(ours, {n: t if n in kept else t.to(torch.bfloat16) for n, t in expected.items()})


def test_ema_export_equals_the_conversion_of_the_ema_copy(cli, tmp_path):
    export_cli(cli, case("t2v_2b"), tmp_path / "out", "--dtype", "fp32", "--ema")
    ema, main = reference(case("t2v_2b") / "reference" / "ema"), reference(case("t2v_2b") / "reference")
    assert any(not torch.equal(ema[n], main[n]) for n in main), "the EMA copy differs from the weights"
    assert_equal(exported(tmp_path / "out"), ema)


def fused_by_diffusers(adapter: Path) -> dict[str, torch.Tensor]:
    """The run's base transformer with the adapter loaded as users do (load_lora_weights), fused at scale 1."""
    lora = case("lora_2b")
    transformer = CogVideoXTransformer3DModel.from_config(
        json.loads((lora / "base" / "transformer" / "config.json").read_text()))
    transformer.load_state_dict(reference(lora / "reference" / "base_weights"), strict=True)
    pipe = CogVideoXPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=transformer, scheduler=None)
    pipe.load_lora_weights(adapter, adapter_name="trained")
    pipe.fuse_lora(lora_scale=1.0)
    pipe.unload_lora_weights()
    return pipe.transformer.state_dict()


def bf16_rounded(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.to(torch.bfloat16) for name, tensor in tensors.items()}


def sat_merge() -> dict[str, torch.Tensor]:
    """SAT's own LoraMixin.merge_lora() of the run, converted by Diffusers' script (merged in bf16 by SAT)."""
    lora = case("lora_2b") / "reference"
    merged, base = reference(lora / "fused_sat_merge_lora"), reference(lora / "base_weights")
    changed = {name for name in merged if not torch.equal(merged[name], base[name])}
    assert len(changed) == 8 and all(".attn1." in name for name in changed), "the adapter changes the 8 projections"
    return merged


def test_lora_adapter_fused_by_diffusers_equals_sats_own_merge(cli, tmp_path):
    export_cli(cli, case("lora_2b"), tmp_path / "adapter")
    assert_equal(bf16_rounded(fused_by_diffusers(tmp_path / "adapter")), bf16_rounded(sat_merge()))


def test_lora_fused_export_equals_sats_own_merge(cli, tmp_path):
    export_cli(cli, case("lora_2b"), tmp_path / "fused", "--lora", "fuse")
    ours = exported(tmp_path / "fused")
    kept = layer_norm_parameters(json.loads((case("lora_2b") / "base" / "transformer" / "config.json").read_text()))
    assert {n for n, t in ours.items() if t.dtype == torch.float32} == kept
    assert_equal(bf16_rounded(ours), bf16_rounded(sat_merge()))


# Defects found by exporting these runs -----------------------------------------------------------------------

def frozen_in_the_file(case_dir: Path) -> set[str]:
    """What DeepSpeed recorded as frozen in the real model-states file (SAT's own save, read with torch)."""
    states = torch.load(next((case_dir / RUN).glob("*/mp_rank_00_model_states.pt")), map_location="cpu",
                        weights_only=False)  # a trusted fixture; it pickles numpy RNG state
    return set(states["frozen_param_shapes"])


@pytest.mark.parametrize("name, trainable", [("t2v_2b", 52), ("lora_2b", 16)])
def test_inspect_reports_the_frozen_parameters_the_file_records(name, trainable):
    report = inspect_checkpoint([case(name) / RUN])
    frozen = frozen_in_the_file(case(name))
    assert set(report["frozen"]) == frozen and len(report["trainable"]) == trainable
    assert "model.diffusion_model.mixins.pos_embed.pos_embedding" in frozen
    assert any(n.startswith("conditioner.") for n in frozen) and any(n.startswith("first_stage_model.") for n in frozen)
    if name == "lora_2b":
        assert all(".matrix_A." in n or ".matrix_B." in n for n in report["trainable"])


def test_a_wrong_model_type_names_the_checkpoint_with_the_right_article(cli, tmp_path):
    result = cli("--model-type", "i2v", case("t2v_2b") / RUN, tmp_path / "out", "--base",
                 case("t2v_2b") / "base" / "transformer")
    assert result.exit_code == 2
    assert "checkpoint is a CogVideoX T2V model" in result.stderr and "an T2V" not in result.stderr


def test_each_drop_reason_is_on_its_own_line(cli, tmp_path):
    """Two reasons, one of which contains '; ', must not read as three."""
    original = build_tiny_transformer("2b", num_layers=2, seed=3)
    write_sat_run(tmp_path / "run", original.state_dict())  # carries RoPE tables and SAT's token position table
    base = config_folder(tmp_path / "base", original)
    report = json.loads(cli(tmp_path / "run", tmp_path / "json", "--base", base, "--json").stdout)
    reasons = set(report["dropped"].values())
    assert len(reasons) == 2 and any("; " in reason for reason in reasons)
    text = cli(tmp_path / "run", tmp_path / "text", "--base", base).stdout.splitlines()
    heading = next(i for i, line in enumerate(text) if line.strip().startswith("dropped "))
    listed = text[heading + 1:heading + 1 + len(reasons)]
    assert {line.strip().rsplit(" (", 1)[0] for line in listed} == reasons
