"""SAT checkpoints of all five CogVideoX variants (and the VAE) export to folders Diffusers loads strictly, equal to
the original tensors, with the same forward output as the original model."""

from __future__ import annotations

import json

import pytest
import torch
from cogvideox_fixtures import (VARIANTS, build_tiny_transformer, build_tiny_vae, config_folder,
                                num_vae_up_blocks, transformer_forward_inputs, write_sat_run, write_sat_vae)
from diffusers import AutoencoderKLCogVideoX, CogVideoXTransformer3DModel
from safetensors.torch import load_file

from cogexport.exporter import export

MODEL_TYPE = {"2b": "t2v", "5b": "t2v", "5b-i2v": "i2v", "1.5-5b": "t2v", "1.5-5b-i2v": "i2v"}


def load_strict(model_class, folder):
    """from_pretrained, failing on any missing or unexpected key, with every tensor in freshly allocated memory.

    from_pretrained leaves tensors in the memory-mapped file at whatever alignment the header gives them, and on
    some CPUs the vector kernels then round differently in the last bit: Diffusers' own save_pretrained round
    trip changes the forward output that way. Fresh copies compare the weights, not where they sit.
    """
    model, info = model_class.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info
    for tensor in (*model.parameters(), *model.buffers()):
        tensor.data = tensor.data.clone()
    return model.eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_sat_run_exports_equal_tensors_and_the_same_forward_output(variant, tmp_path, cli):
    original = build_tiny_transformer(variant, num_layers=3, seed=11)
    write_sat_run(tmp_path / "run", original.state_dict(), dtype=torch.float32)
    base = config_folder(tmp_path / "base", original)

    result = cli("--model-type", MODEL_TYPE[variant], tmp_path / "run", tmp_path / "out", "--base", base,
                 "--dtype", "fp32", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["dropped"] and report["ignored"], "droppable keys dropped, T5/VAE keys ignored"

    exported = load_strict(CogVideoXTransformer3DModel, tmp_path / "out")
    for name, tensor in original.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name
    inputs = transformer_forward_inputs(exported.config, seed=5)
    with torch.no_grad():
        assert torch.equal(exported(**inputs).sample, original(**inputs).sample)


@pytest.mark.parametrize("variant", ["2b", "1.5-5b-i2v"])
def test_default_bf16_export_keeps_the_allowlist_in_fp32(variant, tmp_path):
    original = build_tiny_transformer(variant, num_layers=2, seed=2)
    run = write_sat_run(tmp_path / "run", original.state_dict())  # bf16, as SAT trains
    export(tmp_path / "run", tmp_path / "out", base=config_folder(tmp_path / "base", original))
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    kept = [n for n, t in written.items() if t.dtype == torch.float32]
    assert kept and all(any(part in n for part in ("norm1.norm", "norm2.norm", "norm_q", "norm_k", "norm_final",
                                                   "norm_out.norm")) for n in kept)
    for name, expected in run.expected.items():
        assert torch.equal(written[name], expected.to(written[name].dtype)), name


def test_ema_copy_is_selectable(tmp_path):
    original = build_tiny_transformer("5b", num_layers=2, seed=4)
    run = write_sat_run(tmp_path / "run", original.state_dict(), ema=True)
    base = config_folder(tmp_path / "base", original)
    export(tmp_path / "run", tmp_path / "main", base=base, dtype="fp32")
    export(tmp_path / "run", tmp_path / "ema", base=base, dtype="fp32", ema=True)
    main = load_file(tmp_path / "main" / "diffusion_pytorch_model.safetensors")
    ema = load_file(tmp_path / "ema" / "diffusion_pytorch_model.safetensors")
    for name in run.expected:
        assert torch.equal(main[name], run.expected[name]) and torch.equal(ema[name], run.expected_ema[name])
    assert any(not torch.equal(main[n], ema[n]) for n in main)


@pytest.mark.parametrize("pointer", ["iteration dir", "model-states file"])
def test_sat_entry_points(pointer, tmp_path):
    original = build_tiny_transformer("2b", num_layers=1, seed=6)
    run = write_sat_run(tmp_path / "run", original.state_dict())
    source = run.model_states.parent if pointer == "iteration dir" else run.model_states
    export(source, tmp_path / "out", base=config_folder(tmp_path / "base", original), dtype="fp32")
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert all(torch.equal(written[n], t) for n, t in run.expected.items())


def test_sat_vae_file_exports_to_an_equal_diffusers_vae(tmp_path):
    original = build_tiny_vae(seed=8)
    write_sat_vae(tmp_path / "3d-vae.pt", original.state_dict(), num_vae_up_blocks(original.state_dict()))
    base = config_folder(tmp_path / "base", original)
    export(tmp_path / "3d-vae.pt", tmp_path / "vae", component="vae", base=base)
    exported = load_strict(AutoencoderKLCogVideoX, tmp_path / "vae")
    for name, tensor in original.state_dict().items():
        assert exported.state_dict()[name].dtype == torch.float32, "the VAE stays fp32 by default"
        assert torch.equal(exported.state_dict()[name], tensor), name


def test_vae_inside_a_sat_engine_exports_too(tmp_path):
    vae = build_tiny_vae(seed=9)
    transformer = build_tiny_transformer("2b", num_layers=1)
    write_sat_run(tmp_path / "run", transformer.state_dict(), extra_vae_sd=vae.state_dict(), dtype=torch.float32)
    export(tmp_path / "run", tmp_path / "vae", component="vae", base=config_folder(tmp_path / "base", vae))
    written = load_file(tmp_path / "vae" / "diffusion_pytorch_model.safetensors")
    assert set(written) == set(vae.state_dict())
    assert all(torch.equal(written[n], t) for n, t in vae.state_dict().items())
