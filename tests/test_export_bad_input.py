"""Bad input to the export: one clear line, exit 2, nothing written, the input untouched."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from conftest import assert_refused
from cogvideox_fixtures import build_tiny_transformer, config_folder, write_sat_run
from diffusers import CogVideoXTransformer3DModel


@pytest.fixture
def sat_run(tmp_path):
    original = build_tiny_transformer("5b-i2v", num_layers=2, seed=1)
    run = write_sat_run(tmp_path / "run", original.state_dict())
    return run, config_folder(tmp_path / "base", original)


def edit_module(run, change) -> None:
    """Rewrite the run's SAT file with ``change`` applied to its module dict."""
    states = torch.load(run.model_states, weights_only=False)  # our own test file
    change(states["module"])
    torch.save(states, run.model_states)


def test_wrong_model_type(cli, tmp_path, sat_run):
    run, base = sat_run
    assert_refused(cli, tmp_path, ["--model-type", "t2v", run.run_dir, tmp_path / "out", "--base", base],
                   "in_channels 8", "--model-type t2v")


def test_unknown_keys(cli, tmp_path, sat_run):
    run, base = sat_run
    edit_module(run, lambda module: module.update({"model.diffusion_model.mixins.mystery.weight": torch.ones(2)}))
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", base],
                   "does not know", "mixins.mystery.weight")


def test_missing_keys(cli, tmp_path, sat_run):
    run, base = sat_run
    edit_module(run, lambda module: module.pop("model.diffusion_model.transformer.layers.1.mlp.dense_4h_to_h.bias"))
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", base],
                   "lacks 1 tensor", "transformer_blocks.1.ff.net.2.bias")


def test_shape_mismatch_against_base(cli, tmp_path, sat_run):
    run, _ = sat_run
    config = build_tiny_transformer("5b-i2v", num_layers=2).config
    wider = config_folder(tmp_path / "wider", CogVideoXTransformer3DModel.from_config({**config, "num_attention_heads": 3}))
    # the model expected is the one --base's config describes: the message says so, and what to give instead
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", wider],
                   f"does not match the shapes of the model --base describes ({wider / 'config.json'})",
                   "the model expects", "give as --base the Diffusers folder of the model the checkpoint was trained from")


def test_layer_count_mismatch_against_base(cli, tmp_path, sat_run):
    run, _ = sat_run
    deeper = config_folder(tmp_path / "deeper", build_tiny_transformer("5b-i2v", num_layers=3))
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", deeper], "transformer_blocks.2.",
                   f"lacks 24 tensor(s) the model --base describes ({deeper / 'config.json'}) needs", "give as --base")
    shallower = config_folder(tmp_path / "shallower", build_tiny_transformer("5b-i2v", num_layers=1))
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", shallower], "transformer_blocks.1.",
                   "which the model --base describes", "give as --base")


def test_lora_checkpoint_given_to_a_full_export(cli, tmp_path):
    original = build_tiny_transformer("2b", num_layers=2)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=4)
    base = config_folder(tmp_path / "base", original)
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", base, "--component", "transformer"],
                   "is a LoRA checkpoint", "--lora adapter", "--lora fuse")


def test_unreadable_file(cli, tmp_path, sat_run):
    run, base = sat_run
    os.truncate(run.model_states, run.model_states.stat().st_size - 100)
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", base],
                   "mp_rank_00_model_states.pt", "truncated")


def test_unpublished_size_without_base(cli, tmp_path, sat_run):
    run, _ = sat_run
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out"], "not a published CogVideoX size", "--base")


def test_pipeline_without_base(cli, tmp_path, sat_run):
    run, _ = sat_run
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--component", "pipeline"], "needs --base")


def test_vae_alone_without_a_model_name():
    """A full-size CogVideoX VAE (its Diffusers names and shapes, meta tensors) fits every variant's config, which
    differ only in latent scaling: the one to write needs --model-name (or --base)."""
    from diffusers import AutoencoderKLCogVideoX

    from cogexport.errors import CogExportError
    from cogexport.exporter.options import ExportOptions
    from cogexport.exporter.parts import plan_component
    from cogexport.lazy import LazyTensor

    with torch.device("meta"):
        shapes = {name: t.shape for name, t in AutoencoderKLCogVideoX().state_dict().items()}
    source = {name: LazyTensor(shape, torch.float32, lambda: None) for name, shape in shapes.items()}
    with pytest.raises(CogExportError, match="latent scaling.*--model-name"):
        plan_component(source, "vae", None, None, None, ExportOptions(), "vae")


def test_vae_of_no_published_size_needs_base(cli, tmp_path):
    """A tiny one fits no published config: no --model-name would do, and the refusal asks for --base."""
    from cogvideox_fixtures import build_tiny_vae, num_vae_up_blocks, write_sat_vae

    vae = build_tiny_vae().state_dict()
    (tmp_path / "run").mkdir()
    write_sat_vae(tmp_path / "run" / "3d-vae.pt", vae, num_vae_up_blocks(vae))
    assert_refused(cli, tmp_path, [tmp_path / "run" / "3d-vae.pt", tmp_path / "out", "--component", "vae"],
                   "holds AutoencoderKLCogVideoX weights of no published CogVideoX size", "pass --base")


def test_missing_ema(cli, tmp_path, sat_run):
    run, base = sat_run
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", base, "--ema"], "no EMA copy", "1000-ema")


def test_output_inside_an_input_folder(cli, tmp_path, sat_run):
    run, base = sat_run
    for output in (run.run_dir / "exported", base / "exported"):
        result = cli(run.run_dir, output, "--base", base)
        assert result.exit_code == 2 and "inside the input folder" in result.stderr and not output.exists()


def test_learned_positions_into_a_config_without_them(cli, tmp_path, sat_run):
    run, _ = sat_run
    config = build_tiny_transformer("5b-i2v", num_layers=2).config
    without = config_folder(tmp_path / "without", CogVideoXTransformer3DModel.from_config(
        {**config, "use_learned_positional_embeddings": False}))
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", without],
                   "learned position embeddings", "use_learned_positional_embeddings false")


@pytest.mark.parametrize("options, phrases", [
    (["--component", "transformer", "--vae", "some-vae.pt"], ["--vae goes into a pipeline"]),
    (["--model-name", "CogVideoX-5b-I2V"], ["--model-name and --base"]),
    (["--variant", "../elsewhere"], ["--variant", "file name"]),
])
def test_options_that_do_not_go_together(cli, tmp_path, sat_run, options, phrases):
    run, base = sat_run
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", base, *options], *phrases)


def test_incomplete_base_pipelines(cli, tmp_path, sat_run):
    import json
    import shutil

    from cogvideox_fixtures import tiny_pipeline

    run, _ = sat_run
    base = shutil.copytree(tiny_pipeline("i2v"), tmp_path / "pipeline")
    shutil.rmtree(base / "transformer")
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", base], "has no transformer config.json")
    base = shutil.copytree(tiny_pipeline("i2v"), tmp_path / "pipeline2")
    index = json.loads((base / "model_index.json").read_text())
    del index["tokenizer"]
    (base / "model_index.json").write_text(json.dumps(index))
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", base], "model_index.json has no tokenizer")


def test_a_base_folder_whose_only_model_is_in_a_subfolder_stands_for_it(cli, tmp_path, sat_run):
    run, base = sat_run
    (tmp_path / "wrapper").mkdir()
    os.rename(base, tmp_path / "wrapper" / "transformer")
    result = cli(run.run_dir, tmp_path / "out", "--base", tmp_path / "wrapper")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "out" / "config.json").is_file()


def test_a_base_folder_with_several_model_subfolders_names_them(cli, tmp_path, sat_run):
    run, base = sat_run
    (tmp_path / "wrapper").mkdir()
    shutil.copytree(base, tmp_path / "wrapper" / "transformer")
    shutil.copytree(base, tmp_path / "wrapper" / "transformer_2")
    assert_refused(cli, tmp_path, [run.run_dir, tmp_path / "out", "--base", tmp_path / "wrapper"],
                   "several model folders (transformer, transformer_2)", f"--base {tmp_path / 'wrapper' / 'transformer'}")
