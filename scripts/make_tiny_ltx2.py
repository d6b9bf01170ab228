"""Build a tiny but complete LTX-2 pipeline folder (LTX2Pipeline, or LTX2ImageToVideoPipeline), fully offline.

    python scripts/make_tiny_ltx2.py OUT --layout release     # the sizes of ../shared/fixtures/ltx2's release file
    python scripts/make_tiny_ltx2.py OUT --layout render      # sizes whose models fit together: it renders

OUT is what ``save_pretrained`` of the pipeline writes: the real Diffusers classes (transformer, video and audio VAEs,
text connectors, vocoder) and a 2-layer Gemma 3 text encoder with an offline tokenizer, every tensor seeded noise (so
a swapped name shows).

Layouts:
- ``release``: every model at the sizes of the tiny release the LTX-2 repository wrote (../shared/fixtures/ltx2,
  made by Lightricks' ltx_core), so that file exports with this folder as --base. Its vocoder reads 128 mel channels
  while its audio VAE makes 2 x 16 (the fixture's own sizes): it renders frames, not audio.
- ``render``: small models whose sizes fit together (Diffusers' own pipeline tests' sizes): it renders frames and audio.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import pipeline_command, randomize_  # noqa: E402

LAYOUTS = ("release", "render")
TEXT_WIDTH, TEXT_LAYERS = 24, 2  # the Gemma 3 stand-in: its stacked hidden states are (layers + 1) x width wide
TEXT_LENGTH = 16
WORDS = "a an the of on in with panda cat dog robot playing dancing guitar red blue sea sky night".split()


def transformer_config(layout: str) -> dict[str, Any]:
    """Release: ../shared/fixtures/ltx2/base/transformer/config.json's values; render: Diffusers' pipeline tests'."""
    if layout == "release":
        return dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
                    audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2, audio_attention_head_dim=8,
                    audio_cross_attention_dim=16, num_layers=2, caption_channels=TEXT_WIDTH, rope_type="split")
    return dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
                audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
                audio_cross_attention_dim=8, num_layers=2, caption_channels=TEXT_WIDTH, rope_type="split",
                rope_double_precision=False)


def vae_config(layout: str) -> dict[str, Any]:
    if layout == "release":
        return dict(latent_channels=4, block_out_channels=(8, 16, 32, 64), decoder_block_out_channels=(8, 16, 32),
                    layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1), decoder_causal=False,
                    spatial_compression_ratio=32, temporal_compression_ratio=8)
    return dict(latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,), layers_per_block=(1,),
                decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,), decoder_spatio_temporal_scaling=(True,),
                decoder_inject_noise=(False, False), downsample_type=("spatial",), upsample_residual=(False,),
                upsample_factor=(1,), patch_size=1, decoder_causal=False)


def audio_vae_config(layout: str) -> dict[str, Any]:
    if layout == "release":
        return dict(base_channels=8, output_channels=2, ch_mult=(1, 2, 4), num_res_blocks=1, attn_resolutions=[],
                    latent_channels=2, mel_bins=16)
    return dict(base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, resolution=32, latent_channels=2,
                mel_bins=8)


def connectors_config(layout: str) -> dict[str, Any]:
    common = dict(caption_channels=TEXT_WIDTH, text_proj_in_factor=TEXT_LAYERS + 1, rope_type="split")
    if layout == "release":
        return dict(common, video_connector_num_attention_heads=2, video_connector_attention_head_dim=12,
                    audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=12)
    return dict(common, video_connector_num_attention_heads=2, video_connector_attention_head_dim=12,
                video_connector_num_layers=1, video_connector_num_learnable_registers=None,
                audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=12,
                audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
                connector_rope_base_seq_len=32, rope_double_precision=False)


def vocoder_config(layout: str) -> dict[str, Any]:
    if layout == "release":
        return dict(in_channels=128, hidden_channels=32)
    return dict(in_channels=16, hidden_channels=32, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
                resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]], output_sampling_rate=16000)


def build_tokenizer():
    """A Gemma tokenizer that knows a few words whole and spells the rest in letters (offline, no download)."""
    from transformers import GemmaTokenizer

    vocab = {token: index for index, token in enumerate(("<pad>", "<eos>", "<bos>", "<unk>", "<mask>"))}
    for piece in [f"\u2581{word}" for word in WORDS] + list("abcdefghijklmnopqrstuvwxyz\u2581"):
        vocab.setdefault(piece, len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=[], model_max_length=TEXT_LENGTH)


def build_text_encoder(vocab_size: int):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config=dict(vocab_size=vocab_size, hidden_size=TEXT_WIDTH, intermediate_size=32,
                         num_hidden_layers=TEXT_LAYERS, num_attention_heads=2, num_key_value_heads=1, head_dim=12,
                         sliding_window=8, max_position_embeddings=64),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14), mm_tokens_per_image=4)
    return Gemma3ForConditionalGeneration(config).eval()


def build_models(layout: str = "render", seed: int = 0) -> dict[str, torch.nn.Module]:
    """Every Diffusers model of the pipeline, seeded noise in every tensor (std-like statistics kept positive)."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors, LTX2Vocoder

    classes = {"transformer": (LTX2VideoTransformer3DModel, transformer_config),
               "vae": (AutoencoderKLLTX2Video, vae_config), "audio_vae": (AutoencoderKLLTX2Audio, audio_vae_config),
               "connectors": (LTX2TextConnectors, connectors_config), "vocoder": (LTX2Vocoder, vocoder_config)}
    models = {}
    for offset, (name, (model_class, config)) in enumerate(classes.items()):
        torch.manual_seed(seed + offset)
        models[name] = randomize_(model_class(**config(layout)), seed + offset).eval()
    with torch.no_grad():
        for name in ("vae", "audio_vae"):
            models[name].latents_std.abs_().add_(0.5)
    return models


def build_transformer(layout: str = "render", seed: int = 0):
    return build_models(layout, seed)["transformer"]


def build_tiny_pipeline(layout: str = "render", seed: int = 0, task: str = "t2v"):
    import diffusers

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024, max_image_seq_len=4096,
        shift_terminal=0.1)
    pipeline = diffusers.LTX2ImageToVideoPipeline if task == "i2v" else diffusers.LTX2Pipeline
    return pipeline(tokenizer=tokenizer, text_encoder=build_text_encoder(len(tokenizer)), scheduler=scheduler,
                    **build_models(layout, seed))


def render(folder: str | os.PathLike, steps: int = 2, seed: int = 0, frames: int = 5):
    """Load FOLDER with its own pipeline class and render a few 32x32 frames and their audio: (frames, audio), as
    tensors."""
    import json

    import diffusers

    name = json.loads((Path(folder) / "model_index.json").read_text())["_class_name"]
    pipeline = getattr(diffusers, name).from_pretrained(str(folder))
    pipeline.set_progress_bar_config(disable=True)
    out = pipeline(prompt="a panda playing guitar", negative_prompt="", height=32, width=32, num_frames=frames,
                   frame_rate=25.0, num_inference_steps=steps, guidance_scale=1.0, max_sequence_length=TEXT_LENGTH,
                   generator=torch.Generator().manual_seed(seed), output_type="pt")
    return out.frames, out.audio


main = pipeline_command(
    build_tiny_pipeline, "LTX-2",
    click.option("--layout", type=click.Choice(LAYOUTS), default="render", show_default=True),
    click.option("--task", type=click.Choice(("t2v", "i2v")), default="t2v", show_default=True))


if __name__ == "__main__":
    main()
