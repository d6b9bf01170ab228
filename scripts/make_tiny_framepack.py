"""Build a tiny but complete HunyuanVideo FramePack pipeline folder, fully offline (tests).

    python scripts/make_tiny_framepack.py OUT --seed 0

OUT is what ``DiffusionPipeline.save_pretrained`` writes: ``HunyuanVideoFramepackPipeline`` with HunyuanVideo's tiny
text encoders, tokenizers and VAE (make_tiny_hunyuanvideo's), ``image_encoder`` (a 2-layer SiglipVisionModel, 32x32
images, as wide as the tiny transformer's image projection takes), ``feature_extractor`` (SiglipImageProcessor at
32x32), ``transformer`` (framepack_tiny's, same seeded weights) and the scheduler (FlowMatchEulerDiscreteScheduler,
shift 7.0). Nothing is downloaded; every model is randomly initialised from ``--seed``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never fall back to the Hub

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from framepack_tiny import TINY_IMAGE_DIM, build_tiny_transformer  # noqa: E402
from hunyuanvideo_tiny import TINY_POOLED_DIM  # noqa: E402
from make_tiny_hunyuanvideo import build_llama_tokenizer, build_text_encoder, build_vae  # noqa: E402
from tiny_models import build_clip_text_encoder, build_clip_tokenizer, pipeline_command  # noqa: E402


def build_image_encoder():
    from transformers import SiglipVisionConfig, SiglipVisionModel

    return SiglipVisionModel(SiglipVisionConfig(hidden_size=TINY_IMAGE_DIM, intermediate_size=24, num_hidden_layers=2,
                                                num_attention_heads=2, image_size=32, patch_size=8)).eval()


def build_tiny_pipeline(seed: int = 0):
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoFramepackPipeline
    from transformers import SiglipImageProcessor

    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = build_llama_tokenizer(), build_clip_tokenizer()
    return HunyuanVideoFramepackPipeline(
        text_encoder=build_text_encoder(len(tokenizer)), tokenizer=tokenizer,
        text_encoder_2=build_clip_text_encoder(len(tokenizer_2), TINY_POOLED_DIM), tokenizer_2=tokenizer_2,
        transformer=build_tiny_transformer(seed), vae=build_vae(seed),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), image_encoder=build_image_encoder(),
        feature_extractor=SiglipImageProcessor(size={"height": 32, "width": 32}))


main = pipeline_command(build_tiny_pipeline, "HunyuanVideo FramePack")


if __name__ == "__main__":
    main()
