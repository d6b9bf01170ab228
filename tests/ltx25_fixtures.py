"""LTX-2.5 inputs for tests: tiny release files written by DiffSynth-Studio's port of the LTX-2 code (its LTXModel
built with the flags its model registry gives the LTX-2.5 transformer file), with seeded random weights, saved as the
release saves each component: one file, the transformer under model.diffusion_model., the config JSON in the header
metadata."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# sizes of the shared LTX-2 fixture's transformer, with 2.5's flags (diffsynth/configs/model_configs.py, the entry for
# diffusion_models/ltx-2.5-22b-dev-transformer-bf16.safetensors): the prompt is projected before the connectors
# (caption_channels None), gated attention, the prompt modulation, no video feed-forward biases, the keyframe
# embedding, the audio-video cross-attention's scale and shift per token
SIZES = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, num_layers=2,
             cross_attention_dim=32, audio_num_attention_heads=2, audio_attention_head_dim=8, audio_in_channels=8,
             audio_out_channels=8, audio_cross_attention_dim=16)
FLAGS = dict(caption_channels=None, apply_gated_attention=True, cross_attention_adaln=True, ff_bias=False,
             use_keyframes_abs_pos_embedding=True, use_tokenwise_av_ca_scale_shift=True)


def diffsynth_transformer(seed: int = 0, **flags) -> torch.nn.Module:
    """DiffSynth-Studio's LTXModel at the tiny sizes with 2.5's flags (or others given), every weight random."""
    from diffsynth_models import diffsynth_module

    model = diffsynth_module("ltx2_dit").LTXModel(**SIZES, **{**FLAGS, **flags})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model.eval()


def release_section(**flags) -> dict:
    """The transformer section of the release's header config, in the LTX-2 code's own keys (those ltx_core's
    configurator reads) for SIZES and the flags."""
    flags = {**FLAGS, **flags}
    section = {"_class_name": "AVTransformer3DModel", **SIZES, "caption_channels": 24, "norm_eps": 1e-06,
               "positional_embedding_max_pos": [20, 2048, 2048], "audio_positional_embedding_max_pos": [20],
               "positional_embedding_theta": 10000.0, "timestep_scale_multiplier": 1000,
               "av_ca_timestep_scale_multiplier": 1000, "rope_type": "split", "frequencies_precision": "float64",
               "attention_bias": True, "activation_fn": "gelu-approximate", "norm_elementwise_affine": False,
               "apply_gated_attention": flags["apply_gated_attention"],
               "cross_attention_adaln": flags["cross_attention_adaln"],
               "caption_proj_before_connector": flags["caption_channels"] is None}
    section.update({name: flags[name] for name in ("ff_bias", "use_keyframes_abs_pos_embedding") if name in flags})
    return section


def transformer_release(folder: Path, seed: int = 0, metadata: bool = True, **flags) -> Path:
    """The tiny transformer as the release's transformer file holds it (model.diffusion_model.*), with its header
    config unless metadata is False."""
    model = diffsynth_transformer(seed, **flags)
    tensors = {f"model.diffusion_model.{name}": t.contiguous() for name, t in model.state_dict().items()}
    path = folder / "ltx-2.5-tiny-transformer.safetensors"
    header = {"config": json.dumps({"transformer": release_section(**flags)})} if metadata else None
    save_file(tensors, path, metadata=header)
    return path


# a tiny diffusion decoder: five stages (the release's count) of one block each, widths a multiple of the head size;
# the release's patch size (4), which with the upsamples' 8x makes the 32x spatial factor DiffSynth's decode assumes
DECODER = dict(in_channels=8, out_channels=3, patch_size=4, head_dim=16, stage_channels=(128, 64, 32, 32, 16),
               stage_depths=(1, 1, 1, 1, 1), stage_kernels=((3, 3, 3),) * 5, stage5_kernel=(3, 3, 3), t_emb_dim=16,
               upsamples=(((1, 2, 2), 2), ((2, 1, 1), 2), ((2, 2, 2), 1), ((2, 2, 2), 2)),
               timestep_scale_multiplier=1000.0, default_num_inference_steps=1, model_output_type="x0")
# the same decoder as LTX2VideoDiffusionDecoderModel's config (Diffusers' conversion script's names for each setting)
DECODER_CONFIG = dict(latent_channels=8, out_channels=3, patch_size=4, decoder_head_dim=16,
                      decoder_stage_channels=(128, 64, 32, 32, 16), decoder_stage_depths=(1, 1, 1, 1, 1),
                      decoder_stage_kernels=((3, 3, 3),) * 4, decoder_stage5_kernel=(3, 3, 3),
                      decoder_upsample_strides=((1, 2, 2), (2, 1, 1), (2, 2, 2), (2, 2, 2)),
                      decoder_upsample_channel_reductions=(2, 2, 1, 2), decoder_t_emb_dim=16,
                      decoder_timestep_scale_multiplier=1000.0, decoder_num_inference_steps=1)
# DiffSynth's own converter (LTX25DiffusionVideoDecoderStateDictConverter) renames only the timestep MLP when it
# loads the release file: its model's names are the release's but for these, which go back here
DIFFSYNTH_NAMES = (("t_embedder.timestep_embedder.linear_1.", "t_embedder.mlp.0."),
                   ("t_embedder.timestep_embedder.linear_2.", "t_embedder.mlp.2."))


def diffusion_vae_release(folder: Path, seed: int = 0) -> Path:
    """LTX-2.5's video VAE file with the diffusion decoder, as the release lays it out (unprefixed: encoder.,
    decoder., per_channel_statistics.): the decoder DiffSynth-Studio's LTX25DiffusionVideoDecoder at the tiny size,
    every weight random; two tensors of a conv encoder beside it (the file's encoder is 2.3's conv one, which the
    Diffusers decoder drops); the release's five latent statistics."""
    from diffsynth_models import diffsynth_module

    decoder = diffsynth_module("ltx25_diffusion_video_vae").LTX25DiffusionVideoDecoder(**DECODER)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, tensor in decoder.state_dict().items():
        if name.startswith("per_channel_statistics."):
            continue
        for ours, theirs in DIFFSYNTH_NAMES:
            name = name.replace(ours, theirs)
        tensors[f"decoder.{name}"] = torch.randn(tensor.shape, generator=generator) * 0.1
    for statistic in ("channel", "mean-of-means", "std-of-means", "mean-of-stds", "mean-of-stds_over_std-of-means"):
        tensors[f"per_channel_statistics.{statistic}"] = torch.randn(8, generator=generator)
    tensors["encoder.conv_in.conv.weight"] = torch.randn(16, 48, 3, 3, 3, generator=generator)
    tensors["encoder.conv_in.conv.bias"] = torch.randn(16, generator=generator)
    path = folder / "ltx-2.5-video-vae-tiny.safetensors"
    save_file(tensors, path)
    return path


def diffsynth_diffusion_decoder(release: Path) -> torch.nn.Module:
    """DiffSynth-Studio's LTX25DiffusionVideoDecoder with the weights of a release file (diffusion_vae_release's):
    the decoder's names without decoder., the timestep MLP as DiffSynth's converter renames it, the statistics its
    decode un-normalises latents with."""
    from diffsynth_models import diffsynth_module
    from safetensors.torch import load_file

    decoder = diffsynth_module("ltx25_diffusion_video_vae").LTX25DiffusionVideoDecoder(**DECODER)
    state = {}
    for name, tensor in load_file(release).items():
        if name.startswith("decoder.") and name != "decoder.type_emb":  # the keyframe tag: no keyframes decoded here
            name = name.removeprefix("decoder.")
            for ours, theirs in DIFFSYNTH_NAMES:
                name = name.replace(theirs, ours)
            state[name] = tensor
    state.update({f"per_channel_statistics.{s}": load_file(release)[f"per_channel_statistics.{s}"]
                  for s in ("mean-of-means", "std-of-means")})
    missing, unexpected = decoder.load_state_dict(state, strict=False)
    assert missing == ["type_emb"] and not unexpected, (missing, unexpected)
    return decoder.eval()


def diffusion_decoder_base(folder: Path) -> Path:
    """A folder holding the tiny decoder's Diffusers config (diffusion_decoder/config.json), for --base."""
    from diffusers import LTX2VideoDiffusionDecoderModel

    with torch.device("meta"):
        model = LTX2VideoDiffusionDecoderModel(**DECODER_CONFIG)
    (folder / "diffusion_decoder").mkdir(parents=True)
    model.save_config(folder / "diffusion_decoder")
    return folder


# a tiny duration head (the release's: the class defaults, 4096 / 2048 wide, 256 hidden, one query, four heads)
DURATION_HEAD = dict(video_cross_attention_dim=32, audio_cross_attention_dim=16, pooler_hidden_dim=16, num_queries=2,
                     num_pooler_heads=4)


def diffsynth_duration_head(seed: int = 0) -> torch.nn.Module:
    """DiffSynth-Studio's LTX25DurationHead at the tiny size, every weight random."""
    from diffsynth_models import diffsynth_module

    head = diffsynth_module("ltx25_duration_head").LTX25DurationHead(**DURATION_HEAD, mlp_hidden=24)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return head.eval()


def duration_head_release(folder: Path) -> Path:
    """The tiny head as the release's file holds it: under duration_head., as DiffSynth's converter reads it."""
    path = folder / "ltx-2.5-duration-head-tiny.safetensors"
    save_file({f"duration_head.{name}": t.contiguous() for name, t in diffsynth_duration_head().state_dict().items()},
              path)
    return path


def duration_head_base(folder: Path) -> Path:
    """A folder holding the tiny head's Diffusers config (duration_head/config.json), for --base."""
    from diffusers.pipelines.ltx2 import LTX2DurationHead

    with torch.device("meta"):
        model = LTX2DurationHead(**DURATION_HEAD, mlp_hidden_dim=24)
    (folder / "duration_head").mkdir(parents=True)
    model.save_config(folder / "duration_head")
    return folder


# the tiny 2.5 transformer (SIZES, FLAGS) as LTX2VideoTransformer3DModel's config: the prompt projected before the
# connectors (no caption projection), gated attention and the prompt modulation, no video feed-forward biases, the
# keyframe embedding (Diffusers' conversion script's --version 2.5 settings at these sizes)
TRANSFORMER_CONFIG = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                          cross_attention_dim=32, audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2,
                          audio_attention_head_dim=8, audio_cross_attention_dim=16, num_layers=2, caption_channels=24,
                          gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
                          use_prompt_embeddings=False, rope_type="split", ff_bias=False,
                          use_keyframes_abs_pos_embedding=True)


def pipeline_base(folder: Path) -> Path:
    """A tiny 2.5 LTX2Pipeline folder for --base: the shared tiny pipeline at the release's sizes (its text encoder,
    tokenizer, VAEs, connectors and scheduler, linked), with 2.5's transformer config and the tiny vocoder with
    bandwidth extension's config (their weights come from the release files)."""
    from diffusers import LTX2VideoTransformer3DModel
    from ltx2_fixtures import tiny_pipeline
    from ltx2_vocoder_fixtures import vocoder_with_bwe_base

    shared = tiny_pipeline("release")
    vocoder_with_bwe_base(folder)
    for entry in shared.iterdir():
        if entry.name not in ("transformer", "vocoder"):
            (folder / entry.name).symlink_to(entry)
    with torch.device("meta"):
        LTX2VideoTransformer3DModel(**TRANSFORMER_CONFIG).save_config(folder / "transformer")
    return folder
