"""MiniMax-H3's release folder as one input (family.toml's [release]): a tiny MiniMaxAI/MiniMax-H3 root, FL2VA/ and
Ref2VA/ each holding a transformer partition DiffSynth-Studio's MiniMaxH3DiT wrote and the same video and audio VAE
files, exported into the modular pipeline in one run (equal to exporting each part alone), loaded by Diffusers'
ModularPipeline, and written back from the pipeline folder as the whole root, byte for byte. Two partitions whose VAEs
differ are refused; a root holding one partition exports it with a note."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from minimax_h3_fixtures import diffsynth_model, release_dtypes, release_partition
from minimax_h3_vae_fixtures import diffsynth_video_vae, release_video_vae_state
from safetensors.torch import load_file, save_file
from test_minimax_h3_pipeline import PIPELINE_AUDIO_VAE, modular_base

WEIGHTS = "diffusion_pytorch_model.safetensors"
VIDEO_VAE_FILE = "video_vae/source/model.safetensors"
AUDIO_VAE_FILE = "audio_vae/model.safetensors"
MODELS = ("transformer", "transformer_ref", "vae", "audio_vae")


def _audio_vae_state(seed: int) -> dict[str, torch.Tensor]:
    from diffusers import AutoencoderKLMiniMaxH3Audio

    model = AutoencoderKLMiniMaxH3Audio(**PIPELINE_AUDIO_VAE)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return model.state_dict()


def release_root(root: Path, partitions: dict[str, int]) -> Path:
    """The release's folder: each partition (name -> the seed of its transformer) with its transformer shards and
    config.json, and the same video and audio VAE files in each (saved once, copied)."""
    vaes = root.parent / f"{root.name}-vaes"
    if not vaes.exists():
        (vaes / "video_vae" / "source").mkdir(parents=True)
        (vaes / "audio_vae").mkdir()
        save_file(release_video_vae_state(diffsynth_video_vae(seed=3)), vaes / VIDEO_VAE_FILE,
                  metadata={"format": "pt"})
        save_file(_audio_vae_state(seed=5), vaes / AUDIO_VAE_FILE, metadata={"format": "pt"})
    for name, seed in partitions.items():
        release_partition(root / name / "transformer", release_dtypes(diffsynth_model(seed=seed).state_dict()))
        for file in (VIDEO_VAE_FILE, AUDIO_VAE_FILE):
            (root / name / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(vaes / file, root / name / file)
    return root


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> dict:
    """The root exported with --base in one run, and each of its parts exported alone as before."""
    from click.testing import CliRunner

    from cogexport.cli import main

    def run(*args) -> None:
        result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr

    folder = tmp_path_factory.mktemp("minimax_h3_root")
    root, base = release_root(folder / "MiniMax-H3", {"FL2VA": 9, "Ref2VA": 10}), modular_base(folder / "base")
    run(root, folder / "out", "--base", base)
    alone = folder / "alone"
    run(root / "FL2VA" / "transformer", alone / "transformer", "--base", base, "--component", "transformer")
    run(root / "Ref2VA" / "transformer", alone / "transformer_ref", "--base", base / "transformer_ref",
        "--model-type", "ref2va")
    run(root / "FL2VA" / VIDEO_VAE_FILE, alone / "vae", "--base", base, "--component", "vae")
    run(root / "FL2VA" / AUDIO_VAE_FILE, alone / "audio_vae", "--base", base, "--component", "audio_vae")
    return {"root": root, "base": base, "out": folder / "out", "alone": alone}


def test_the_release_in_one_run_is_its_partitions_and_vaes_exported_one_at_a_time(release):
    out, alone, base = release["out"], release["alone"], release["base"]
    for name in MODELS:
        ours, theirs = load_file(out / name / WEIGHTS), load_file(alone / name / WEIGHTS)
        assert list(ours) == list(theirs) and all(torch.equal(ours[n], theirs[n]) for n in theirs), name
        assert json.loads((out / name / "config.json").read_text()) == \
            json.loads((alone / name / "config.json").read_text()), name
    # the two transformers are the two partitions' (not one model twice), and the VAEs are the release's, not --base's
    assert not torch.equal(load_file(out / "transformer" / WEIGHTS)["proj_in.weight"],
                           load_file(out / "transformer_ref" / WEIGHTS)["proj_in.weight"])
    for name in ("vae", "audio_vae"):
        assert not (out / name).is_symlink() and \
            (out / name / WEIGHTS).read_bytes() != (base / name / WEIGHTS).read_bytes(), name
    for name in ("modular_model_index.json", "model_index.json"):
        assert (out / name).read_bytes() == (base / name).read_bytes(), name


def test_diffusers_modular_pipeline_loads_every_model_of_the_folder(release):
    from diffusers import ModularPipeline

    pipeline = ModularPipeline.from_pretrained(release["out"])
    assert type(pipeline).__name__ == "MiniMaxH3ModularPipeline"
    pipeline.load_components(names=list(MODELS), torch_dtype=torch.float32)
    for name in MODELS:
        loaded, ours = getattr(pipeline, name).state_dict(), load_file(release["out"] / name / WEIGHTS)
        assert all(torch.equal(loaded[n], ours[n].float()) for n in ours), name


def test_the_way_back_from_the_pipeline_is_the_whole_release_byte_for_byte(release, cli, tmp_path):
    result = cli(release["out"], tmp_path / "back", "--to", "original", "--max-shard-size", "20kB")
    assert result.exit_code == 0, result.stderr
    root, back = release["root"], tmp_path / "back"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.suffix == ".safetensors")
    assert sorted(str(p.relative_to(back)) for p in back.rglob("*.safetensors")) == files
    for name in files:  # the shards cut where the release cut them, the VAEs one file each as released
        assert (back / name).read_bytes() == (root / name).read_bytes(), name
    for partition in ("FL2VA", "Ref2VA"):
        folder = f"{partition}/transformer"
        assert json.loads((back / folder / "config.json").read_text()) == \
            json.loads((root / folder / "config.json").read_text())
        index = f"{folder}/model.safetensors.index.json"  # huggingface_hub's JSON spacing is its own
        assert json.loads((back / index).read_text())["weight_map"] == \
            json.loads((root / index).read_text())["weight_map"]
    verified = cli("verify", back, "--against", release["out"])  # each partition's files against the pipeline
    assert verified.exit_code == 0, verified.stdout + verified.stderr
    for folder in ("FL2VA/transformer", "Ref2VA/transformer", "FL2VA/video_vae/source", "Ref2VA/audio_vae"):
        assert f"ok: {back / folder} " in verified.stdout, verified.stdout


def test_partitions_whose_vaes_differ_are_refused_in_one_line(release, cli, tmp_path):
    root = tmp_path / "MiniMax-H3"
    shutil.copytree(release["root"], root)
    save_file(release_video_vae_state(diffsynth_video_vae(seed=4)), root / "Ref2VA" / VIDEO_VAE_FILE,
              metadata={"format": "pt"})
    result = cli(root, tmp_path / "out", "--base", release["base"])
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert result.stderr.count("\n") == 1 and "vae differ" in result.stderr and "Ref2VA" in result.stderr, \
        result.stderr


def test_a_root_holding_one_partition_exports_it_and_says_so(release, cli, tmp_path):
    """A download of FL2VA/ alone: its transformer and the VAEs are exported, transformer_ref/ stays --base's, and
    the user is told that Ref2VA/ was not there."""
    root = tmp_path / "MiniMax-H3"
    shutil.copytree(release["root"] / "FL2VA", root / "FL2VA")
    result = cli(root, tmp_path / "out", "--base", release["base"])
    assert result.exit_code == 0, result.stderr
    assert "Ref2VA/" in result.stderr
    out = tmp_path / "out"
    for name in ("transformer", "vae", "audio_vae"):
        assert (out / name / WEIGHTS).read_bytes() == (release["out"] / name / WEIGHTS).read_bytes(), name
    assert (out / "transformer_ref" / WEIGHTS).read_bytes() == \
        (release["base"] / "transformer_ref" / WEIGHTS).read_bytes()


def test_without_base_the_release_gives_both_transformers(release, cli, tmp_path):
    """No --base, so no text encoder: the two transformers (their configs from each partition's config.json), each
    in its pipeline folder; the VAEs are named as left for --component or a pipeline export."""
    result = cli(release["root"], tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir()) == ["transformer", "transformer_ref"]
    for name in ("transformer", "transformer_ref"):
        ours, theirs = load_file(tmp_path / "out" / name / WEIGHTS), load_file(release["out"] / name / WEIGHTS)
        assert list(ours) == list(theirs) and all(torch.equal(ours[n], theirs[n]) for n in theirs), name
    assert "vae, audio_vae are not exported" in result.stderr, result.stderr


def test_model_type_or_component_takes_one_model_of_the_release(release, cli, tmp_path):
    """--model-type picks a partition (into its pipeline folder, the other staying --base's), --component one model
    the partitions share; the release folder given to --to original is refused as the original layout already."""
    out, base = tmp_path / "ref2va", release["base"]
    assert cli(release["root"], out, "--base", base, "--model-type", "ref2va").exit_code == 0
    assert (out / "transformer_ref" / WEIGHTS).read_bytes() == \
        (release["out"] / "transformer_ref" / WEIGHTS).read_bytes()
    assert (out / "transformer" / WEIGHTS).read_bytes() == (base / "transformer" / WEIGHTS).read_bytes()
    result = cli(release["root"], tmp_path / "vae", "--base", base, "--component", "vae")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "vae" / WEIGHTS).read_bytes() == (release["alone"] / "vae" / WEIGHTS).read_bytes()
    one = tmp_path / "FL2VA"  # one partition's folder as downloaded: its transformer, and its VAEs in a pipeline
    result = cli(release["root"] / "FL2VA", one, "--base", base)
    assert result.exit_code == 0 and "Ref2VA" not in result.stderr, result.stderr
    for name in ("transformer", "vae", "audio_vae"):
        assert (one / name / WEIGHTS).read_bytes() == (release["out"] / name / WEIGHTS).read_bytes(), name
    refused = cli(release["root"], tmp_path / "back", "--to", "original")
    assert refused.exit_code == 2 and not (tmp_path / "back").exists()
    assert refused.stderr.count("\n") == 1 and "original layout already" in refused.stderr, refused.stderr


def test_verify_checks_each_model_of_the_pipeline_against_the_release_file_it_came_from(release, cli):
    result = cli("verify", release["out"], "--against", release["root"], "--base", release["base"])
    assert result.exit_code == 0, result.stdout + result.stderr
    for name in MODELS:
        assert f"ok: {release['out'] / name} " in result.stdout, result.stdout


@pytest.mark.parametrize("change, message", [
    (('partitions = { fl2va = "FL2VA"', 'partitions = { i2v = "FL2VA"'), "partitions names an unknown task"),
    (('models = { transformer = "transformer", ', 'models = { '), "must say where a partition holds its transformer"),
])
def test_a_malformed_release_section_is_refused_when_the_family_loads(change, message):
    from cogexport.models.family import FamilyError, parse_family

    text = (Path(__file__).parents[1] / "key_maps" / "minimax_h3" / "family.toml").read_text(encoding="utf-8")
    assert change[0] in text
    with pytest.raises(FamilyError, match=message):
        parse_family(text.replace(change[0], change[1]), "minimax_h3")
