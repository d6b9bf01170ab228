"""Wan pipeline folders: an original-layout release exported with a tiny local --base is what the pipeline's own
save_pretrained writes (model_index.json, scheduler config, the transformer(s) as from_pretrained(torch_dtype=bf16)
keeps them), links the text encoder, tokenizer and CLIP parts from --base, loads with its Diffusers pipeline class and
renders frames."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel
from wan_fixtures import same_files, tiny_wan_pipeline

from cogexport.exporter import export_original
from render_pipeline import render  # scripts/, on the path through wan_fixtures

LINKED = {"t2v": ["text_encoder", "tokenizer", "vae"], "ti2v": ["text_encoder", "tokenizer", "vae"],
          "t2v-a14b": ["text_encoder", "tokenizer", "vae"], "i2v-a14b": ["text_encoder", "tokenizer", "vae"],
          "i2v": ["text_encoder", "tokenizer", "image_encoder", "image_processor", "vae"],
          "flf2v": ["text_encoder", "tokenizer", "image_encoder", "image_processor", "vae"]}
PIPELINE = {"t2v": "WanPipeline", "ti2v": "WanPipeline", "t2v-a14b": "WanPipeline",
            "i2v": "WanImageToVideoPipeline", "flf2v": "WanImageToVideoPipeline", "i2v-a14b": "WanImageToVideoPipeline"}


@pytest.mark.parametrize("variant", list(PIPELINE))
def test_original_release_to_pipeline_loads_and_renders(variant, tmp_path, cli):
    base = tiny_wan_pipeline(variant)
    export_original(base, tmp_path / "release", dtype="fp32")  # the original layout, as released (fp32)
    result = cli(tmp_path / "release", tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    for name in LINKED[variant]:
        assert same_files(out / name, base / name) == [], name
    # exactly what the pipeline's save_pretrained wrote for the same components and settings
    assert (out / "model_index.json").read_bytes() == (base / "model_index.json").read_bytes()
    assert (out / "scheduler" / "scheduler_config.json").read_bytes() == \
        (base / "scheduler" / "scheduler_config.json").read_bytes()
    experts = ["transformer", "transformer_2"] if variant.endswith("a14b") else ["transformer"]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("transformer")) == experts
    for expert in experts:
        reference = tmp_path / "reference" / expert
        WanTransformer3DModel.from_pretrained(base / expert, torch_dtype=torch.bfloat16).save_pretrained(reference)
        assert (out / expert / "diffusion_pytorch_model.safetensors").read_bytes() == \
            (reference / "diffusion_pytorch_model.safetensors").read_bytes()
    card = (out / "README.md").read_text()
    assert f"from diffusers import {PIPELINE[variant]}" in card and "pipeline_tag: " in card

    rendered = render(out, tmp_path / "frames.gif", steps=2)
    assert rendered["frames"] == 5
    assert rendered["variant"] == ("i2v" if PIPELINE[variant] == "WanImageToVideoPipeline" else "t2v")


def test_pipeline_with_the_original_vae(tmp_path, cli):
    base = tiny_wan_pipeline("t2v")
    export_original(base, tmp_path / "release", dtype="fp32")
    export_original(base, tmp_path / "vae", component="vae")
    result = cli(tmp_path / "release", tmp_path / "out", "--base", base, "--vae", tmp_path / "vae" / "Wan2.1_VAE.pth")
    assert result.exit_code == 0, result.stderr
    assert "vae linked" not in result.stdout
    assert same_files(tmp_path / "out" / "vae", base / "vae") == []
