"""Build a tiny but complete Kandinsky 6 pipeline folder (TI2VA or SR), fully offline (tests, docs).

    python scripts/make_tiny_kandinsky6.py OUT --pipeline ti2va --seed 0
    python scripts/make_tiny_kandinsky6.py OUT --pipeline sr

OUT is what ``DiffusionPipeline.save_pretrained`` writes: ``Kandinsky6TI2VAPipeline`` with ``text_encoder`` (a
2-layer Qwen2_5_VLForConditionalGeneration with a 1-layer vision tower, Kandinsky 5's tiny one: the pipeline reads
its last hidden states), ``tokenizer``, ``text_encoder_2`` (a 2-layer CLIPTextModel: its pooled output),
``tokenizer_2``, ``transformer`` (Kandinsky6Transformer3DModel, two fused blocks), ``vae`` (HunyuanVideo's
AutoencoderKLHunyuanVideo, tiny), ``audio_vae`` (MMAudioVAE over 8 mel bins), ``vocoder`` (MMAudioVocoder whose
upsampling equals the audio VAE's hop) and the scheduler (FlowMatchEulerDiscreteScheduler, shift 5.0, as the
published sft folders'). ``--no-audio`` leaves the two optional audio models out (model_index.json says null).

``sr``: ``Kandinsky6SRPipeline`` with ``transformer`` (Kandinsky6SRTransformer3DModel, distilled as the published
bundle: a head of 10 velocity grids), ``vae`` (the K-VAE, Kandinsky6SRVAE, 3 levels: 4x spatial), ``latent_upscaler``
(a bank with the x2 upscaler) and the scheduler (PiflowScheduler, shift 3.5, n_grid 10). Its tiles are 32x32 pixels:
8x8 latent tokens, the smallest grid its NABLA attention's 8x8 blocks take.

The release's ``tokenizer`` is a Qwen2_5_VLProcessor; its video processor needs torchvision, which this environment
does not install, so the tiny folder's ``tokenizer`` is the byte-level Qwen2 tokenizer the processor would wrap (the
pipeline calls it with text only). Every model is randomly initialised from ``--seed``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never fall back to the Hub

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kandinsky5_tiny import TINY_POOLED_DIM, TINY_TEXT_DIM  # noqa: E402
from make_tiny_hunyuanvideo import build_vae  # noqa: E402
from make_tiny_kandinsky5 import build_text_encoder  # noqa: E402
from tiny_models import (build_clip_text_encoder, build_clip_tokenizer, build_qwen_tokenizer,  # noqa: E402
                         pipeline_command, randomize_)

AUDIO_CHANNELS = 6  # the tiny audio VAE's latent channels: the transformer's audio input and output
# HunyuanVideo's 16 latent channels (conditioned: 2 x 16 + 1 input channels); two fused blocks of video heads of 8,
# one audio head of 8 (ca_rope gives the audio keys the video RoPE: the head sizes must agree, as in every release)
TINY_TRANSFORMER = {"in_visual_dim": 16, "out_visual_dim": 16, "in_text_dim": TINY_TEXT_DIM,
                    "in_text_dim2": TINY_POOLED_DIM, "time_dim": 16, "model_dim": 16, "ff_dim": 32,
                    "num_text_blocks": 1, "num_visual_blocks": 2, "axes_dims": [2, 2, 4],
                    "in_audio_dim": AUDIO_CHANNELS, "out_audio_dim": AUDIO_CHANNELS, "model_dim_a": 8,
                    "time_dim_a": 16, "ff_dim_a": 16, "axes_dims_a": [2, 2, 4], "audio_freqs_scaling": 0.144,
                    "text_token_padding": True, "ca_rope": True, "cross_gates": True, "fix_modulation": True,
                    "visual_token_type_num_embeddings": 2}
# a low sample rate keeps the audio short: 1600 Hz over a latent hop of 2 x 16 samples is 50 audio tokens a second
TINY_AUDIO_VAE = {"mel_bins": 8, "latent_channels": AUDIO_CHANNELS, "hidden_channels": 8,
                  "channel_multipliers": (1, 2), "layers_per_block": 1, "sample_rate": 1600, "n_fft": 64,
                  "hop_length": 16}
TINY_VOCODER = {"num_mels": 8, "upsample_initial_channel": 16, "upsample_rates": (4, 4),
                "upsample_kernel_sizes": (8, 8), "resblock_kernel_sizes": (3,), "resblock_dilation_sizes": ((1,),)}


def build_transformer(seed: int):
    from diffusers import Kandinsky6Transformer3DModel

    torch.manual_seed(seed)
    return randomize_(Kandinsky6Transformer3DModel(**TINY_TRANSFORMER), seed).eval()


def build_audio(seed: int) -> dict:
    from diffusers import MMAudioVAE, MMAudioVocoder

    # small random weights, as the video VAE's: the decoded mel and waveform stay finite
    return dict(audio_vae=randomize_(MMAudioVAE(**TINY_AUDIO_VAE), seed + 2, scale=0.05).eval(),
                vocoder=randomize_(MMAudioVocoder(**TINY_VOCODER), seed + 3, scale=0.05).eval())


SR_LATENT_CHANNELS = 4
TINY_SR_TRANSFORMER = {"in_visual_dim": SR_LATENT_CHANNELS, "out_visual_dim": 10 * SR_LATENT_CHANNELS, "time_dim": 16,
                       "model_dim": 16, "ff_dim": 32, "num_visual_blocks": 2, "axes_dims": (2, 2, 4),
                       "tile_sizes": ((32, 32),)}
TINY_SR_VAE = {"latent_channels": SR_LATENT_CHANNELS, "encoder_block_out_channels": (8, 16, 16),
               "decoder_block_out_channels": (8, 16, 16), "layers_per_block": 1}
TINY_SR_UPSCALER = {"in_channels": SR_LATENT_CHANNELS, "stage_channels": (8, 8, 8), "num_pre_blocks": 1,
                    "num_mid_blocks": 1, "num_post_blocks": 1, "num_x2_adapter_blocks": 1, "scales": (2,)}


def build_tiny_sr_pipeline(seed: int):
    from diffusers import (Kandinsky6SRLatentUpscalerBank, Kandinsky6SRPipeline, Kandinsky6SRTransformer3DModel,
                           Kandinsky6SRVAE, PiflowScheduler)

    torch.manual_seed(seed)
    return Kandinsky6SRPipeline(
        transformer=randomize_(Kandinsky6SRTransformer3DModel(**TINY_SR_TRANSFORMER), seed).eval(),
        vae=randomize_(Kandinsky6SRVAE(**TINY_SR_VAE), seed + 1, scale=0.05).eval(),
        latent_upscaler=randomize_(Kandinsky6SRLatentUpscalerBank(**TINY_SR_UPSCALER), seed + 2, scale=0.05).eval(),
        scheduler=PiflowScheduler(shift=3.5, n_grid=10))


def build_tiny_pipeline(pipeline: str = "ti2va", audio: bool = True, seed: int = 0):
    from diffusers import FlowMatchEulerDiscreteScheduler, Kandinsky6TI2VAPipeline

    if pipeline == "sr":
        return build_tiny_sr_pipeline(seed)
    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = build_qwen_tokenizer(), build_clip_tokenizer()
    return Kandinsky6TI2VAPipeline(
        text_encoder=build_text_encoder(len(tokenizer)), tokenizer=tokenizer,
        text_encoder_2=build_clip_text_encoder(len(tokenizer_2), TINY_POOLED_DIM), tokenizer_2=tokenizer_2,
        transformer=build_transformer(seed), vae=build_vae(seed), scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        **(build_audio(seed) if audio else {}))


main = pipeline_command(
    build_tiny_pipeline, "Kandinsky 6",
    click.option("--pipeline", type=click.Choice(["ti2va", "sr"]), default="ti2va", show_default=True),
    click.option("--audio/--no-audio", default=True, show_default=True,
                 help="TI2VA: with the optional audio VAE and vocoder"))


if __name__ == "__main__":
    main()
