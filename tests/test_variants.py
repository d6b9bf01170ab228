"""The five published variants are told apart from real-size shapes alone (meta tensors: nothing is allocated), get
their published configs, and a wrong --model-type is named."""

from __future__ import annotations

import json

import pytest
import torch
from cogvideox_fixtures import SCRIPTS  # noqa: F401  (puts scripts/ on sys.path)
from make_sat_checkpoint import full_size_sat_meta

from cogexport.errors import CogExportError
from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.lazy import LazyTensor
from cogexport.models.family import family_named
from cogexport.models.target import build_target
from cogexport.keymap.plan import translate_shapes
from cogexport.keymap.table import load_table

COGVIDEOX = family_named("cogvideox")
EXPECTED = {
    "2b": ("CogVideoX-2b", 30, 1920, "t2v", 3.0, 1.15258426, False, (60, 90, 49)),
    "5b": ("CogVideoX-5b", 42, 3072, "t2v", 1.0, 0.7, False, (60, 90, 49)),
    "5b-i2v": ("CogVideoX-5b-I2V", 42, 3072, "i2v", 1.0, 0.7, False, (60, 90, 49)),
    "1.5-5b": ("CogVideoX1.5-5B", 42, 3072, "t2v", 1.0, 0.7, True, (300, 300, 81)),
    "1.5-5b-i2v": ("CogVideoX1.5-5B-I2V", 42, 3072, "i2v", 1.0, 0.7, True, (300, 300, 81)),
}


def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


def meta_checkpoint(variant: str) -> dict[str, LazyTensor]:
    """A full-size SAT engine as lazy tensors that fail if read."""
    return {f"model.diffusion_model.{name}": LazyTensor(t.shape, torch.bfloat16, _never_read)
            for name, t in full_size_sat_meta(variant).items()}


@pytest.mark.parametrize("short", EXPECTED)
def test_published_variant_is_read_off_the_shapes(short):
    name, layers, hidden, model_type, shift, scaling, invert, sample = EXPECTED[short]
    transformer = plan_transformer(meta_checkpoint(short), ExportOptions(), "meta")
    variant = transformer.variant
    assert variant.name == name and variant.task == model_type
    assert transformer.published and transformer.label == name
    config = transformer.target.config
    assert (config["num_layers"], config["num_attention_heads"] * config["attention_head_dim"]) == (layers, hidden)
    assert (config["sample_height"], config["sample_width"], config["sample_frames"]) == sample
    assert len(transformer.tensors) == len(transformer.target.schema)
    assert COGVIDEOX.scheduler_for(variant)["snr_shift_scale"] == shift
    vae = build_target("AutoencoderKLCogVideoX", COGVIDEOX.vae_config(variant)).config
    assert (vae["scaling_factor"], vae["invert_scale_latents"]) == (scaling, invert)


def test_key_counts_match_the_published_models():
    counts = {short: len(plan_transformer(meta_checkpoint(short), ExportOptions(), "meta").tensors)
              for short in EXPECTED}
    assert counts == {"2b": 736, "5b": 1024, "5b-i2v": 1025, "1.5-5b": 1024, "1.5-5b-i2v": 1028}


@pytest.mark.parametrize("short, wrong", [("5b-i2v", "t2v"), ("1.5-5b", "i2v")])
def test_wrong_model_type_names_the_variant(short, wrong):
    name = EXPECTED[short][0]
    with pytest.raises(CogExportError, match=f"checkpoint is {name} .* but --model-type {wrong} was given"):
        plan_transformer(meta_checkpoint(short), ExportOptions(model_type=wrong), "meta")


def test_a_2b_sat_file_with_a_frozen_position_table_stays_2b():
    """CogVideo's 1.0 sin-cos mixin keeps pos_embedding as a frozen parameter: it must not make the file I2V."""
    checkpoint = meta_checkpoint("2b")
    checkpoint["model.diffusion_model.mixins.pos_embed.pos_embedding"] = LazyTensor(
        torch.Size([1, 17776, 1920]), torch.bfloat16, _never_read)
    transformer = plan_transformer(checkpoint, ExportOptions(), "meta")
    variant = transformer.variant
    assert variant.name == "CogVideoX-2b"
    assert "model.diffusion_model.mixins.pos_embed.pos_embedding" in transformer.plan.dropped


def test_vae_key_count_at_full_size():
    target = build_target("AutoencoderKLCogVideoX", COGVIDEOX.vae_config(COGVIDEOX.variant_named("CogVideoX-5b")))
    assert len(target.schema) == 436 and target.counts["num_up_blocks"] == 4
    shapes = translate_shapes(load_table("cogvideox/sat_transformer"), {"transformer.final_layernorm.weight": torch.Size([8])})
    assert shapes == {"norm_final.weight": torch.Size([8])}
    assert json.dumps(COGVIDEOX.scheduler_for(COGVIDEOX.variant_named("CogVideoX-2b")))  # plain JSON values


def test_model_type_help_names_every_familys_tasks():
    from click.testing import CliRunner

    from cogexport.cli import main
    from cogexport.models.family import families

    text = " ".join(CliRunner().invoke(main, ["export", "--help"]).stdout.split()).replace("- ", "-")  # unwrap
    for family in families():
        assert f"{family.name} {'|'.join(family.tasks)}" in text, family.name
