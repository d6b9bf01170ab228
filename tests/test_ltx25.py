"""LTX-2.5 in the LTX-2 family: its transformer (2.3's layout without the video feed-forward biases, with the keyframe
embedding) told apart from 2.3's by its layers and exported with 2.5's config; its video VAE with the diffusion decoder
to LTX2VideoDiffusionDecoderModel and back. Judged by DiffSynth-Studio's port of the LTX-2 code, which writes the tiny
release files (tests/ltx25_fixtures.py) and runs the original transformer's forward, and by the renames Diffusers'
conversion script makes, written out here."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from ltx25_fixtures import (FLAGS, SIZES, diffsynth_diffusion_decoder, diffsynth_duration_head, diffsynth_transformer,
                            diffusion_decoder_base, diffusion_vae_release, duration_head_base, duration_head_release,
                            transformer_release)
from ltx2_fixtures import reference_io
from safetensors.torch import load_file

from cogexport.exporter import export, export_original
from cogexport.keymap.table import load_table
from cogexport.models.family import family_named
from cogexport.models.recognize import read_facts

FAMILY = family_named("ltx2")
# the renames Diffusers' conversion script makes of a 2.3 / 2.5 transformer (scripts/convert_ltx2_to_diffusers.py:
# LTX_2_3_TRANSFORMER_KEYS_RENAME_DICT, applied in its order, then adaln_single -> time_embed), written out here
# independently of cogexport's table
RENAMES = (("patchify_proj", "proj_in"), ("audio_patchify_proj", "audio_proj_in"),
           ("av_ca_video_scale_shift_adaln_single", "av_cross_attn_video_scale_shift"),
           ("av_ca_a2v_gate_adaln_single", "av_cross_attn_video_a2v_gate"),
           ("av_ca_audio_scale_shift_adaln_single", "av_cross_attn_audio_scale_shift"),
           ("av_ca_v2a_gate_adaln_single", "av_cross_attn_audio_v2a_gate"),
           ("scale_shift_table_a2v_ca_video", "video_a2v_cross_attn_scale_shift_table"),
           ("scale_shift_table_a2v_ca_audio", "audio_a2v_cross_attn_scale_shift_table"),
           ("q_norm", "norm_q"), ("k_norm", "norm_k"), ("audio_prompt_adaln_single", "audio_prompt_adaln"),
           ("prompt_adaln_single", "prompt_adaln"))


def converted(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = {}
    for name, tensor in state.items():
        for old, new in RENAMES:
            name = name.replace(old, new)
        for old, new in (("adaln_single.", "time_embed."), ("audio_adaln_single.", "audio_time_embed.")):
            name = new + name[len(old):] if name.startswith(old) else name
        renamed[name] = tensor
    return renamed


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The tiny 2.5 transformer release (header config included) exported alone in fp32, made once."""
    folder = tmp_path_factory.mktemp("ltx25")
    release = transformer_release(folder)
    result = export(release, folder / "transformer", component="transformer", dtype="fp32", progress=False)
    return result, folder / "transformer"


def test_the_2_5_transformer_exports_exactly_with_2_5s_config(exported):
    result, out = exported
    assert "LTX-2.5-22B-dev layout" in result.model
    config = json.loads((out / "config.json").read_text())
    assert (config["ff_bias"], config["audio_ff_bias"], config["use_keyframes_abs_pos_embedding"]) == (False, True, True)
    assert config["gated_attn"] and config["cross_attn_mod"] and not config["use_prompt_embeddings"]
    assert_same_tensors(load_file(out / "diffusion_pytorch_model.safetensors"),
                        converted(diffsynth_transformer().state_dict()))


def test_the_exported_2_5_transformer_gives_the_original_forward(exported):
    """DiffSynth's LTXModel and Diffusers' model on the exported folder, on the shared fixture's inputs (uniform and
    per-token timesteps; the contexts at the streams' widths, since 2.5 projects the prompt before the connectors):
    the same outputs to the bit (one thread). 2.5's scale and shift of the audio-video cross-attention per token
    (use_tokenwise_av_ca_scale_shift) has no Diffusers 0.42.1 setting, so the original runs without it here; with
    it, uniform timesteps give the same to float rounding (per-token ones differ: docs/families/ltx2.md)."""
    from diffusers import LTX2VideoTransformer3DModel

    io = reference_io()
    generator = torch.Generator().manual_seed(1)
    contexts = (torch.randn(2, 6, 32, generator=generator), torch.randn(2, 6, 16, generator=generator))
    ours = LTX2VideoTransformer3DModel.from_pretrained(exported[1]).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for tokenwise, prefix in ((False, ""), (False, "per_token."), (True, "")):
            theirs = diffsynth_transformer(use_tokenwise_av_ca_scale_shift=tokenwise)
            timesteps = io.get(f"{prefix}video_timesteps", io["video_timesteps"])
            with torch.no_grad():
                expected = theirs(io["video_latent"], io["video_positions"], contexts[0], timesteps,
                                  io["audio_latent"], io["audio_positions"], contexts[1], io["audio_timesteps"],
                                  io["sigma"])
                # as LTX2Pipeline calls it: timesteps and sigma x 1000, the other stream's sigma across streams
                actual = ours(hidden_states=io["video_latent"], audio_hidden_states=io["audio_latent"],
                              encoder_hidden_states=contexts[0], audio_encoder_hidden_states=contexts[1],
                              timestep=timesteps * 1000, audio_timestep=io["audio_timesteps"] * 1000,
                              sigma=io["sigma"] * 1000, video_coords=io["video_positions"],
                              audio_coords=io["audio_positions"], fps=float(io["fps"]), use_cross_timestep=True,
                              return_dict=False)
            for mine, original in zip(actual, expected):
                if tokenwise:
                    assert torch.allclose(mine, original, atol=1e-6, rtol=0), prefix
                else:
                    assert torch.equal(mine, original), prefix
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("flags, version", [
    ({}, "2.5"),
    ({"use_keyframes_abs_pos_embedding": False}, "2.5"),  # the first 2.5 release: no keyframe embedding yet
    ({"ff_bias": True, "use_keyframes_abs_pos_embedding": False, "caption_channels": 24}, "2.3"),
])
def test_the_version_is_read_off_the_layers(flags, version):
    """2.5's keyframe embedding, or 2.3's layers without the video feed-forward biases, say 2.5; 2.3's say 2.3."""
    from diffsynth_models import diffsynth_module

    with torch.device("meta"):
        model = diffsynth_module("ltx2_dit").LTXModel(**SIZES, **{**FLAGS, **flags})
    names = {f"model.diffusion_model.{name}": t.shape for name, t in model.state_dict().items()}
    assert read_facts(FAMILY, load_table("ltx2/original_transformer"), names).facts["version"] == version



# -- the video VAE with the diffusion decoder ---------------------------------------------------------------------------
def decoder_converted(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What Diffusers' conversion script makes of the release's VAE file for LTX2VideoDiffusionDecoderModel
    (convert_ltx2_diffusion_video_vae, --version 2.5), written out here: the encoder and the keyframe tag dropped,
    the two statistics renamed, each fused qkv cut in three along dim 0, the attention output and norms and the
    timestep MLP renamed."""
    renames = (("t_embedder.mlp.0.", "t_embedder.timestep_embedder.linear_1."),
               ("t_embedder.mlp.2.", "t_embedder.timestep_embedder.linear_2."), (".attn.proj.", ".attn.to_out.0."),
               (".attn.q_norm.", ".attn.norm_q."), (".attn.k_norm.", ".attn.norm_k."))
    out = {"latents_mean": tensors["per_channel_statistics.mean-of-means"],
           "latents_std": tensors["per_channel_statistics.std-of-means"]}
    for name, tensor in tensors.items():
        if not name.startswith("decoder.") or name == "decoder.type_emb":
            continue
        for old, new in renames:
            name = name.replace(old, new)
        if ".qkv." in name:
            for part, chunk in zip(("to_q", "to_k", "to_v"), tensor.chunk(3, dim=0)):
                out[name.replace("qkv", part)] = chunk
        else:
            out[name] = tensor
    return out


@pytest.fixture(scope="module")
def decoder_release(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ltx25-vae")
    return diffusion_vae_release(folder), diffusion_decoder_base(folder / "base")


def test_the_diffusion_decoder_exports_exactly_and_back(decoder_release, tmp_path):
    release, base = decoder_release
    result = export(release, tmp_path / "decoder", component="diffusion_decoder", base=base, dtype="fp32",
                    progress=False)
    tensors = load_file(release)
    assert_same_tensors(load_file(tmp_path / "decoder" / "diffusion_pytorch_model.safetensors"),
                        decoder_converted(tensors))
    assert json.loads((tmp_path / "decoder" / "config.json").read_text())["_class_name"] == \
        "LTX2VideoDiffusionDecoderModel"
    kept = {f"per_channel_statistics.{s}" for s in ("channel", "mean-of-stds", "mean-of-stds_over_std-of-means")}
    # the encoder and the keyframe tag dropped, each said why; the statistics the class has no place for kept beside
    assert set(result.dropped) == {"encoder.conv_in.conv.weight", "encoder.conv_in.conv.bias", "decoder.type_emb",
                                   *kept}
    assert_same_tensors(load_file(tmp_path / "decoder" / "per_channel_statistics.safetensors"),
                        {name: tensors[name] for name in kept})
    export_original(tmp_path / "decoder", tmp_path / "back", component="diffusion_decoder", dtype="fp32",
                    progress=False)
    # the way back: the decoder and every statistic as the release had them (the encoder is the conv VAE's file's)
    assert_same_tensors(load_file(tmp_path / "back" / "diffusion_decoder.safetensors"),
                        {name: t for name, t in tensors.items()
                         if not name.startswith("encoder.") and name != "decoder.type_emb"})


def test_the_exported_diffusion_decoder_decodes_as_the_original(decoder_release, tmp_path):
    """DiffSynth's port of the release decoder and Diffusers' LTX2VideoDiffusionDecoderModel on the exported folder,
    one latent each (3 latent frames, 3 x 3: the least each stage's 3x3x3 window takes): the same pixels. DiffSynth's
    decode seeds its own generator (42 + seed) and un-normalises the latents itself; Diffusers takes them
    un-normalised (the pipeline does it) and a generator. Not to the bit: the neighborhood attention sums its window
    in another order in each (a FlexAttention mask here, a gathered window there; the contexts agree to 4e-7, the
    pixels to 6e-8 on the machine that wrote this). A 2-frame latent is not compared: DiffSynth decodes it on a
    17-frame canvas and crops to 9, Diffusers decodes 9 frames (docs/families/ltx2.md)."""
    from diffusers import LTX2VideoDiffusionDecoderModel

    release, base = decoder_release
    export(release, tmp_path / "decoder", component="diffusion_decoder", base=base, dtype="fp32", progress=False)
    ours = LTX2VideoDiffusionDecoderModel.from_pretrained(tmp_path / "decoder").eval()
    theirs = diffsynth_diffusion_decoder(release)
    latent = torch.randn(1, 8, 3, 3, 3, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            expected = theirs.decode(latent, seed=1)
            un_normalised = theirs.per_channel_statistics.un_normalize(latent)
            actual = ours(un_normalised, generator=torch.Generator().manual_seed(43), return_dict=False)[0]
    finally:
        torch.set_num_threads(threads)
    assert actual.shape == expected.shape == (1, 3, 17, 96, 96)
    assert torch.allclose(actual, expected, atol=1e-6, rtol=0)


def test_a_conv_vae_asked_of_the_diffusion_decoder_file_is_refused(decoder_release, tmp_path, cli):
    release, _ = decoder_release
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--component", "vae"],
                   f"{release} holds a diffusion decoder (LTX-2), not a VAE; export it with --component "
                   "diffusion_decoder", inputs=[release])


# -- the duration head ----------------------------------------------------------------------------------------------------
def test_the_duration_head_exports_exactly_gives_the_originals_durations_and_goes_back(tmp_path):
    """The release's fused attention input projection cut into to_q / to_k / to_v (as Diffusers' conversion script's
    convert_ltx2_duration_head does: chunk(3) on dim 0): the exported head predicts the durations DiffSynth's does,
    and --to original gives the release file's tensors back."""
    from diffusers.pipelines.ltx2 import LTX2DurationHead

    release = duration_head_release(tmp_path)
    export(release, tmp_path / "head", component="duration_head", base=duration_head_base(tmp_path / "base"),
           dtype="fp32", progress=False)
    tensors = load_file(release)
    exported = load_file(tmp_path / "head" / "diffusion_pytorch_model.safetensors")
    fused = tensors["duration_head.attention_pooler.cross_attn.in_proj_weight"]
    assert torch.equal(torch.cat([exported[f"attention_pooler.to_{x}.weight"] for x in "qkv"]), fused)
    ours = LTX2DurationHead.from_pretrained(tmp_path / "head").eval()
    generator = torch.Generator().manual_seed(2)
    video, audio = torch.randn(2, 5, 32, generator=generator), torch.randn(2, 3, 16, generator=generator)
    with torch.no_grad():
        for inputs in ((video, audio), (video, None), (None, audio)):
            assert torch.allclose(ours(*inputs), diffsynth_duration_head()(*inputs), rtol=1e-6, atol=0)
    export_original(tmp_path / "head", tmp_path / "back", component="duration_head", dtype="fp32", progress=False)
    assert_same_tensors(load_file(tmp_path / "back" / "duration_head.safetensors"), tensors)


def test_a_full_size_duration_head_needs_no_base(tmp_path):
    """The release's head is the class's defaults (4096 / 2048 wide, 256 hidden: 1.6M parameters, made here at full
    size by DiffSynth's class with its own defaults): it exports with the published config, no --base."""
    from diffsynth_models import diffsynth_module
    from safetensors.torch import save_file

    head = diffsynth_module("ltx25_duration_head").LTX25DurationHead()
    save_file({f"duration_head.{name}": t.contiguous() for name, t in head.state_dict().items()},
              tmp_path / "head.safetensors")
    export(tmp_path / "head.safetensors", tmp_path / "out", component="duration_head", dtype="fp32", progress=False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["video_cross_attention_dim"], config["audio_cross_attention_dim"], config["pooler_hidden_dim"]) == \
        (4096, 2048, 256)


# -- LoRAs of a 2.5 transformer -------------------------------------------------------------------------------------------
# layers the trainers adapt, 2.5's own among them (the gated attention's gate, the video feed-forward without biases)
LORA_LAYERS = ("proj_in", "transformer_blocks.0.attn1.to_q", "transformer_blocks.0.attn1.to_gate_logits",
               "transformer_blocks.0.ff.net.0.proj", "transformer_blocks.1.ff.net.2",
               "transformer_blocks.1.audio_ff.net.2", "transformer_blocks.1.audio_to_video_attn.to_out.0")


@pytest.mark.parametrize("trainer", ["simpletuner", "ai-toolkit"])
def test_the_trainers_2_5_loras_fuse_exactly(exported, trainer, tmp_path):
    """SimpleTuner saves LTX2Pipeline.save_lora_weights' Diffusers layout; ai-toolkit renames its adapter to the
    release names behind diffusion_model. (ComfyUI's layout): for 2.5 both are LTX-2's layouts, so each fuses into the
    2.5 transformer exactly, W + (alpha / r) B A, 2.5's own layers included."""
    from diffusers import LTX2Pipeline
    from lora_helpers import assert_all_equal, merged, random_modules, write_comfyui_lora, write_diffusers_lora

    folder = exported[1]
    weights = load_file(folder / "diffusion_pytorch_model.safetensors")
    modules = random_modules({name: t.shape for name, t in weights.items()}, LORA_LAYERS, 3,
                             ((4, 8.0), (2, 2.0), (4, 4.0)))
    if trainer == "simpletuner":
        lora = write_diffusers_lora(LTX2Pipeline, tmp_path / "lora", modules)
    else:  # release names: only proj_in is named otherwise among these layers
        lora = write_comfyui_lora(tmp_path / "lora" / "ltx25_lora.safetensors",
                                  {m.replace("proj_in", "patchify_proj", 1) if m == "proj_in" else m: lora_
                                   for m, lora_ in modules.items()}, ("A", "B"))
    export(lora, tmp_path / "fused", base=folder, lora="fuse", dtype="fp32", progress=False)
    truth = merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in modules.items()})
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
    assert json.loads((tmp_path / "fused" / "config.json").read_text())["ff_bias"] is False


# -- a 2.5 pipeline from the release's files --------------------------------------------------------------------------------
def test_a_2_5_pipeline_takes_the_audio_vae_and_vocoder_from_the_releases_audio_vae_file(tmp_path, cli):
    """The release keeps the vocoder in its audio VAE file (vae/ltx-2.5-audio-vae-*.safetensors: audio_vae.* beside
    vocoder.*): given as --vae, it gives the pipeline both models (before, --vae took a video VAE only, and they came
    from --base). The file here: the LTX-2 repository's tiny audio VAE and DiffSynth's port's tiny vocoder with
    bandwidth extension; each exported model is what Diffusers' converter (the audio VAE) or conversion script (the
    vocoder, its renames written out) makes of it, and loads strictly."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2 import LTX2VocoderWithBWE
    from ltx2_fixtures import judged, release_tensors, split
    from ltx2_vocoder_fixtures import script_converted, vocoder_with_bwe_file

    from ltx25_fixtures import pipeline_base

    audio_vae = split(release_tensors(), "audio_vae.")
    release = vocoder_with_bwe_file(tmp_path, "ltx-2.5-audio-vae-tiny.safetensors", beside=audio_vae)
    base = pipeline_base(tmp_path / "base")
    transformer = transformer_release(tmp_path)
    result = export(transformer, tmp_path / "pipeline", base=base, vae=release, dtype="fp32", progress=False)
    out = tmp_path / "pipeline"
    index = json.loads((out / "model_index.json").read_text())
    assert index["vocoder"] == ["ltx2", "LTX2VocoderWithBWE"] and not result.dropped and not result.ignored
    vocoder = {name: t for name, t in load_file(release).items() if name.startswith("vocoder.")}
    assert_same_tensors(load_file(out / "vocoder" / "diffusion_pytorch_model.safetensors"), script_converted(vocoder))
    assert_same_tensors(load_file(out / "audio_vae" / "diffusion_pytorch_model.safetensors"),
                        judged("audio_vae", audio_vae))
    LTX2VocoderWithBWE.from_pretrained(out / "vocoder")  # strict: every tensor in its place
    AutoencoderKLLTX2Audio.from_pretrained(out / "audio_vae")
    # the same models in two --vae files: refused, naming both
    copy = tmp_path / "again" / release.name
    copy.parent.mkdir()
    copy.write_bytes(release.read_bytes())
    assert_refused(cli, tmp_path, [transformer, tmp_path / "out", "--base", base, "--vae", release, "--vae", copy],
                   f"--vae {release} and --vae {copy} both hold the audio VAE; give each model once",
                   inputs=[release, copy])
