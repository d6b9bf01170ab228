"""``cogexport verify`` asks each family's Diffusers single-file converter for a second opinion where Diffusers ships
one (LTX-Video, Mochi; HunyuanVideo at the release's width), and says plainly when that converter's hard-coded sizes
rule it out."""

from __future__ import annotations

import json

import pytest
from hunyuanvideo_fixtures import tiny_pipeline as hunyuanvideo_pipeline
from ltx_video_fixtures import tiny_pipeline as ltx_pipeline
from mochi_fixtures import tiny_pipeline as mochi_pipeline
from safetensors.torch import load_file, save_file

from cogexport.exporter import export_original


def original_and_export(cli, tmp_path, pipeline, *options):
    """The pipeline's transformer written back in the original layout (the source), then exported forward."""
    export_original(pipeline, tmp_path / "original", dtype="fp32", progress=False)
    (source,) = [path for path in (tmp_path / "original").iterdir() if path.suffix in (".safetensors", ".pt")]
    result = cli(source, tmp_path / "out", "--component", "transformer", *options)
    assert result.exit_code == 0, result.stderr
    return source, tmp_path / "out"


@pytest.mark.parametrize("family, judge, tensors", [
    ("ltx-video", "convert_ltx_transformer_checkpoint_to_diffusers", None),
    ("mochi", "convert_mochi_transformer_checkpoint_to_diffusers", 1071)])
def test_each_family_export_agrees_with_diffusers_own_converter(family, judge, tensors, cli, tmp_path):
    pipeline = ltx_pipeline() if family == "ltx-video" else mochi_pipeline()
    extra = () if family == "ltx-video" else ("--base", pipeline / "transformer")
    source, out = original_and_export(cli, tmp_path, pipeline, *extra)
    result = cli("verify", out, "--against", source, "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["reports"]
    assert report["ok"] and report["judge"] == judge and report["judge_mismatches"] == []
    assert report["judged"] == report["tensors"] == len(load_file(out / "diffusion_pytorch_model.safetensors"))
    assert tensors is None or report["tensors"] == tensors


def test_a_changed_export_is_caught_by_the_mochi_converter(cli, tmp_path):
    pipeline = mochi_pipeline()
    source, out = original_and_export(cli, tmp_path, pipeline, "--base", pipeline / "transformer")
    weights = out / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    tensors["transformer_blocks.47.norm1_context.linear_1.weight"] *= 2  # the last block's one-chunk modulation
    save_file(tensors, weights, metadata={"format": "pt"})
    result = cli("verify", out, "--against", source, "--json")
    assert result.exit_code == 1
    (report,) = json.loads(result.stdout)["reports"]
    assert any(line.startswith("transformer_blocks.47.norm1_context.linear_1.weight differs from what Diffusers' "
                               "convert_mochi_transformer_checkpoint_to_diffusers") for line in report["judge_mismatches"])


def test_hunyuanvideo_below_the_release_width_says_why_the_converter_was_not_asked(cli, tmp_path):
    pipeline = hunyuanvideo_pipeline("t2v")
    source, out = original_and_export(cli, tmp_path, pipeline, "--base", pipeline / "transformer")
    result = cli("verify", out, "--against", source)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert ("no second opinion: Diffusers' convert_hunyuan_video_transformer_to_diffusers was not asked: its code "
            "assumes the release's size (img_in.proj.bias of shape [3072])") in result.stdout
