"""A Diffusers model folder's weights are the files from_pretrained reads (diffusion_pytorch_model.safetensors, its
shards and index, its variant, its .bin), wherever cogexport reads such a folder: --base for a LoRA fused without its
base weights, a fine-tune given as the checkpoint, inspect. Any other weight file beside them is left alone and named
in a note; a folder with none of them but another weight file is refused, naming it (issue 40, item 3: a stray
ground_truth.safetensors in --base's transformer/ was fused into, silently). The model is the real tiny Wan 2.1 the
Wan repo's own class wrote, its LoRA the one musubi-tuner trained on it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from safetensors.torch import load_file, save_file
from wan_fixtures import REAL_WAN, TRUTH, real_wan_base, tiny_wan_pipeline

pytestmark = pytest.mark.skipif(not REAL_WAN.is_dir(), reason=f"the real Wan fixtures are not at {REAL_WAN}")

WEIGHTS = "diffusion_pytorch_model.safetensors"
LORA = REAL_WAN / "lora" / "a_musubi" / "wan21_t2v_lora_musubi.safetensors"


def truth() -> dict[str, torch.Tensor]:
    return load_file(REAL_WAN / "base" / "transformer" / TRUTH)


def other_weights() -> dict[str, torch.Tensor]:
    """Weights of the same names and shapes but other values: read by mistake, they would pass every shape check."""
    return {name: tensor + 1 for name, tensor in truth().items()}


def model_folder(where: Path, files: dict[str, dict[str, torch.Tensor]]) -> Path:
    """A Diffusers model folder: the real tiny Wan's config.json and the given safetensors files."""
    where.mkdir(parents=True)
    shutil.copyfile(real_wan_base() / "config.json", where / "config.json")
    for name, tensors in files.items():
        save_file(tensors, where / name)
    return where


def fused(cli, base: Path, out: Path):
    return cli(LORA, out, "--base", base, "--lora", "fuse", "--dtype", "fp32")


def test_fusing_into_a_base_folder_reads_its_weights_and_names_the_stray_file_beside_them(cli, tmp_path):
    clean = fused(cli, real_wan_base(), tmp_path / "clean")
    assert clean.exit_code == 0, clean.stderr
    base = model_folder(tmp_path / "base" / "transformer",
                        {WEIGHTS: truth(), "ground_truth.safetensors": other_weights()})
    result = fused(cli, base, tmp_path / "fused")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "fused" / WEIGHTS), load_file(tmp_path / "clean" / WEIGHTS))
    [note] = [line for line in result.stderr.splitlines() if "ground_truth.safetensors" in line]
    assert note.startswith("cogexport: note: ") and "from_pretrained does not read" in note and WEIGHTS in note


def test_a_base_folder_holding_no_diffusers_weights_but_another_file_is_refused_naming_it(cli, tmp_path):
    base = model_folder(tmp_path / "inputs" / "base" / "transformer", {"ground_truth.safetensors": truth()})
    assert_refused(cli, tmp_path, [LORA, tmp_path / "out", "--base", base, "--lora", "fuse"], str(base),
                   "ground_truth.safetensors", f"name it {WEIGHTS}", "no weight file from_pretrained reads",
                   inputs=[base])


def test_a_fine_tune_folder_given_as_the_checkpoint_is_refused_alike_and_inspect_says_why(cli, tmp_path):
    folder = model_folder(tmp_path / "inputs" / "finetune", {"ema.safetensors": truth()})
    assert_refused(cli, tmp_path, [folder, tmp_path / "out"], "ema.safetensors", "point at ema.safetensors",
                   inputs=[folder])
    report = cli("inspect", folder)
    assert report.exit_code == 1 and "ema.safetensors, which cogexport will not take" in report.stdout


@pytest.mark.parametrize("layout", ["variant", "shards", "bin"])
def test_the_weights_are_found_by_from_pretrained_names_and_the_stray_file_is_left_alone(cli, tmp_path, layout):
    """The folder's only variant (diffusion_pytorch_model.fp16.safetensors), shards and their index, or the .bin of
    older save_pretrained output: read, and the stray file beside them named in a note (export and inspect)."""
    weights, names = truth(), sorted(truth())
    if layout == "variant":
        folder = model_folder(tmp_path / "model", {"diffusion_pytorch_model.fp16.safetensors": weights})
    elif layout == "shards":
        half = {name: weights[name] for name in names[: len(names) // 2]}
        rest = {name: weights[name] for name in names[len(names) // 2:]}
        shards = {"diffusion_pytorch_model-00001-of-00002.safetensors": half,
                  "diffusion_pytorch_model-00002-of-00002.safetensors": rest}
        folder = model_folder(tmp_path / "model", shards)
        index = {"metadata": {}, "weight_map": {name: file for file, part in shards.items() for name in part}}
        (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    else:
        folder = model_folder(tmp_path / "model", {})
        torch.save(weights, folder / "diffusion_pytorch_model.bin")
    save_file(other_weights(), folder / "ground_truth.safetensors")
    result = cli(folder, tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), weights)
    assert "not read as its weights: ground_truth.safetensors" in result.stderr
    if layout != "bin":  # inspect describes a Diffusers folder of safetensors weights
        report = cli("inspect", folder)
        assert report.exit_code == 0 and "not read as its weights: ground_truth.safetensors" in report.stdout
        assert ", 2 shards" in report.stdout if layout == "shards" else "shards" not in report.stdout


def test_the_file_cogexport_keeps_beside_a_model_is_no_stray(cli, tmp_path):
    """per_channel_statistics.safetensors (the tensors LTX-2's VAE class has no place for, kept_beside.py) belongs to
    the folder as cogexport writes it: no note, while a stray file beside it still gets one."""
    folder = model_folder(tmp_path / "model", {WEIGHTS: truth(), "per_channel_statistics.safetensors": other_weights()})
    result = cli(folder, tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0 and "note" not in result.stderr, result.stderr
    save_file(other_weights(), folder / "ema.safetensors")
    result = cli(folder, tmp_path / "out2", "--dtype", "fp32")
    assert "not read as its weights: ema.safetensors beside them" in result.stderr


def test_a_vae_folder_given_as_vae_is_read_by_the_same_names(cli, tmp_path):
    """--vae with a Diffusers VAE folder: a stray file beside its weights is named; alone, it is refused."""
    pipeline = tiny_wan_pipeline("t2v")
    vae = tmp_path / "inputs" / "vae"
    vae.mkdir(parents=True)
    shutil.copyfile(pipeline / "vae" / "config.json", vae / "config.json")
    shutil.copyfile(pipeline / "vae" / WEIGHTS, vae / "ema.safetensors")
    args = [pipeline / "transformer", tmp_path / "out", "--base", pipeline, "--vae", vae]
    assert_refused(cli, tmp_path, args, str(vae), "ema.safetensors", "no weight file from_pretrained reads",
                   inputs=[vae])
    shutil.copyfile(pipeline / "vae" / WEIGHTS, vae / WEIGHTS)
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    assert f"{vae} is a Diffusers model folder (AutoencoderKLWan): read its weights {WEIGHTS}" in result.stderr


def test_several_variants_and_no_plain_weights_are_refused_each_named(cli, tmp_path):
    """from_pretrained would need to be told the variant; cogexport will not pick one (before, the two files were two
    candidates, and a sharded variant beside a single-file one was left out of the choice)."""
    folder = model_folder(tmp_path / "inputs" / "model", {"diffusion_pytorch_model.fp16.safetensors": truth(),
                                                          "diffusion_pytorch_model.bf16.safetensors": other_weights()})
    assert_refused(cli, tmp_path, [folder, tmp_path / "out"], "several variants of its weights and no plain ones",
                   "bf16: diffusion_pytorch_model.bf16.safetensors; fp16: diffusion_pytorch_model.fp16.safetensors",
                   inputs=[folder])
    result = cli(folder / "diffusion_pytorch_model.fp16.safetensors", tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), truth())
