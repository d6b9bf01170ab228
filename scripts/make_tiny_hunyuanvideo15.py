"""Build a tiny but complete HunyuanVideo 1.5 pipeline folder, fully offline (tests, docs, benchmarks).

    python scripts/make_tiny_hunyuanvideo15.py OUT --shape-class t2v --seed 0
    python scripts/make_tiny_hunyuanvideo15.py OUT --shape-class i2v

OUT is what ``DiffusionPipeline.save_pretrained`` writes. ``t2v``: ``HunyuanVideo15Pipeline`` with ``text_encoder``
(a 3-layer Qwen2_5_VLTextModel: the pipeline reads the hidden states two layers before the last), ``tokenizer`` (a
byte-level Qwen2 tokenizer with a ChatML template), ``text_encoder_2`` (a 2-layer T5 encoder, the glyph ByT5's
class) with ``tokenizer_2`` (ByT5's byte tokenizer, which needs no vocabulary), ``guider`` (ClassifierFreeGuidance,
6.0), ``transformer``, ``vae`` (AutoencoderKLHunyuanVideo15, 4 latent channels) and the scheduler
(FlowMatchEulerDiscreteScheduler, shift 5.0). ``i2v`` / ``meanflow``: ``HunyuanVideo15ImageToVideoPipeline``, adding
``image_encoder`` (a 2-layer SiglipVisionModel) and ``feature_extractor`` (its SiglipImageProcessor). Every model is
randomly initialised from ``--seed``; the transformers are hunyuanvideo15_tiny's (same seeded weights), so fixtures
and pipeline folders of one shape class and seed fit together.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never fall back to the Hub

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hunyuanvideo15_tiny import (LATENT, MODEL_TYPE, SHAPE_CLASSES, TINY_GLYPH_DIM, TINY_IMAGE_DIM,  # noqa: E402
                                 TINY_TEXT_DIM, build_tiny_transformer)
from tiny_models import build_qwen_tokenizer, pipeline_command, randomize_  # noqa: E402

TINY_VAE = {"block_out_channels": (8, 8, 16), "layers_per_block": 1, "latent_channels": LATENT,
            "spatial_compression_ratio": 4, "temporal_compression_ratio": 4}
# what render calls set on the pipeline: the release's 1000 + 108 text tokens and 256 glyph tokens are hundreds of
# times the tiny model's work, and the tiny template has no 108-token system prompt to crop
TINY_TEXT_TOKENS, TINY_CROP, TINY_GLYPH_TOKENS, TINY_TARGET_SIZE = 32, 0, 8, 32


def build_text_encoder(vocab_size: int):
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    config = Qwen2_5_VLTextConfig(vocab_size=vocab_size, hidden_size=TINY_TEXT_DIM, intermediate_size=48,
                                  num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                                  max_position_embeddings=2048,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                   "mrope_section": [2, 2, 2]})
    return Qwen2_5_VLTextModel(config).eval()


def build_glyph_encoder(vocab_size: int):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=vocab_size, d_model=TINY_GLYPH_DIM, d_kv=4, d_ff=16, num_layers=2, num_heads=2,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      feed_forward_proj="gated-gelu", dropout_rate=0.0, pad_token_id=0, eos_token_id=1)
    return T5EncoderModel(config).eval()


def build_image_encoder():
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(hidden_size=TINY_IMAGE_DIM, intermediate_size=32, num_hidden_layers=2,
                                num_attention_heads=2, image_size=28, patch_size=14)
    return SiglipVisionModel(config).eval(), SiglipImageProcessor(size={"height": 28, "width": 28})


def build_vae(seed: int):
    from diffusers import AutoencoderKLHunyuanVideo15

    # small random weights: decoded frames stay finite through the tiny, untrained decoder
    return randomize_(AutoencoderKLHunyuanVideo15(**TINY_VAE), seed + 1, scale=0.05).eval()


def build_tiny_pipeline(shape_class: str = "t2v", seed: int = 0):
    from diffusers import (ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15ImageToVideoPipeline,
                           HunyuanVideo15Pipeline)
    from transformers import ByT5Tokenizer

    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = build_qwen_tokenizer(), ByT5Tokenizer()
    components = dict(text_encoder=build_text_encoder(len(tokenizer)), tokenizer=tokenizer,
                      text_encoder_2=build_glyph_encoder(len(tokenizer_2)), tokenizer_2=tokenizer_2,
                      guider=ClassifierFreeGuidance(guidance_scale=6.0),
                      transformer=build_tiny_transformer(shape_class, seed), vae=build_vae(seed),
                      scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0 if shape_class == "meanflow" else 5.0))
    if MODEL_TYPE[shape_class] == "t2v":
        return HunyuanVideo15Pipeline(**components)
    image_encoder, feature_extractor = build_image_encoder()
    return HunyuanVideo15ImageToVideoPipeline(image_encoder=image_encoder, feature_extractor=feature_extractor,
                                              **components)


def tiny_text_settings(pipeline) -> None:
    """What a render of a tiny pipeline sets: short text and glyph sequences, no system-prompt crop, a few image
    tokens, and (for image-to-video, whose size comes from the transformer's target_size) a 32-pixel target."""
    pipeline.tokenizer_max_length = TINY_TEXT_TOKENS
    pipeline.prompt_template_encode_start_idx = TINY_CROP
    pipeline.tokenizer_2_max_length = TINY_GLYPH_TOKENS
    pipeline.vision_num_semantic_tokens = 4
    pipeline.target_size = TINY_TARGET_SIZE


main = pipeline_command(build_tiny_pipeline, "HunyuanVideo 1.5", click.option(
    "--shape-class", type=click.Choice(sorted(SHAPE_CLASSES)), default="t2v", show_default=True))


if __name__ == "__main__":
    main()
