"""Mochi-1: dit.safetensors both ways judged by Diffusers' own single-file converter (the last block's asymmetry
included, at 48 layers and at another depth), genmo fine-tuner checkpoints, the VAE from its two files against an
independent writer, a pipeline folder that loads and renders, bad input and the fp32 allowlist."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import assert_refused, assert_same_tensors, component_weights
from fixtures import SCRIPTS
from mochi_fixtures import judge_transformer, tiny_pipeline, write_original_vae
from safetensors.torch import load_file, save_file

from cogexport.models.family import family_named
from cogexport.precision import PrecisionPolicy

sys.path.insert(0, str(SCRIPTS))
from make_tiny_mochi import build_transformer, original_kwargs, render  # noqa: E402

FAMILY = family_named("mochi")
WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def dit_file(tmp_path_factory):
    """dit.safetensors as cogexport writes it back (--to original, fp32) from the tiny pipeline."""
    from cogexport.exporter import export_original

    out = tmp_path_factory.mktemp("mochi-original") / "release"
    export_original(tiny_pipeline(), out, dtype="fp32", progress=False)
    return out


def test_written_dit_is_read_by_diffusers_back_to_the_same_tensors(dit_file):
    # genmo keeps no config beside it (the card is cogexport's)
    assert sorted(p.name for p in dit_file.iterdir()) == ["README.md", "dit.safetensors"]
    written = load_file(dit_file / "dit.safetensors")
    assert_same_tensors(judge_transformer(written), component_weights(tiny_pipeline(), "transformer"))
    # the last block updates only the video stream: no text-stream output projection or MLP, a one-chunk modulation
    assert not [key for key in written if key.startswith("blocks.47.") and ("proj_y" in key or "mlp_y" in key)]
    assert written["blocks.47.mod_y.weight"].shape[0] * 4 == written["blocks.46.mod_y.weight"].shape[0]
    assert len(written) == 879 and len(judge_transformer(written)) == 1071  # as the release (docs, section 4)


def test_the_last_block_is_found_at_any_depth(tmp_path):
    """The last block's names come from the target model, not from a layer count: a 3-layer Mochi both ways, judged by
    Diffusers' converter with its hard-coded 48 changed to 3."""
    from cogexport.exporter import export
    from cogexport.exporter import export_original

    model = build_transformer(seed=4, num_layers=3)
    model.save_pretrained(tmp_path / "diffusers")
    export_original(tmp_path / "diffusers", tmp_path / "original", dtype="fp32", progress=False)
    written = load_file(tmp_path / "original" / "dit.safetensors")
    assert_same_tensors(judge_transformer(written, num_layers=3), model.state_dict())
    export(tmp_path / "original" / "dit.safetensors", tmp_path / "back", base=tmp_path / "diffusers", dtype="fp32",
           progress=False)
    assert_same_tensors(load_file(tmp_path / "back" / WEIGHTS), model.state_dict())


def test_pipeline_from_dit_equals_diffusers_and_renders(dit_file, tmp_path, cli):
    base = tiny_pipeline()
    result = cli(dit_file / "dit.safetensors", tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    truth = component_weights(base, "transformer")
    cast = {name: t.to(policy.target_dtype(name, t.dtype)) for name, t in truth.items()}
    assert_same_tensors(component_weights(out, "transformer"), cast)
    from diffusers import MochiTransformer3DModel

    reference = MochiTransformer3DModel.from_config(MochiTransformer3DModel.load_config(base / "transformer"))
    reference.load_state_dict(cast, assign=True)
    reference.save_pretrained(tmp_path / "theirs")
    for path in (tmp_path / "theirs").iterdir():
        assert (out / "transformer" / path.name).read_bytes() == path.read_bytes(), path.name
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == "MochiPipeline" and index["force_zeros_for_empty_prompt"] is False
    assert json.loads((out / "scheduler" / "scheduler_config.json").read_text())["invert_sigmas"] is True
    assert "linked" in result.stdout and "vae linked from --base" in result.stdout
    frames = render(out)
    assert len(frames) == 7 and frames[0].size == (32, 32)


def test_genmo_finetuner_checkpoint_exports_without_base(dit_file, tmp_path, cli):
    """genmo's fine-tuner saves model_{step}.checkpoint.safetensors with the model kwargs in its metadata."""
    base = tiny_pipeline()
    config = json.loads((base / "transformer" / "config.json").read_text())
    checkpoint = tmp_path / "finetunes" / "model_500.checkpoint.safetensors"
    checkpoint.parent.mkdir()
    save_file(load_file(dit_file / "dit.safetensors"), checkpoint, metadata={"kwargs": json.dumps(original_kwargs(config))})
    result = cli(checkpoint, tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), component_weights(base, "transformer"))
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: written[k] for k in config if not k.startswith("_")} == {k: v for k, v in config.items()
                                                                        if not k.startswith("_")}


def test_vae_from_its_two_files(tmp_path, cli):
    base = tiny_pipeline()
    truth = component_weights(base, "vae")
    encoder, decoder = write_original_vae(tmp_path / "release", truth)
    result = cli("--component", "vae", encoder, decoder, tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), truth)  # the whole VAE is kept in fp32
    from diffusers import AutoencoderKLMochi

    reference = AutoencoderKLMochi.from_config(AutoencoderKLMochi.load_config(base / "vae"))
    reference.load_state_dict(truth, assign=True)
    reference.save_pretrained(tmp_path / "theirs")
    for path in (tmp_path / "theirs").iterdir():
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes(), path.name


def test_bad_input_is_one_line(dit_file, tmp_path, cli):
    from ltx_video_fixtures import tiny_pipeline as tiny_ltx

    dit = tmp_path / "dit.safetensors"
    dit.write_bytes((dit_file / "dit.safetensors").read_bytes())
    assert_refused(cli, tmp_path, ["--model-type", "i2v", dit, tmp_path / "out", "--base", tiny_pipeline()],
                   "--model-type i2v is not a Mochi task")
    assert_refused(cli, tmp_path, [dit, tmp_path / "out", "--base", tiny_ltx("2b", "0.9.5")],
                   "holds a Mochi transformer, not a LTX-Video one")
    assert_refused(cli, tmp_path, [dit, tmp_path / "out"], "not a published Mochi size; pass --base")
    (tmp_path / "half").mkdir()
    encoder, _ = write_original_vae(tmp_path / "half", component_weights(tiny_pipeline(), "vae"))
    (tmp_path / "half" / "decoder.safetensors").unlink()
    assert_refused(cli, tmp_path, ["--component", "vae", encoder, tmp_path / "out", "--base", tiny_pipeline()])


def test_fp32_allowlist_is_the_normalisation_weights_and_the_rope_frequencies():
    from diffusers import MochiTransformer3DModel

    with torch.device("meta"):
        model = MochiTransformer3DModel(num_layers=2)
    # derived from the class: every parameter of a normalisation layer, and the learned positional frequencies
    expected = {f"{module_name}.{name}".lstrip(".") for module_name, module in model.named_modules()
                if "norm" in type(module).__name__.lower() for name, _ in module.named_parameters(recurse=False)}
    expected |= {name for name, _ in model.named_parameters(recurse=False) if "freq" in name}
    assert expected and "pos_frequencies" in expected
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    kept = {name for name, t in model.state_dict().items() if policy.target_dtype(name, t.dtype) == torch.float32}
    assert kept == expected
    assert not getattr(MochiTransformer3DModel, "_keep_in_fp32_modules", None)
