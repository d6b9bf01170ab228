"""LTX-2.3's and LTX-2.5's vocoder with bandwidth extension (LTX2VocoderWithBWE), a second class of LTX-2's vocoder
component: the release's vocoder.* names to the Diffusers folder and back byte for byte, judged by the renames of
Diffusers' conversion script (written out in ltx2_vocoder_fixtures.py) and by DiffSynth-Studio's port of the release
code, whose forward the exported model reproduces to the bit; the plain vocoder and this one never taken for each
other."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from ltx2_vocoder_fixtures import (diffsynth_vocoder_with_bwe, script_converted, vocoder_with_bwe_base,
                                  vocoder_with_bwe_file)
from safetensors import safe_open
from safetensors.torch import load_file

from cogexport.exporter import export, export_original

WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The tiny vocoder as LTX-2.3's single file holds it (vocoder.*), exported alone in fp32 with its config, made
    once."""
    folder = tmp_path_factory.mktemp("ltx2-bwe")
    release = vocoder_with_bwe_file(folder)
    base = vocoder_with_bwe_base(folder / "base")
    export(release, folder / "vocoder", component="vocoder", base=base, dtype="fp32", progress=False)
    return release, base, folder / "vocoder"


def test_the_vocoder_with_bwe_exports_exactly_and_gives_the_originals_waveform(exported):
    """Every tensor as the conversion script names it (the STFT and mel bases and the anti-aliasing filters
    included); Diffusers' LTX2VocoderWithBWE loads the folder and turns a mel spectrogram into the very waveform
    DiffSynth's port of the release's vocoder makes (24 mel-frame samples to 16 kHz and on to 48 kHz)."""
    from diffusers.pipelines.ltx2 import LTX2VocoderWithBWE

    release, _, folder = exported
    assert_same_tensors(load_file(folder / WEIGHTS), script_converted(load_file(release)))
    assert json.loads((folder / "config.json").read_text())["_class_name"] == "LTX2VocoderWithBWE"
    ours = LTX2VocoderWithBWE.from_pretrained(folder).eval()
    # 7 frames: the first generator's 28 samples are not a whole number of hops, so both pad before the mel
    mel = torch.randn(2, 2, 7, 64, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convolutions: threads only wait for each other on a shared machine
    try:
        with torch.no_grad():
            waveform, original = ours(mel), diffsynth_vocoder_with_bwe()(mel)
    finally:
        torch.set_num_threads(threads)
    assert waveform.shape == (2, 2, 84) and torch.equal(waveform, original)
    assert waveform.abs().max() < 1  # not a clamped (and so trivially equal) output


def test_verify_checks_it_and_the_way_back_rewrites_it_byte_for_byte(exported, tmp_path):
    """verify knows the class (no converter in Diffusers' package to ask: it says so) and Diffusers loads the folder;
    --to original gives the release's file back."""
    from cogexport.verify import verify

    release, _, folder = exported
    (report,) = verify(folder, release)
    assert report.ok and report.loads_with_diffusers and report.judge is None and "no converter" in report.judge_note
    export_original(folder, tmp_path / "back", component="vocoder", dtype="fp32", progress=False)
    assert (tmp_path / "back" / "vocoder.safetensors").read_bytes() == release.read_bytes()


def test_2_5s_audio_vae_file_gives_its_vocoder(exported, tmp_path):
    """LTX-2.5 ships the vocoder in its audio VAE file (audio_vae.* beside vocoder.*): --component vocoder reads
    the vocoder's keys alone, the same weights as from 2.3's file."""
    _, base, folder = exported
    audio_vae = {"audio_vae.decoder.conv_in.conv.weight": torch.ones(4, 8, 3, 3),
                 "audio_vae.per_channel_statistics.mean-of-means": torch.zeros(8)}
    release = vocoder_with_bwe_file(tmp_path, "ltx-2.5-audio-vae-tiny.safetensors", beside=audio_vae)
    result = export(release, tmp_path / "vocoder", component="vocoder", base=base, dtype="fp32", progress=False)
    assert_same_tensors(load_file(tmp_path / "vocoder" / WEIGHTS), load_file(folder / WEIGHTS))
    assert not result.dropped


def test_a_pipelines_release_file_carries_the_vocoder_with_bwe_and_its_config(exported, tmp_path):
    """The way back from a pipeline folder whose vocoder is an LTX2VocoderWithBWE (before, it was left out of the
    release file): its tensors under vocoder. in the release's names, and the metadata's vocoder section nested as
    ltx_core's VocoderConfigurator reads a 2.3 one ("vocoder" and "bwe", the mel front end in the latter). The
    pipeline is the shared 2.0 release's export with this vocoder put in: the machinery, not a real release."""
    import shutil

    from ltx2_fixtures import release as shared_release
    from ltx2_fixtures import tiny_pipeline

    bwe_release, _, folder = exported
    export(shared_release(), tmp_path / "pipeline", base=tiny_pipeline("release"), dtype="fp32", progress=False)
    shutil.rmtree(tmp_path / "pipeline" / "vocoder")
    shutil.copytree(folder, tmp_path / "pipeline" / "vocoder")
    export_original(tmp_path / "pipeline", tmp_path / "back", dtype="fp32", progress=False)
    written = load_file(tmp_path / "back" / "ltx-2.safetensors")
    assert_same_tensors({name: t for name, t in written.items() if name.startswith("vocoder.")}, load_file(bwe_release))
    with safe_open(tmp_path / "back" / "ltx-2.safetensors", "pt") as file:
        section = json.loads(file.metadata()["config"])["vocoder"]
    assert set(section) == {"vocoder", "bwe"}
    assert (section["vocoder"]["resblock"], section["vocoder"]["activation"], section["vocoder"]["upsample_rates"]) == \
        ("AMP1", "snakebeta", [2, 2])
    assert {key: section["bwe"][key] for key in ("n_fft", "hop_length", "num_mels", "input_sampling_rate",
                                                 "output_sampling_rate", "upsample_rates")} == \
        {"n_fft": 64, "hop_length": 8, "num_mels": 64, "input_sampling_rate": 16000, "output_sampling_rate": 48000,
         "upsample_rates": [6, 2, 2]}


# -- never the one taken for the other ----------------------------------------------------------------------------------
def test_a_vocoder_with_bwe_where_the_plain_one_is_expected_is_refused(exported, tmp_path, cli):
    """LTX-2.0's variant, or a --base whose vocoder is LTX2Vocoder, expects the plain vocoder: the names say this one
    has bandwidth extension, and the export stops in one line saying both."""
    from ltx2_fixtures import tiny_pipeline

    release = exported[0]
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--component", "vocoder", "--model-name",
                                   "LTX-2-19B-dev"],
                   f"{release} holds LTX2VocoderWithBWE weights", "LTX-2-19B-dev's vocoder is LTX2Vocoder",
                   inputs=[release])
    base = tiny_pipeline("release")
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--component", "vocoder", "--base", base],
                   f"--base {base}/vocoder/config.json describes LTX2Vocoder",
                   f"{release} holds LTX2VocoderWithBWE weights", inputs=[release])


def test_a_plain_vocoder_where_the_one_with_bwe_is_expected_is_refused(exported, tmp_path, cli):
    """The other way round: LTX-2.0's vocoder (the shared release's) with LTX-2.3's variant or a --base whose
    vocoder has bandwidth extension."""
    from ltx2_fixtures import release as shared_release

    release, base = shared_release(), exported[1]
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--component", "vocoder", "--model-name",
                                   "LTX-2.3-22B-dev"],
                   f"{release} holds LTX2Vocoder weights", "LTX-2.3-22B-dev's vocoder is LTX2VocoderWithBWE",
                   inputs=[release])
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--component", "vocoder", "--base", base],
                   f"--base {base}/vocoder/config.json describes LTX2VocoderWithBWE",
                   f"{release} holds LTX2Vocoder weights", inputs=[release])


# -- a full-size vocoder: its published config read off its shapes -------------------------------------------------------
# what Diffusers' conversion script configures for 2.3's (and, "same config as LTX-2.3", 2.5's) vocoder, written out
# here (scripts/convert_ltx2_to_diffusers.py, get_ltx2_vocoder_config): the sizes that make its shapes
PUBLISHED = dict(hidden_channels=1536, upsample_kernel_sizes=[11, 4, 4, 4, 4, 4], upsample_factors=[5, 2, 2, 2, 2, 2],
                 resnet_kernel_sizes=[3, 7, 11], bwe_hidden_channels=512, bwe_upsample_kernel_sizes=[12, 11, 4, 4, 4],
                 bwe_upsample_factors=[6, 5, 2, 2, 2], filter_length=512, hop_length=80, window_length=512,
                 num_mel_channels=64, input_sampling_rate=16000, output_sampling_rate=48000)


def test_a_full_size_vocoder_with_bwe_needs_no_base():
    """The release's vocoder at full size (DiffSynth's LTX2VocoderWithBWE builds the release's sizes: 1227 tensors, on
    the meta device here) fits the one published config of its class, chosen with no --base: every tensor planned
    into it."""
    from diffsynth_models import diffsynth_module

    from cogexport.exporter.options import ExportOptions
    from cogexport.exporter.parts import plan_component
    from cogexport.lazy import LazyTensor

    with torch.device("meta"):
        release = diffsynth_module("ltx2_audio_vae").LTX2VocoderWithBWE().state_dict()
    source = {f"vocoder.{name}": LazyTensor(t.shape, torch.float32, lambda: None) for name, t in release.items()}
    part = plan_component(source, "vocoder", None, None, None, ExportOptions(), "ltx-2.3-22b-dev.safetensors")
    assert part.target.class_name == "LTX2VocoderWithBWE"
    assert {key: part.target.config[key] for key in PUBLISHED} == PUBLISHED
    assert len(part.tensors) == len(release) == len(part.target.schema) and not part.plan.dropped


def test_a_vocoder_with_bwe_of_no_published_size_needs_base(exported, tmp_path, cli):
    """The tiny one without --base: its shapes fit no published config, and the export says so in one line (no
    --model-name would fit it either)."""
    release = exported[0]
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--component", "vocoder"],
                   f"{release} holds LTX2VocoderWithBWE weights of no published LTX-2 size",
                   "pass --base with the pipeline (or model folder) whose vocoder/config.json describes it",
                   inputs=[release])
