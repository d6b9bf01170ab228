"""MiniMax-H3's video and audio VAEs, both ways. The video VAE in the release's names is written by DiffSynth-Studio's
MiniMaxH3VideoVAE (its port of the release's module tree) and judged by its own forward: the exported
AutoencoderKLMiniMaxH3 encodes and decodes a clip to the same tensors (fp32, torch.equal). The audio VAE's release
names are Diffusers' own; both come back byte for byte."""

from __future__ import annotations

import json

import pytest
import torch
from minimax_h3_vae_fixtures import (AUDIO_VAE, MASK_TOKEN, VIDEO_VAE, audio_vae, diffsynth_video_vae,
                                     release_video_vae_state, video_clip)
from safetensors.torch import load_file, save_file

WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> dict:
    """DiffSynth-Studio's tiny video VAE, its release-named file (video_vae/source/model.safetensors) and a --base
    folder holding AutoencoderKLMiniMaxH3's config at that size."""
    from diffusers import AutoencoderKLMiniMaxH3

    model = diffsynth_video_vae(seed=3)
    folder = tmp_path_factory.mktemp("minimax_h3_vae")
    source = folder / "FL2VA" / "video_vae" / "source"
    source.mkdir(parents=True)
    # saved as torch saves a state dict through safetensors (the release's transformer shards carry the same header)
    save_file(release_video_vae_state(model), source / "model.safetensors", metadata={"format": "pt"})
    AutoencoderKLMiniMaxH3(**VIDEO_VAE).save_config(folder / "base")
    return {"model": model, "file": source / "model.safetensors", "base": folder / "base"}


def test_the_release_video_vae_exports_to_a_vae_that_computes_what_diffsynths_does(video, cli, tmp_path):
    from diffusers import AutoencoderKLMiniMaxH3

    result = cli(video["file"], tmp_path / "vae", "--component", "vae", "--base", video["base"])
    assert result.exit_code == 0, result.stderr
    exported = AutoencoderKLMiniMaxH3.from_pretrained(tmp_path / "vae").eval()
    assert all(t.dtype == torch.float32 for t in load_file(tmp_path / "vae" / WEIGHTS).values())  # fp32, as released
    clip = video_clip(seed=4)
    with torch.no_grad():
        moments = exported.quant_conv(exported.encoder(clip))
        assert torch.equal(moments, video["model"].encode(clip))
        latents = moments[:, : VIDEO_VAE["latent_channels"]]
        frames = exported.decoder(exported.post_quant_conv(latents))
        assert torch.equal(frames, video["model"].decode(latents))
    assert frames.abs().max() > 0.1
    assert exported.config.latents_mean == VIDEO_VAE["latents_mean"]  # --base's config, as given


def test_the_video_vae_way_back_is_the_release_file_byte_for_byte(video, cli, tmp_path):
    assert cli(video["file"], tmp_path / "vae", "--component", "vae", "--base", video["base"]).exit_code == 0
    kept = load_file(tmp_path / "vae" / "original_buffers.safetensors")
    assert list(kept) == [MASK_TOKEN]
    result = cli(tmp_path / "vae", tmp_path / "back", "--to", "original", "--component", "vae")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == video["file"].read_bytes()


def test_the_audio_vae_exports_as_it_is_and_comes_back_byte_for_byte(cli, tmp_path):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    model = audio_vae(seed=5)
    release = tmp_path / "FL2VA" / "audio_vae"
    release.mkdir(parents=True)
    save_file(model.state_dict(), release / "model.safetensors", metadata={"format": "pt"})
    model.save_config(tmp_path / "base")
    result = cli(release / "model.safetensors", tmp_path / "audio_vae", "--component", "audio_vae",
                 "--base", tmp_path / "base")
    assert result.exit_code == 0, result.stderr
    exported = AutoencoderKLMiniMaxH3Audio.from_pretrained(tmp_path / "audio_vae").eval()
    config = json.loads((tmp_path / "audio_vae" / "config.json").read_text())
    assert config["encoder_rates"] == AUDIO_VAE["encoder_rates"]
    waveform = torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(exported.encode(waveform).latent_dist.mode(), model.encode(waveform).latent_dist.mode())
    result = cli(tmp_path / "audio_vae", tmp_path / "back", "--to", "original", "--component", "audio_vae")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (release / "model.safetensors").read_bytes()
    # the same names in the release's file: it is the release's layout already (one file, no Diffusers config beside it)
    refused = cli(release / "model.safetensors", tmp_path / "again", "--to", "original", "--component", "audio_vae")
    assert refused.exit_code == 2 and "already in the original MiniMax-H3 layout" in refused.stderr, refused.stderr


def test_the_published_vaes_configs_and_release_names_run_both_ways():
    """The published VAEs at full size, on the meta device: their configs carry the release's latent statistics, and
    the release table makes the video VAE's Diffusers names from the release's (its levels without a downsampler, the
    shortcuts where the width changes, 32 heads of [q k v] per decoder layer) and back."""
    from cogexport.keymap.plan import translate_shapes
    from cogexport.keymap.table import load_table
    from cogexport.models.family import family_named
    from cogexport.models.target import build_target

    family = family_named("MiniMax-H3")
    for variant in family.variants:
        vae, audio = family.component_config("vae", variant), family.component_config("audio_vae", variant)
        assert len(vae["latents_mean"]) == len(vae["latents_std"]) == 24 and vae["latents_std"][0] != 1.0
        assert len(audio["latents_mean"]) == len(audio["latents_std"]) == 32
    target = build_target("AutoencoderKLMiniMaxH3", family.component_config("vae", family.variants[0]))
    table = load_table("minimax_h3/release_video_vae")
    release = translate_shapes(table.inverted(), target.schema, target.counts)
    assert release["decoder.transformer_blocks.35.attn.to_qkv.weight"] == (3 * 32 * 64, 2048)
    assert "encoder.down.3.downsample.conv.weight" in release and "encoder.down.4.downsample.conv.weight" not in release
    assert translate_shapes(table, {**release, MASK_TOKEN: (1, 1, 2048)}, target.counts) == dict(target.schema)
