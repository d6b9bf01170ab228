"""scripts/benchmark_minimax_h3.py at a tiny size: the release it makes in each layout (the partition's shards, index
and config.json; the Comfy-Org single file) is read by cogexport and by its reference path (Diffusers' single-file
converter told the layout's qkv order) into the same model, which the benchmark's comparison accepts; and told the
other order, the reference writes a model the comparison refuses (so it compares what the row order changes)."""

from __future__ import annotations

import sys

import click
import pytest
from fixtures import SCRIPTS
from minimax_h3_fixtures import diffusers_config

from cogexport.exporter import export

sys.path.insert(0, str(SCRIPTS))
from benchmark_minimax_h3 import CLASS, layout_reference, write_release  # noqa: E402
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
