"""Build a tiny but complete Kandinsky 5 video pipeline folder, fully offline (tests, docs, benchmarks).

    python scripts/make_tiny_kandinsky5.py OUT --shape-class t2v --seed 0
    python scripts/make_tiny_kandinsky5.py OUT --shape-class i2v

OUT is what ``DiffusionPipeline.save_pretrained`` writes. ``t2v``: ``Kandinsky5T2VPipeline`` with ``text_encoder`` (a
2-layer Qwen2_5_VLForConditionalGeneration with a 1-layer vision tower; the pipeline reads its last hidden states),
``tokenizer``, ``text_encoder_2`` (a 2-layer CLIPTextModel: its pooled output), ``tokenizer_2`` (a CLIP BPE
tokenizer), ``transformer``, ``vae`` (HunyuanVideo's AutoencoderKLHunyuanVideo, tiny) and the scheduler
(FlowMatchEulerDiscreteScheduler, shift 5.0). ``i2v``: ``Kandinsky5I2VPipeline`` with the same components.

The release's ``tokenizer`` is a Qwen2VLProcessor; its video processor needs torchvision, which this environment does
not install, so the tiny folder's ``tokenizer`` is the byte-level Qwen2 tokenizer the processor would wrap (the
pipelines call it with text only). Every model is randomly initialised from ``--seed``; the transformers are
kandinsky5_tiny's (same seeded weights).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never fall back to the Hub

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kandinsky5_tiny import (MODEL_TYPE, SHAPE_CLASSES, TINY_POOLED_DIM, TINY_TEXT_DIM,  # noqa: E402
                             build_tiny_transformer)
from make_tiny_hunyuanvideo import build_vae  # noqa: E402
from tiny_models import (build_clip_text_encoder, build_clip_tokenizer, build_qwen_tokenizer,  # noqa: E402
                         pipeline_command)

# what a render of the tiny pipeline sets: the template's 128-token system prompt is not cropped from a tiny model's
# few hundred byte tokens
TINY_CROP = 0


def build_text_encoder(vocab_size: int):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(vocab_size=vocab_size, hidden_size=TINY_TEXT_DIM, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TINY_TEXT_DIM,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0])
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision)).eval()


def build_tiny_pipeline(shape_class: str = "t2v", seed: int = 0):
    from diffusers import FlowMatchEulerDiscreteScheduler, Kandinsky5I2VPipeline, Kandinsky5T2VPipeline

    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = build_qwen_tokenizer(), build_clip_tokenizer()
    components = dict(text_encoder=build_text_encoder(len(tokenizer)), tokenizer=tokenizer,
                      text_encoder_2=build_clip_text_encoder(len(tokenizer_2), TINY_POOLED_DIM),
                      tokenizer_2=tokenizer_2,
                      transformer=build_tiny_transformer(shape_class, seed), vae=build_vae(seed),
                      scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0))
    pipeline_class = Kandinsky5T2VPipeline if MODEL_TYPE[shape_class] == "t2v" else Kandinsky5I2VPipeline
    return pipeline_class(**components)


def tiny_text_settings(pipeline) -> None:
    pipeline.prompt_template_encode_start_idx = TINY_CROP


main = pipeline_command(build_tiny_pipeline, "Kandinsky 5 video", click.option(
    "--shape-class", type=click.Choice(sorted(SHAPE_CLASSES)), default="t2v", show_default=True))


if __name__ == "__main__":
    main()
