"""The fp32 allowlist, checked both ways for every family against facts taken independently of cogexport's
PrecisionPolicy: every tensor the facts keep in fp32 is written in fp32, and every fp32 tensor is one of them.

- CogVideoX (documented in key_maps/cogvideox/family.toml): the LayerNorm parameters (bf16 keeps 8 bits near 1.0,
  where a fine-tune's changes to norm scales round away) and 5b-I2V's learned position table. Derived here by
  walking the Diffusers model's modules for torch.nn.LayerNorm, not from any name list of ours.
- Wan: what Diffusers itself keeps in fp32 when it loads the model in bf16 (its _keep_in_fp32_modules), asked of
  Diffusers by loading an fp32 save_pretrained folder with torch_dtype=bfloat16.
"""

from __future__ import annotations

import pytest
import torch
from cogvideox_fixtures import VARIANTS, build_tiny_transformer, config_folder, write_sat_run
from diffusers import WanTransformer3DModel
from safetensors.torch import load_file

from cogexport.exporter import export


def fp32_names(folder) -> set[str]:
    return {name for name, tensor in load_file(folder / "diffusion_pytorch_model.safetensors").items()
            if tensor.dtype == torch.float32}


def layer_norm_parameters(model: torch.nn.Module) -> set[str]:
    return {f"{module_name}.{name}" for module_name, module in model.named_modules()
            if isinstance(module, torch.nn.LayerNorm) for name, _ in module.named_parameters(recurse=False)}


@pytest.mark.parametrize("variant", VARIANTS)
def test_cogvideox_keeps_exactly_its_layer_norms_and_learned_positions_in_fp32(variant, tmp_path):
    original = build_tiny_transformer(variant, num_layers=2, seed=4)
    write_sat_run(tmp_path / "run", original.state_dict())
    export(tmp_path / "run", tmp_path / "out", base=config_folder(tmp_path / "base", original))
    expected = layer_norm_parameters(original)
    if original.config.use_learned_positional_embeddings:
        expected.add("patch_embed.pos_embedding")
    assert expected, "the tiny model has layer norms"
    assert fp32_names(tmp_path / "out") == expected


WAN_CONFIGS = {
    "t2v": {},
    "i2v": {"in_channels": 8, "image_dim": 12, "added_kv_proj_dim": 32},
    "flf2v": {"in_channels": 8, "image_dim": 12, "added_kv_proj_dim": 32, "pos_embed_seq_len": 6},
}


@pytest.mark.parametrize("kind", WAN_CONFIGS)
def test_wan_keeps_in_fp32_exactly_what_diffusers_keeps(kind, tmp_path):
    torch.manual_seed(0)
    config = {**dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, text_dim=12,
                     freq_dim=16, ffn_dim=24, num_layers=2), **WAN_CONFIGS[kind]}
    model = WanTransformer3DModel(**config)
    model.save_pretrained(tmp_path / "fp32")
    loaded = WanTransformer3DModel.from_pretrained(tmp_path / "fp32", torch_dtype=torch.bfloat16)
    diffusers_keeps = {name for name, tensor in loaded.state_dict().items() if tensor.dtype == torch.float32}
    assert diffusers_keeps and diffusers_keeps != set(loaded.state_dict())

    export(tmp_path / "fp32", tmp_path / "out")
    assert fp32_names(tmp_path / "out") == diffusers_keeps
