"""Build a tiny but complete Wan pipeline folder, fully offline (tests, README, benchmarks).

    python scripts/make_tiny_wan.py OUT --variant t2v --seed 0
    python scripts/make_tiny_wan.py OUT --variant i2v-a14b

OUT is what ``DiffusionPipeline.save_pretrained`` writes for the variant's pipeline, with real Diffusers and
transformers classes at toy sizes, so ``WanPipeline.from_pretrained(OUT)`` (or ``WanImageToVideoPipeline``) loads it
and renders a few frames in seconds on a CPU. Nothing is downloaded: the tokenizer is the T5 Unigram tokenizer over a
written-out vocabulary that tiny_models.py builds (Wan's umT5 tokenizer is a T5 tokenizer too), the text
encoder a 2-layer UMT5EncoderModel, the image encoder a 2-layer CLIPVisionModel on 28x28 images; every model is
randomly initialised from ``--seed``.

Variants, each with the published variant's pipeline settings:

| variant  | pipeline                | transformer(s)                                  | VAE | image encoder |
|----------|-------------------------|-------------------------------------------------|-----|---------------|
| t2v      | WanPipeline             | 2.1 T2V                                         | 2.1 | -             |
| i2v      | WanImageToVideoPipeline | 2.1 I2V (CLIP image branch)                     | 2.1 | CLIP          |
| flf2v    | WanImageToVideoPipeline | 2.1 FLF2V (+ image position table)              | 2.1 | CLIP          |
| ti2v     | WanPipeline             | 2.2 TI2V-5B (48 channels), expand_timesteps     | 2.2 | -             |
| t2v-a14b | WanPipeline             | two experts, boundary_ratio 0.875               | 2.1 | -             |
| i2v-a14b | WanImageToVideoPipeline | two experts (image latents), boundary_ratio 0.9 | 2.1 | -             |
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never let a from_pretrained reach for the Hub

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import build_text_encoder, build_tokenizer, pipeline_command  # noqa: E402
from wan_tiny_configs import (TINY_IMAGE_DIM, TINY_TEXT_DIM, build_tiny_transformer,  # noqa: E402
                              build_tiny_vae)

# variant -> (pipeline class, transformer shape class, expert count, VAE version, CLIP, pipeline settings)
VARIANTS = {
    "t2v": ("WanPipeline", "t2v", 1, "2.1", False, {}),
    "i2v": ("WanImageToVideoPipeline", "i2v", 1, "2.1", True, {}),
    "flf2v": ("WanImageToVideoPipeline", "flf2v", 1, "2.1", True, {}),
    "ti2v": ("WanPipeline", "ti2v", 1, "2.2", False, {"expand_timesteps": True}),
    "t2v-a14b": ("WanPipeline", "a14b", 2, "2.1", False, {"boundary_ratio": 0.875}),
    "i2v-a14b": ("WanImageToVideoPipeline", "i2v-a14b", 2, "2.1", False, {"boundary_ratio": 0.9}),
}
FLOW_SHIFT = {"flf2v": 16.0, "ti2v": 5.0}  # the published scheduler configs' shift (3.0 for the rest)


def build_image_encoder():
    """CLIP vision at 28x28 in 14x14 patches: 5 tokens of width TINY_IMAGE_DIM (the pipeline reads hidden_states[-2])."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(hidden_size=TINY_IMAGE_DIM, intermediate_size=40, num_hidden_layers=3,
                              num_attention_heads=2, image_size=28, patch_size=14, projection_dim=16)
    processor = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    return CLIPVisionModel(config).eval(), processor


def build_scheduler(variant: str):
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                   flow_shift=FLOW_SHIFT.get(variant, 3.0))


def build_tiny_pipeline(variant: str = "t2v", seed: int = 0):
    """A fresh tiny Wan pipeline of the variant, fp32 on CPU."""
    import diffusers

    pipeline_class, shape_class, experts, vae_version, clip, settings = VARIANTS[variant]
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    components = dict(tokenizer=tokenizer, text_encoder=build_text_encoder(len(tokenizer), TINY_TEXT_DIM, umt5=True),
                      vae=build_tiny_vae(vae_version, seed), scheduler=build_scheduler(variant),
                      transformer=build_tiny_transformer(shape_class, seed))
    if experts == 2:  # the low-noise expert: same shape, other weights
        components["transformer_2"] = build_tiny_transformer(shape_class, seed + 1)
    if clip:
        components["image_encoder"], components["image_processor"] = build_image_encoder()
    return getattr(diffusers, pipeline_class)(**components, **settings)


main = pipeline_command(build_tiny_pipeline, "Wan", click.option(
    "--variant", type=click.Choice(list(VARIANTS)), default="t2v", show_default=True))


if __name__ == "__main__":
    main()
