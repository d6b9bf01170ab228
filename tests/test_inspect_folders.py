"""`cogexport inspect` describes the folders cogexport writes (a pipeline folder, a model folder), as text and --json,
with what the model card says produced them."""

from __future__ import annotations

import json
import shutil

from wan_fixtures import tiny_wan_pipeline


def test_inspect_describes_a_pipeline_folder_cogexport_wrote(cli, tmp_path):
    base = tiny_wan_pipeline("t2v")
    assert cli(base / "transformer", tmp_path / "out", "--base", base, "--variant", "bf16").exit_code == 0
    text = cli("inspect", tmp_path / "out")
    assert text.exit_code == 0, text.stderr
    assert "diffusers pipeline (WanPipeline)" in text.stdout and "usable    yes" not in text.stdout
    assert "made by       cogexport: cogexport " in text.stdout and "\nusable        yes" in text.stdout
    report = json.loads(cli("inspect", tmp_path / "out", "--json").stdout)
    transformer = report["components"]["transformer"]
    assert (report["kind"], report["class"], transformer["class"], transformer["family"]) == \
        ("diffusers pipeline", "WanPipeline", "WanTransformer3DModel", "Wan")
    assert transformer["variant"] == "bf16" and transformer["dtypes"] == {"bf16": 58, "fp32": 11}
    assert transformer["model"] == "custom-size Wan (Wan2.1-T2V-1.3B layout)"
    assert report["components"]["text_encoder"] == {"library": "transformers", "class": "UMT5EncoderModel"}
    assert report["card"]["made_by"] == "cogexport" and report["card"]["command"].startswith("cogexport ")
    assert report["usable"] and report["problems"] == []


def test_inspect_describes_one_model_folder(cli, tmp_path):
    base = tiny_wan_pipeline("t2v")
    report = json.loads(cli("inspect", base / "vae", "--json").stdout)
    assert (report["kind"], report["class"], report["family"], report["tensors"]) == \
        ("diffusers model", "AutoencoderKLWan", "Wan", 194)
    assert report["usable"] and report["card"] == {}


def test_a_pipeline_folder_missing_a_component_is_not_usable(cli, tmp_path):
    shutil.copytree(tiny_wan_pipeline("t2v"), tmp_path / "pipe")
    shutil.rmtree(tmp_path / "pipe" / "vae")
    result = cli("inspect", tmp_path / "pipe")
    assert result.exit_code == 1
    assert "problem       vae/ is missing, which model_index.json names" in result.stdout
