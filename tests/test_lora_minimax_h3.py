"""MiniMax-H3 LoRA: DiffSynth-Studio's adapter (lora_A.default on its MiniMaxH3DiT: the fused qkv_proj interleaved per
head, fc1 as [gate; value]) written for Diffusers and ComfyUI and fused, judged by Diffusers' own MiniMax-H3 LoRA
converter (which hard-codes the released 128-wide heads, so the tiny model here has two of them) and by Diffusers'
LoRA loading against the fused model's output."""

from __future__ import annotations

import pytest
import torch
from minimax_h3_fixtures import diffusers_forward, packed_inputs
from safetensors.torch import load_file, save_file

RANK = 4
# two heads of 128 (what Diffusers' converter assumes of a DiffSynth-Studio file), the rest tiny
CONFIG = {"num_attention_heads": 2, "attention_head_dim": 128, "hidden_size": 32, "num_layers": 2,
          "num_refiner_layers": 1, "ffn_dim": 48, "in_channels": 4, "audio_in_channels": 8, "patch_size": (1, 2, 2),
          "text_dim": 24, "freq_dim": 16, "time_embed_hidden_dim": 32, "time_embed_dim": 16, "rope_freq_dim": 2}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """A tiny base transformer folder (seeded weights) and a DiffSynth-Studio LoRA file for it."""
    from diffusers import MiniMaxH3Transformer3DModel

    folder = tmp_path_factory.mktemp("minimax_h3_lora")
    torch.manual_seed(0)
    MiniMaxH3Transformer3DModel.from_config(CONFIG).save_pretrained(folder / "base")
    generator = torch.Generator().manual_seed(1)
    inner, lora = 2 * 128, {}
    for stack, blocks in (("blocks", 2), ("token_refiner.blocks", 1)):
        for i in range(blocks):
            for module, rows in (("attn.qkv_proj", 3 * inner), ("attn.out_proj", 32), ("mlp.fc1", 2 * 48),
                                 ("mlp.fc2", 32)):
                columns = inner if module == "attn.out_proj" else 48 if module == "mlp.fc2" else 32
                lora[f"{stack}.{i}.{module}.lora_A.default.weight"] = torch.randn(RANK, columns, generator=generator)
                lora[f"{stack}.{i}.{module}.lora_B.default.weight"] = torch.randn(rows, RANK, generator=generator) / 8
    save_file(lora, folder / "diffsynth_lora.safetensors")
    return {"folder": folder, "base": folder / "base", "lora": folder / "diffsynth_lora.safetensors"}


def diffusers_conversion(state: dict) -> dict:
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_minimax_h3_lora_to_diffusers

    return _convert_non_diffusers_minimax_h3_lora_to_diffusers(dict(state))


def deltas(converted: dict) -> dict:
    """Each module's B A, from a Diffusers-named LoRA state dict."""
    return {name.removesuffix(".lora_A.weight"): converted[name.replace("lora_A", "lora_B")].double() @
            tensor.double() for name, tensor in converted.items() if name.endswith(".lora_A.weight")}


def test_a_diffsynth_lora_becomes_what_diffusers_lora_converter_makes_of_it(run, cli, tmp_path):
    result = cli(run["lora"], tmp_path / "out", "--base", run["base"])
    assert result.exit_code == 0, result.stderr
    ours = load_file(tmp_path / "out" / "pytorch_lora_weights.safetensors")
    theirs = diffusers_conversion(load_file(run["lora"]))
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    checked = cli("verify", tmp_path / "out", "--against", run["lora"], "--base", run["base"])
    assert checked.exit_code == 0, checked.stdout + checked.stderr


def test_fused_is_the_base_plus_b_a_and_the_adapter_loads_with_the_fused_models_output(run, cli, tmp_path):
    from diffusers import MiniMaxH3Transformer3DModel

    result = cli(run["lora"], tmp_path / "fused", "--base", run["base"], "--lora", "fuse", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    fused = load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors")
    base = load_file(run["base"] / "diffusion_pytorch_model.safetensors")
    converted = {name.removeprefix("transformer."): t for name, t in diffusers_conversion(load_file(run["lora"])).items()}
    for name, weight in base.items():  # W + (B @ A) * 1.0 in fp32, PEFT's merge (DiffSynth-Studio applies scale 1)
        module = name.removesuffix(".weight")
        up, down = converted.get(f"{module}.lora_B.weight"), converted.get(f"{module}.lora_A.weight")
        expected = weight + (up @ down) * 1.0 if up is not None else weight
        assert torch.equal(fused[name], expected), name
    checked = cli("verify", tmp_path / "fused", "--against", run["lora"], "--base", run["base"])
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    assert cli(run["lora"], tmp_path / "adapter", "--base", run["base"]).exit_code == 0
    with_adapter = MiniMaxH3Transformer3DModel.from_pretrained(run["base"]).eval()
    with_adapter.load_lora_adapter(str(tmp_path / "adapter" / "pytorch_lora_weights.safetensors"), prefix="transformer")
    given = packed_inputs(seed=3)
    ours, theirs = diffusers_forward(MiniMaxH3Transformer3DModel.from_pretrained(tmp_path / "fused").eval(), given), \
        diffusers_forward(with_adapter, given)
    assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(ours, theirs))
    assert not torch.allclose(ours[0], diffusers_forward(MiniMaxH3Transformer3DModel.from_pretrained(run["base"]),
                                                         given)[0])  # the adapter changes the output


def test_a_comfyui_adapter_is_stacked_and_has_the_same_deltas(run, cli, tmp_path):
    """Written for ComfyUI (the original names, qkv stacked [q; k; v]): Diffusers' converter, which reads such a file
    as stacked, makes of it the deltas it makes of DiffSynth-Studio's interleaved file."""
    result = cli(run["lora"], tmp_path / "comfy", "--base", run["base"], "--lora-format", "comfyui")
    assert result.exit_code == 0, result.stderr
    written = load_file(next((tmp_path / "comfy").glob("*.safetensors")))
    assert any(name.startswith("diffusion_model.blocks.0.attn.qkv_proj.") for name in written)
    ours, theirs = deltas(diffusers_conversion(written)), deltas(diffusers_conversion(load_file(run["lora"])))
    assert set(ours) == set(theirs)
    assert all(torch.allclose(ours[name], theirs[name], atol=1e-10, rtol=0) for name in theirs)
    # read back as an ai-toolkit / ComfyUI file (stacked), it is the same adapter again
    again = cli(next((tmp_path / "comfy").glob("*.safetensors")), tmp_path / "again", "--base", run["base"])
    assert again.exit_code == 0, again.stderr
    back = deltas(load_file(tmp_path / "again" / "pytorch_lora_weights.safetensors"))  # transformer.-prefixed too
    assert set(back) == set(theirs)
    assert all(torch.allclose(back[name], theirs[name], atol=1e-10, rtol=0) for name in theirs)
