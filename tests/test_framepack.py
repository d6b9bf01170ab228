"""HunyuanVideo FramePack: the release folder holds diffusers_helper's HunyuanVideoTransformer3DModelPacked, whose names
are Diffusers' own (the tiny models check it against that class's module tree, written out in
scripts/framepack_tiny.py); the work is recognition (FramePack, never HunyuanVideo, and back), the Packed config.json
read beside the weights, the published configs, the forward of the exported model, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from diffusers import HunyuanVideoFramepackTransformer3DModel
from framepack_fixtures import (PACKED_CLASS, build_tiny_transformer, config_folder, forward_inputs, packed_shapes,
                                release_folder, single_file, tiny_pipeline)
from safetensors.torch import load_file

from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.keymap.plan import translate_shapes
from cogexport.keymap.table import load_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables
from cogexport.models.target import build_target
from cogexport.precision import PrecisionPolicy

FAMILY = family_named("framepack")
WEIGHTS = "diffusion_pytorch_model.safetensors"


def test_the_release_names_are_diffusers_names():
    """lllyasviel's Packed class (its module tree written out) names every tensor as Diffusers' class does, at tiny
    size and at the released size."""
    model = build_tiny_transformer()
    assert {n: t.shape for n, t in model.state_dict().items()} == packed_shapes(dict(model.config))
    config = FAMILY.transformer_config(FAMILY.variants[0])
    assert build_target(FAMILY.transformer.class_name, config).schema == packed_shapes(config)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = build_tiny_transformer(seed=3)
    folder = release_folder(tmp_path_factory.mktemp("framepack") / "FramePackI2V_HY", model)
    return model, folder


def test_release_folder_exports_as_save_pretrained_byte_for_byte(tiny, cli, tmp_path):
    """The sharded release folder with its Packed config.json (no --base: the config beside it says the size) to a
    Diffusers folder: save_pretrained of the same weights in the family's dtype policy, byte for byte."""
    model, release = tiny
    assert json.loads((release / "config.json").read_text())["_class_name"] == PACKED_CLASS
    result = cli(release, tmp_path / "ours")
    assert result.exit_code == 0, result.stderr
    assert "HunyuanVideo FramePack" in result.stdout
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    reference = HunyuanVideoFramepackTransformer3DModel.from_config(model.config)
    reference.load_state_dict({n: t.to(policy.target_dtype(n, t.dtype)) for n, t in model.state_dict().items()},
                              assign=True)
    reference.save_pretrained(tmp_path / "theirs")
    ours = sorted(p.name for p in (tmp_path / "ours").iterdir() if p.name != "README.md")
    assert ours == sorted(p.name for p in (tmp_path / "theirs").iterdir())
    for name in ours:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name


def test_a_release_folder_exports_without_importing_diffusers_once_remembered(tiny, tmp_path):
    """Reading the Packed config.json checks its arguments against Diffusers' class's from the cache of what the class
    tells: a second export of the release folder imports no Diffusers (importing it took longer than copying the
    benchmark's 1.8 GB) and writes the same bytes."""
    from conftest import command_in_fresh_process, folder_bytes

    _, release = tiny
    cache = str(tmp_path / "cache")
    assert "diffusers" in command_in_fresh_process([release, tmp_path / "first"], cache)["imported"]
    assert command_in_fresh_process([release, tmp_path / "again"], cache)["imported"] == []
    assert folder_bytes(tmp_path / "again") == folder_bytes(tmp_path / "first")


def test_single_file_exports_exactly_and_runs_the_same_forward(tiny, cli, tmp_path):
    """The single-file repack (here under ComfyUI's diffusion_model. prefix) in fp32: exactly the model's tensors,
    and Diffusers' model loaded from the export gives the source model's output to the bit."""
    model, release = tiny
    path = single_file(tmp_path / "single", {f"diffusion_model.{n}": t for n, t in model.state_dict().items()})
    result = cli(path, tmp_path / "out", "--base", config_folder(tmp_path / "base", model), "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), model.state_dict())
    exported = HunyuanVideoFramepackTransformer3DModel.from_pretrained(tmp_path / "out").eval()
    inputs = forward_inputs(model)
    with torch.no_grad():
        assert torch.equal(exported(**inputs).sample, model(**inputs).sample)


def test_pipeline_folder_loads_and_renders(cli, tmp_path):
    """The release folder with --base a tiny HunyuanVideoFramepackPipeline: the pipeline Diffusers loads (the text
    encoders, SigLIP image encoder and its processor, VAE linked), which renders frames from an image."""
    from diffusers import HunyuanVideoFramepackPipeline
    from hunyuanvideo_fixtures import TINY_PROMPT_TEMPLATE
    from render_pipeline import gradient_image

    base = tiny_pipeline()
    model = HunyuanVideoFramepackTransformer3DModel.from_pretrained(base / "transformer")
    result = cli(release_folder(tmp_path / "release", model), tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "model_index.json").read_text()) == \
        json.loads((base / "model_index.json").read_text())
    scheduler = json.loads((tmp_path / "out" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "FlowMatchEulerDiscreteScheduler" and scheduler["shift"] == 7.0
    pipe = HunyuanVideoFramepackPipeline.from_pretrained(tmp_path / "out")
    assert_same_tensors(pipe.transformer.state_dict(), model.state_dict())
    frames = pipe(image=gradient_image(32, 32), prompt="a cat", height=32, width=32, num_frames=9,
                  latent_window_size=2, num_inference_steps=2, output_type="np", max_sequence_length=8,
                  prompt_template=TINY_PROMPT_TEMPLATE, generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape[2:] == (32, 32, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())
    assert frames.std() > 0


# -- variants at full size (meta tensors: nothing is allocated) ------------------------------------------------------
def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


def full_size() -> dict[str, LazyTensor]:
    config = FAMILY.transformer_config(FAMILY.variants[0])
    return {name: LazyTensor(shape, torch.bfloat16, _never_read) for name, shape in packed_shapes(config).items()}


@pytest.mark.parametrize("options, name", [
    ({}, "FramePackI2V_HY"),
    ({"model_name": "FramePack_F1_I2V_HY_20250503"}, "FramePack_F1_I2V_HY_20250503"),
])
def test_published_variants_are_read_off_the_shapes(options, name):
    transformer = plan_transformer(full_size(), ExportOptions(**options), "meta")
    assert transformer.variant.name == name and transformer.published and transformer.label == name
    assert len(transformer.tensors) == 1274
    built = dict(transformer.target.config)
    assert (built["has_image_proj"], built["image_proj_dim"], built["has_clean_x_embedder"]) == (True, 1152, True)


def test_tables_never_match_another_familys_keys():
    """FramePack's names fit its table alone (HunyuanVideo's Diffusers table, whose names they extend, excludes
    FramePack's modules), and its table takes none of another family's layouts."""
    ours = list(full_size())
    fitting = fitting_tables(ours, component_tables("transformer") + component_tables("vae"))
    assert [table.name for _, table in fitting] == ["framepack/transformer"]
    for other in families():
        if other.key == FAMILY.key:
            continue
        config = other.transformer_config(other.variants[0])
        target = build_target(other.transformer.class_name, config)
        for name in other.transformer.tables:
            keys = list(translate_shapes(load_table(name).inverted(), target.schema, target.counts))
            assert fitting_tables(keys, component_tables("transformer", FAMILY)) == [], name


# -- bad input -------------------------------------------------------------------------------------------------------
def test_bad_framepack_input(tiny, cli, tmp_path):
    model, release = tiny
    hunyuanvideo = build_tiny_transformer(has_image_proj=False, has_clean_x_embedder=False)
    plain = config_folder(tmp_path / "plain", hunyuanvideo)
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--base", plain], "has an image projection",
                   "has_image_proj False", inputs=[release])
    weights = dict(model.state_dict())
    del weights["clean_x_embedder.proj_2x.bias"]
    broken = single_file(tmp_path / "broken", weights)
    assert_refused(cli, tmp_path, [broken, tmp_path / "out", "--base", config_folder(tmp_path / "b", model)],
                   "clean_x_embedder.proj_2x.bias")
    odd = release_folder(tmp_path / "odd", model)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "teacache_threshold": 0.15}))
    assert_refused(cli, tmp_path, [odd, tmp_path / "out"], "teacache_threshold",
                   "HunyuanVideoFramepackTransformer3DModel does not take", inputs=[odd])
