"""Bad Wan input: one line naming what is wrong and what to do, exit code 2, nothing written, the input unchanged."""

from __future__ import annotations

import shutil

import pytest
from cogvideox_fixtures import tiny_pipeline as tiny_cogvideox_pipeline
from conftest import leftovers, snapshot
from wan_fixtures import EXPERTS, real_wan, tiny_wan_pipeline

from cogexport.to_original import export_original


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """Original-layout releases of the tiny pipelines (the A14B one as its two expert folders)."""
    root = tmp_path_factory.mktemp("originals")
    for variant in ("t2v", "i2v", "t2v-a14b"):
        export_original(tiny_wan_pipeline(variant), root / variant, dtype="fp32")
    return root


def run_refused(cli, tmp_path, inputs, *args) -> str:
    before = {path: snapshot(path) for path in inputs}
    result = cli(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert len(result.error_lines) == 1, result.stderr
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    assert all(snapshot(path) == state for path, state in before.items())
    return result.error_lines[0]


def test_model_type_that_contradicts_the_checkpoint(originals, tmp_path, cli):
    line = run_refused(cli, tmp_path, [originals], "--model-type", "i2v", originals / "t2v", tmp_path / "out")
    assert "is a Wan T2V model of unpublished size (in_channels 4) but --model-type i2v was given" in line
    line = run_refused(cli, tmp_path, [originals], "--model-type", "flf2v", originals / "i2v", tmp_path / "out")
    assert "Wan I2V model" in line and "--model-type flf2v" in line


def test_model_type_of_another_family(originals, tmp_path, cli):
    line = run_refused(cli, tmp_path, [originals], "--model-type", "ti2v", originals / "t2v", tmp_path / "out",
                       "--base", tiny_cogvideox_pipeline("t2v"))
    assert "holds a Wan transformer, not a CogVideoX one" in line


def test_cogvideox_base_with_a_wan_checkpoint(tmp_path, cli):
    real = real_wan()
    base = tiny_cogvideox_pipeline("t2v")
    line = run_refused(cli, tmp_path, [real, base], real / "original", tmp_path / "out", "--base", base)
    assert line.endswith("holds a Wan transformer, not a CogVideoX one; give a Wan --base (or none)")


def test_a14b_run_with_one_expert(originals, tmp_path, cli):
    run = tmp_path / "run"
    shutil.copytree(originals / "t2v-a14b" / EXPERTS[0], run / EXPERTS[0])
    line = run_refused(cli, tmp_path, [run], run, tmp_path / "out")
    assert f"holds {EXPERTS[0]} but not {EXPERTS[1]}" in line and "needs every expert" in line


def test_a14b_base_with_one_model(originals, tmp_path, cli):
    base = tiny_wan_pipeline("t2v-a14b")
    line = run_refused(cli, tmp_path, [originals, base], originals / "t2v", tmp_path / "out", "--base", base)
    assert "whose 2 experts" in line and "is one model" in line


@pytest.mark.parametrize("base_variant, expected", [("ti2v", "is a Wan2.2-TI2V-5B-layout TI2V model"),
                                                    ("i2v-a14b", "is a Wan2.2-I2V-A14B-layout I2V model")])
def test_wan21_checkpoint_with_a_wan22_base(base_variant, expected, originals, tmp_path, cli):
    base = tiny_wan_pipeline(base_variant)
    line = run_refused(cli, tmp_path, [originals, base], originals / "t2v", tmp_path / "out", "--base", base)
    assert "is a Wan T2V model (in_channels 4)" in line and expected in line
    assert "give the base the checkpoint was trained from" in line


@pytest.mark.parametrize("args", [[], ["--component", "vae"]])
def test_to_original_of_something_already_original(args, originals, tmp_path, cli):
    source = originals / "t2v"
    if args:
        export_original(tiny_wan_pipeline("t2v"), tmp_path / "vae", component="vae")
        source = tmp_path / "vae" / "Wan2.1_VAE.pth"
    line = run_refused(cli, tmp_path, [source], source, tmp_path / "out", "--to", "original", *args)
    assert "is already in the original Wan layout" in line and "without --to original" in line


def test_to_original_of_a_pipeline_component_it_cannot_write(tmp_path, cli):
    base = tiny_wan_pipeline("t2v")
    line = run_refused(cli, tmp_path, [base], base, tmp_path / "out", "--to", "original", "--component", "pipeline")
    assert "--to original writes a transformer or a VAE" in line
