"""Cosmos Predict 2 / 2.5's VAE is Wan 2.1's (Diffusers' converter takes Wan2.1-T2V-1.3B-Diffusers' vae as it is):
the Cosmos family lists Wan's tables by slash name (wan/original_vae, wan/diffusers_vae). With a Cosmos pipeline as
--base, a Wan2.1_VAE.pth is exported by those tables (the export says Cosmos) and judged by Diffusers' own converter of
the 2.1 layout (convert_wan_vae_to_diffusers), fp32 compared with torch.equal. The way back from a Cosmos pipeline's
vae/ is written by Wan, the owner of its class (the same table), and judged by the same converter."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from fixtures import SCRIPTS
from wan_fixtures import build_tiny_vae, diffusers_reads_original_vae, same_files, weights

from cogexport.exporter import export, export_original

sys.path.insert(0, str(SCRIPTS))
from make_tiny_cosmos import tiny_config  # noqa: E402


@pytest.fixture(scope="module")
def cosmos_base(tmp_path_factory):
    """A Cosmos Predict 2.5 pipeline folder's configs (model_index.json, transformer/, vae/) and the tiny Wan 2.1 VAE
    saved in it (the VAE's weights: what the export must give back)."""
    from diffusers import CosmosTransformer3DModel

    base = tmp_path_factory.mktemp("cosmos-base")
    with torch.device("meta"):
        CosmosTransformer3DModel.from_config(tiny_config("2.5")).save_config(base / "transformer")
    build_tiny_vae("2.1", seed=7).save_pretrained(base / "vae")
    (base / "model_index.json").write_text(json.dumps({
        "_class_name": "Cosmos2_5_PredictBasePipeline",
        "transformer": ["diffusers", "CosmosTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLWan"]}))
    return base


@pytest.fixture(scope="module")
def original_vae(cosmos_base, tmp_path_factory):
    """The pipeline's VAE written back to Wan's original layout (the file the forward test reads). The folder's VAE
    is an AutoencoderKLWan, Wan's class, whose family writes it: the same table the Cosmos family lists."""
    out = tmp_path_factory.mktemp("cosmos-vae-original")
    export_original(cosmos_base, out / "original", component="vae")
    return out / "original" / "Wan2.1_VAE.pth"


def test_a_cosmos_pipelines_vae_goes_back_to_a_file_diffusers_converter_reads(cosmos_base, original_vae):
    assert sorted(p.name for p in original_vae.parent.iterdir()) == ["README.md", "Wan2.1_VAE.pth"]
    converted = diffusers_reads_original_vae(torch.load(original_vae, weights_only=True))
    expected = weights(cosmos_base / "vae")
    assert set(converted) == set(expected)
    assert all(converted[n].dtype == torch.float32 and torch.equal(converted[n], t) for n, t in expected.items())


def test_wan21_vae_file_exports_as_diffusers_converter_reads_it(cosmos_base, original_vae, tmp_path):
    result = export(original_vae, tmp_path / "vae", component="vae", base=cosmos_base)
    assert result.family == "Cosmos"
    judged = diffusers_reads_original_vae(torch.load(original_vae, weights_only=True))
    ours = weights(tmp_path / "vae")
    assert set(ours) == set(judged)
    assert all(ours[n].dtype == torch.float32 and torch.equal(ours[n], t) for n, t in judged.items())
    assert same_files(tmp_path / "vae", cosmos_base / "vae") == []  # save_pretrained's bytes, config included
