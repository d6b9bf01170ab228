"""Pipeline folders of Wan's variants: an original-layout release exported with a tiny local --base is what the
pipeline's own save_pretrained writes (model_index.json, the scheduler config, the transformer(s) as
from_pretrained(torch_dtype=bf16) keeps them), takes the text encoder, tokenizer (and CLIP parts) and Wan's VAE from
--base or the VAE from Wan2.1_VAE.pth, loads with its Diffusers pipeline class and renders frames."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refusal
from wan_fixtures import same_files
from wan_variants_fixtures import tiny_variant_pipeline

from cogexport.exporter import export, export_original
from render_wan_variants import render_variant  # scripts/, on the path through wan_variants_fixtures

PIPELINES = {"vace": "WanVACEPipeline", "vace-a14b": "WanVACEPipeline", "animate": "WanAnimatePipeline",
             "skyreels-df": "SkyReelsV2DiffusionForcingPipeline", "skyreels-t2v": "SkyReelsV2Pipeline",
             "skyreels-i2v": "SkyReelsV2ImageToVideoPipeline"}
CLIP = ("image_encoder", "image_processor")


@pytest.mark.parametrize("variant", list(PIPELINES))
def test_original_release_to_pipeline_loads_and_renders(variant, tmp_path, cli):
    import diffusers

    base = tiny_variant_pipeline(variant)
    export_original(base, tmp_path / "release", dtype="fp32")  # the original layout, as released (fp32)
    result = cli(tmp_path / "release", tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    linked = ["text_encoder", "tokenizer", "vae", *(CLIP if (base / "image_encoder").is_dir() else ())]
    for name in linked:
        assert same_files(out / name, base / name) == [], name
    # exactly what the pipeline's save_pretrained wrote for the same components and settings
    assert (out / "model_index.json").read_bytes() == (base / "model_index.json").read_bytes()
    assert (out / "scheduler" / "scheduler_config.json").read_bytes() == \
        (base / "scheduler" / "scheduler_config.json").read_bytes()
    experts = ["transformer", "transformer_2"] if variant.endswith("a14b") else ["transformer"]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("transformer")) == experts
    for expert in experts:
        model_class = getattr(diffusers, json.loads((base / expert / "config.json").read_text())["_class_name"])
        reference = tmp_path / "reference" / expert
        model_class.from_pretrained(base / expert, torch_dtype=torch.bfloat16).save_pretrained(reference)
        assert (out / expert / "diffusion_pytorch_model.safetensors").read_bytes() == \
            (reference / "diffusion_pytorch_model.safetensors").read_bytes()
    card = (out / "README.md").read_text()
    assert f"from diffusers import {PIPELINES[variant]}" in card and "pipeline_tag: " in card

    rendered = render_variant(out, tmp_path / "frames.gif", steps=2)
    assert rendered["pipeline"] == PIPELINES[variant] and rendered["frames"] >= 4


@pytest.mark.parametrize("variant", ["vace", "animate", "skyreels-i2v"])
def test_pipeline_with_wans_original_vae(variant, tmp_path, cli):
    """Every variant decodes with Wan 2.1's VAE: --vae Wan2.1_VAE.pth exports it into the variant's pipeline."""
    base = tiny_variant_pipeline(variant)
    export_original(base, tmp_path / "release", dtype="fp32")
    export_original(base, tmp_path / "vae", component="vae")
    assert sorted(p.name for p in (tmp_path / "vae").iterdir()) == ["README.md", "Wan2.1_VAE.pth"]
    result = cli(tmp_path / "release", tmp_path / "out", "--base", base, "--vae", tmp_path / "vae" / "Wan2.1_VAE.pth")
    assert result.exit_code == 0, result.stderr
    assert "vae linked" not in result.stdout
    assert same_files(tmp_path / "out" / "vae", base / "vae") == []


def test_a_vae_alone_is_wans(tmp_path, cli):
    """Wan's VAE is one layout several families list: alone, it is Wan's (its owner's), as it was before the
    variants (the tiny VAE is no published size: the refusal says it is of no published Wan size); with a variant's
    --base, that family's."""
    base = tiny_variant_pipeline("vace")
    export_original(base, tmp_path / "vae", component="vae")
    vae = tmp_path / "vae" / "Wan2.1_VAE.pth"
    assert_refusal(cli(vae, tmp_path / "alone", "--component", "vae"), "of no published Wan size")
    assert export(vae, tmp_path / "with-base", component="vae", base=base).family == "Wan VACE"
    assert same_files(tmp_path / "with-base", base / "vae") == []
