"""scripts/benchmark_minimax_h3.py at a tiny size: the release it makes in each layout (the partition's shards, index
and config.json; the Comfy-Org single file) is read by cogexport and by its reference path (Diffusers' single-file
converter told the layout's qkv order; for the release, Diffusers' conversion script too) into the same model, which
the benchmark's comparison accepts; and told the other order, the reference writes a model the comparison refuses (so
it compares what the row order changes)."""

from __future__ import annotations

import json
import sys

import click
import pytest
from fixtures import SCRIPTS
from minimax_h3_fixtures import diffusers_config

from cogexport.exporter import export

sys.path.insert(0, str(SCRIPTS))
from benchmark_cosmos import extract_source  # noqa: E402
from benchmark_minimax_h3 import (CLASS, CONVERSION_SCRIPT, DEFAULT_DIFFUSERS_REPO,  # noqa: E402
                                  conversion_script_export, layout_reference, write_release)
from single_file_benchmark import compare_outputs, meta_model, parameter_count, reference_export  # noqa: E402


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minimax-h3-bench-config")
    meta_model(CLASS, diffusers_config()).save_config(folder)
    return folder


@pytest.mark.parametrize("layout", ["release", "comfy"])
def test_both_tools_read_the_benchmarks_release_into_the_same_model(layout, config_dir, tmp_path):
    release, weights = write_release(tmp_path / "release", layout, diffusers_config(), shard_size="20kB")
    if layout == "release":  # in several shards, as the release is, beside their index and config.json
        assert len(weights) > 1 and (release / "model.safetensors.index.json").is_file()
    base = {"base": config_dir, "component": "transformer"} if layout == "comfy" else {}
    export(release, tmp_path / "cogexport", **base)
    layout_reference(layout)(release, config_dir, tmp_path / "reference")
    checked = compare_outputs(tmp_path / "cogexport", tmp_path / "reference")
    assert checked["numel"] == parameter_count(meta_model(CLASS, diffusers_config()))
    assert checked["kept_fp32"] > 0  # the release's fp32 tensors, kept by cogexport, rounded by the reference


def test_the_comparison_sees_the_other_qkv_order(config_dir, tmp_path):
    """The Comfy-Org file read as stacked by cogexport, and by Diffusers told it is interleaved: refused."""
    import torch

    release, _ = write_release(tmp_path / "release", "comfy", diffusers_config())
    export(release, tmp_path / "cogexport", base=config_dir, component="transformer")
    model = getattr(__import__("diffusers"), CLASS).from_single_file(
        str(release), config=str(config_dir), qkv_layout="interleaved", torch_dtype=torch.bfloat16,
        local_files_only=True)
    model.save_pretrained(tmp_path / "reference")
    with pytest.raises(click.ClickException, match=r"attn.to_q.weight: values differ"):
        compare_outputs(tmp_path / "cogexport", tmp_path / "reference")
    reference_export(release, CLASS, config_dir, tmp_path / "stacked")  # the script's comfy reference: equal
    compare_outputs(tmp_path / "cogexport", tmp_path / "stacked")


@pytest.mark.skipif(not DEFAULT_DIFFUSERS_REPO.exists(),
                    reason="Diffusers' repository (its conversion script) is not on this machine")
def test_the_conversion_scripts_row_writes_the_same_model_keeping_fp32(config_dir, tmp_path):
    """The release layout's second reference: Diffusers' conversion script streams the partition into the model
    cogexport writes, the release's fp32 tensors kept fp32 by both (compared as they are, not rounded)."""
    import shutil

    from safetensors import safe_open

    release, _ = write_release(tmp_path / "release", "release", diffusers_config(), shard_size="20kB")
    config = shutil.copytree(config_dir, tmp_path / "config")
    source = extract_source(DEFAULT_DIFFUSERS_REPO, CONVERSION_SCRIPT, tmp_path / "sources")
    (config / "conversion-script.json").write_text(json.dumps(source))
    export(release, tmp_path / "cogexport")
    conversion_script_export(release, config, tmp_path / "script")
    checked = compare_outputs(tmp_path / "cogexport", tmp_path / "script")
    assert checked["kept_fp32"] > 0
    index = json.loads((tmp_path / "script" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    shard = tmp_path / "script" / index["weight_map"]["proj_in.weight"]
    with safe_open(shard, framework="pt") as handle:
        assert str(handle.get_slice("proj_in.weight").get_dtype()) == "F32"
