"""Pipeline folders: exported transformer (and VAE), base text encoder and tokenizer linked in, per-variant scheduler,
model_index.json, and a model card; Diffusers loads the folder and renders frames."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from cogvideox_fixtures import num_vae_up_blocks, tiny_pipeline, write_sat_run, write_sat_vae
from diffusers import CogVideoXTransformer3DModel
from fixtures import SCRIPTS
from huggingface_hub import ModelCard
from safetensors.torch import load_file

sys.path.insert(0, str(SCRIPTS))
from render_pipeline import render  # noqa: E402
from tiny_models import randomize_  # noqa: E402


def finetuned_weights(base, seed: int) -> dict[str, torch.Tensor]:
    """Weights shaped like the base pipeline's transformer, but different (a fine-tune)."""
    config = CogVideoXTransformer3DModel.load_config(base / "transformer")
    return randomize_(CogVideoXTransformer3DModel.from_config(config), seed).state_dict()


@pytest.mark.parametrize("model_type", ["t2v", "i2v"])
def test_pipeline_folder_loads_and_renders(model_type, tmp_path, cli):
    base = tiny_pipeline(model_type)
    run = write_sat_run(tmp_path / "run", finetuned_weights(base, seed=21))
    result = cli("--model-type", model_type, tmp_path / "run", tmp_path / "out", "--base", base, "--json")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"

    assert sorted(p.name for p in out.iterdir()) == ["README.md", "model_index.json", "scheduler", "text_encoder",
                                                      "tokenizer", "transformer", "vae"]
    assert (out / "model_index.json").read_bytes() == (base / "model_index.json").read_bytes()
    for component in ("text_encoder", "tokenizer", "vae"):
        for path in (base / component).iterdir():
            assert (out / component / path.name).stat().st_ino == path.stat().st_ino, "hard-linked from --base"
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["snr_shift_scale"] == (3.0 if model_type == "t2v" else 1.0)  # tiny t2v is 2b-like
    assert scheduler["prediction_type"] == "v_prediction" and scheduler["rescale_betas_zero_snr"] is True
    written = load_file(out / "transformer" / "diffusion_pytorch_model.safetensors")
    assert all(torch.equal(written[n], t.to(written[n].dtype)) for n, t in run.expected.items())

    frames = render(out, tmp_path / "frames.gif", steps=2)
    assert frames["frames"] > 1 and (tmp_path / "frames.gif").stat().st_size > 0


def test_model_card_says_what_was_done(tmp_path):
    base = tiny_pipeline("i2v")
    write_sat_run(tmp_path / "run", finetuned_weights(base, seed=3), iteration=750)
    from cogexport.exporter import export

    export(tmp_path / "run", tmp_path / "out", base=base, command="cogexport run out --base base",
           base_model="someone/tiny-cogvideox-i2v")
    card = ModelCard.load(tmp_path / "out" / "README.md")
    # huggingface_hub's own card writes it back unchanged: cogexport writes what ModelCard would
    assert str(card) == (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert card.data.library_name == "diffusers"
    assert card.data.base_model == "someone/tiny-cogvideox-i2v"
    assert card.data.to_dict()["base_model_relation"] == "finetune"
    assert card.data.pipeline_tag == "image-to-video"
    assert "cogexport run out --base base" in card.text
    assert "step 750" in card.text and "tag 750" in card.text
    assert "bf16, except tensors matching norm1.norm" in card.text
    assert "CogVideoXImageToVideoPipeline.from_pretrained" in card.text
    assert card.text.lstrip().startswith("# custom-size CogVideoX (CogVideoX-5b-I2V layout) fine-tune")


def test_pipeline_with_a_sat_vae_file(tmp_path):
    base = tiny_pipeline("t2v")
    write_sat_run(tmp_path / "run", finetuned_weights(base, seed=5))
    vae = load_file(base / "vae" / "diffusion_pytorch_model.safetensors")
    vae = {name: tensor + 0.5 for name, tensor in vae.items()}  # a fine-tuned VAE
    write_sat_vae(tmp_path / "3d-vae.pt", vae, num_vae_up_blocks(vae))
    from cogexport.exporter import export

    result = export(tmp_path / "run", tmp_path / "out", base=base, vae=tmp_path / "3d-vae.pt")
    assert "vae" not in result.linked
    written = load_file(tmp_path / "out" / "vae" / "diffusion_pytorch_model.safetensors")
    assert set(written) == set(vae) and all(torch.equal(written[n], t) for n, t in vae.items())


def test_a_variant_pipeline_loads_as_its_card_says(tmp_path):
    from diffusers import CogVideoXPipeline

    from cogexport.exporter import export

    base = tiny_pipeline("t2v")
    write_sat_run(tmp_path / "run", finetuned_weights(base, seed=6))
    export(tmp_path / "run", tmp_path / "out", base=base, variant="bf16")
    card = ModelCard.load(tmp_path / "out" / "README.md")
    assert 'from_pretrained("path/to/this/folder", variant="bf16", dtype=torch.bfloat16)' in card.text
    pipe = CogVideoXPipeline.from_pretrained(tmp_path / "out", variant="bf16", torch_dtype=torch.bfloat16)
    assert pipe.transformer.dtype == torch.bfloat16
