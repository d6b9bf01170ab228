"""Bad Wan input: one line naming what is wrong and what to do, exit code 2, nothing written, the input unchanged."""

from __future__ import annotations

import shutil

import pytest
from cogvideox_fixtures import tiny_pipeline as tiny_cogvideox_pipeline
from conftest import assert_refused
from wan_fixtures import EXPERTS, real_wan, tiny_wan_pipeline

from cogexport.exporter import export_original


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """Original-layout releases of the tiny pipelines (the A14B one as its two expert folders)."""
    root = tmp_path_factory.mktemp("originals")
    for variant in ("t2v", "i2v", "t2v-a14b"):
        export_original(tiny_wan_pipeline(variant), root / variant, dtype="fp32")
    return root


def test_model_type_that_contradicts_the_checkpoint(originals, tmp_path, cli):
    assert_refused(cli, tmp_path, ["--model-type", "i2v", originals / "t2v", tmp_path / "out"],
                   "is a Wan T2V model of unpublished size (in_channels 4) but --model-type i2v was given",
                   inputs=[originals])
    assert_refused(cli, tmp_path, ["--model-type", "flf2v", originals / "i2v", tmp_path / "out"], "Wan I2V model",
                   "--model-type flf2v", inputs=[originals])


def test_model_type_of_another_family(originals, tmp_path, cli):
    assert_refused(cli, tmp_path, ["--model-type", "ti2v", originals / "t2v", tmp_path / "out", "--base",
                                   tiny_cogvideox_pipeline("t2v")],
                   "holds a Wan transformer, not a CogVideoX one", inputs=[originals])


def test_cogvideox_base_with_a_wan_checkpoint(tmp_path, cli):
    real = real_wan()
    base = tiny_cogvideox_pipeline("t2v")
    line = assert_refused(cli, tmp_path, [real / "original", tmp_path / "out", "--base", base],
                          inputs=[real, base])
    assert line.endswith("holds a Wan transformer, not a CogVideoX one; give a Wan --base (or none)")


def test_a14b_run_with_one_expert(originals, tmp_path, cli):
    run = tmp_path / "run"
    shutil.copytree(originals / "t2v-a14b" / EXPERTS[0], run / EXPERTS[0])
    assert_refused(cli, tmp_path, [run, tmp_path / "out"], f"holds {EXPERTS[0]} but not {EXPERTS[1]}",
                   "needs every expert")


def test_a14b_base_with_one_model(originals, tmp_path, cli):
    base = tiny_wan_pipeline("t2v-a14b")
    assert_refused(cli, tmp_path, [originals / "t2v", tmp_path / "out", "--base", base], "whose 2 experts",
                   "is one model", inputs=[originals, base])


@pytest.mark.parametrize("base_variant, expected", [("ti2v", "is a Wan2.2-TI2V-5B-layout TI2V model"),
                                                    ("i2v-a14b", "is a Wan2.2-I2V-A14B-layout I2V model")])
def test_wan21_checkpoint_with_a_wan22_base(base_variant, expected, originals, tmp_path, cli):
    base = tiny_wan_pipeline(base_variant)
    assert_refused(cli, tmp_path, [originals / "t2v", tmp_path / "out", "--base", base],
                   "is a Wan T2V model (in_channels 4)", expected, "give the base the checkpoint was trained from",
                   inputs=[originals, base])


@pytest.mark.parametrize("args", [[], ["--component", "vae"]])
def test_to_original_of_something_already_original(args, originals, tmp_path, cli):
    source = originals / "t2v"
    if args:
        export_original(tiny_wan_pipeline("t2v"), tmp_path / "vae", component="vae")
        source = tmp_path / "vae" / "Wan2.1_VAE.pth"
    assert_refused(cli, tmp_path, [source, tmp_path / "out", "--to", "original", *args],
                   "is already in the original Wan layout", "without --to original", inputs=[source])


def test_to_original_of_a_pipeline_component_it_cannot_write(tmp_path, cli):
    base = tiny_wan_pipeline("t2v")
    assert_refused(cli, tmp_path, [base, tmp_path / "out", "--to", "original", "--component", "pipeline"],
                   "--to original writes a transformer or a VAE", inputs=[base])
