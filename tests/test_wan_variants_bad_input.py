"""Bad input for Wan's variants: one line naming what is wrong and what to do, exit code 2, nothing written, the input
unchanged."""

from __future__ import annotations

import json

import pytest
from conftest import assert_refused
from wan_fixtures import tiny_wan_pipeline
from wan_variants_fixtures import tiny_config, tiny_variant_pipeline

from cogexport.exporter import export_original


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """Original-layout releases of tiny pipelines: Wan T2V, VACE, Animate, SkyReels-V2 diffusion forcing."""
    root = tmp_path_factory.mktemp("originals")
    export_original(tiny_wan_pipeline("t2v"), root / "wan-t2v", dtype="fp32")
    for variant in ("vace", "animate", "skyreels-df"):
        export_original(tiny_variant_pipeline(variant), root / variant, dtype="fp32")
    return root


def test_a_wan_model_is_no_vace_model(originals, tmp_path, cli):
    """A VACE pipeline needs the VACE branch: a plain Wan transformer with a VACE --base is refused, not exported
    half."""
    assert_refused(cli, tmp_path, [originals / "wan-t2v", tmp_path / "out", "--base", tiny_variant_pipeline("vace")],
                   "holds a Wan transformer, not a Wan VACE one; give a Wan --base", inputs=[originals])


def test_a_variant_with_a_base_of_another_family(originals, tmp_path, cli):
    assert_refused(cli, tmp_path, [originals / "skyreels-df", tmp_path / "out", "--base", tiny_wan_pipeline("t2v")],
                   "holds a SkyReels-V2 transformer, not a Wan one", inputs=[originals])
    assert_refused(cli, tmp_path, [originals / "animate", tmp_path / "out", "--base", tiny_variant_pipeline("vace")],
                   "holds a Wan Animate transformer, not a Wan VACE one", inputs=[originals])


def test_vace_base_hinting_other_layers(originals, tmp_path, cli):
    """Which blocks the VACE blocks hint is config, not weights: a --base hinting another number of layers is
    refused before anything is planned."""
    from diffusers import WanVACETransformer3DModel

    base = tmp_path / "base"
    WanVACETransformer3DModel.from_config({**tiny_config("vace"), "vace_layers": [0, 1, 2]}).save_config(base)
    assert_refused(cli, tmp_path, [originals / "vace", tmp_path / "out", "--base", base],
                   "has 2 VACE blocks, but the config it would go into hints 3 layers (vace_layers); check --base",
                   inputs=[originals])


def test_model_type_of_another_family(originals, tmp_path, cli):
    assert_refused(cli, tmp_path, ["--model-type", "t2v", originals / "vace", tmp_path / "out"],
                   "--model-type t2v is not a Wan VACE task", "(tasks: vace)", inputs=[originals])


def test_animate_with_face_adapters_that_do_not_divide_the_layers(originals, tmp_path, cli):
    """A truncated or mixed Animate checkpoint (3 face adapters for 4 layers) is named, not guessed at."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    weights = load_file(originals / "animate" / "diffusion_pytorch_model.safetensors")
    extra = {name.replace("fuser_blocks.1.", "fuser_blocks.2."): tensor.clone() for name, tensor in weights.items()
             if "fuser_blocks.1." in name}
    save_file({**weights, **extra}, broken / "diffusion_pytorch_model.safetensors")
    (broken / "config.json").write_text((originals / "animate" / "config.json").read_text())
    assert_refused(cli, tmp_path, [broken, tmp_path / "out"], "has 3 face adapters for 4 layers", inputs=[broken])


def test_skyreels_config_that_is_not_json(originals, tmp_path, cli):
    import shutil

    release = tmp_path / "release"
    shutil.copytree(originals / "skyreels-df", release)
    (release / "config.json").write_text("{not json")
    assert_refused(cli, tmp_path, [release, tmp_path / "out"], "config.json is not valid JSON", inputs=[release])
    assert json.loads((originals / "skyreels-df" / "config.json").read_text())["inject_sample_info"] is True
