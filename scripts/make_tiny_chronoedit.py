"""Build a tiny but complete ChronoEdit pipeline folder, fully offline (tests, docs).

    python scripts/make_tiny_chronoedit.py OUT --seed 0

OUT is what ``ChronoEditPipeline.save_pretrained`` writes, with real Diffusers and transformers classes at toy sizes
(make_tiny_wan.py's umT5 text encoder, tokenizer, 2.1 VAE and CLIP image encoder), so ``ChronoEditPipeline`` loads it
and edits an image in a few seconds on a CPU. The transformer is a ChronoEditTransformer3DModel of the tiny Wan 2.1 I2V
shapes (ChronoEdit's weights are Wan 2.1 I2V's) with a RoPE temporal skip of 4, not the class's default 8, so that a
config that lost the setting shows. Every model is randomly initialised from ``--seed``; nothing is downloaded.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never let a from_pretrained reach for the Hub

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_wan import build_image_encoder  # noqa: E402
from tiny_models import build_text_encoder, build_tokenizer, pipeline_command, randomize_  # noqa: E402
from wan_tiny_configs import TINY_TEXT_DIM, build_tiny_vae, tiny_transformer_config  # noqa: E402

TINY_ROPE_SKIP = 4  # rope_temporal_skip_len: the class's default is 8
FLOW_SHIFT = 5.0  # nvidia/ChronoEdit-14B-Diffusers' scheduler


def build_tiny_transformer(seed: int = 0):
    """A seeded tiny ChronoEditTransformer3DModel (Wan 2.1 I2V's tiny shapes) in fp32, eval mode."""
    from diffusers import ChronoEditTransformer3DModel

    torch.manual_seed(seed)
    model = ChronoEditTransformer3DModel(**tiny_transformer_config("i2v"), rope_temporal_skip_len=TINY_ROPE_SKIP)
    return randomize_(model, seed).eval()


def build_tiny_pipeline(seed: int = 0):
    """A fresh tiny ChronoEdit pipeline, fp32 on CPU."""
    from diffusers import ChronoEditPipeline, UniPCMultistepScheduler

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    image_encoder, image_processor = build_image_encoder()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=FLOW_SHIFT)
    return ChronoEditPipeline(tokenizer=tokenizer, text_encoder=build_text_encoder(len(tokenizer), TINY_TEXT_DIM,
                                                                                   umt5=True),
                              image_encoder=image_encoder, image_processor=image_processor,
                              transformer=build_tiny_transformer(seed), vae=build_tiny_vae("2.1", seed),
                              scheduler=scheduler)


main = pipeline_command(build_tiny_pipeline, "ChronoEdit")


if __name__ == "__main__":
    main()
