"""Build a tiny but complete pipeline folder of one of Wan's variants, fully offline (tests, docs, benchmarks).

    python scripts/make_tiny_wan_variants.py OUT --variant vace --seed 0

OUT is what ``DiffusionPipeline.save_pretrained`` writes for the variant's pipeline, with real Diffusers and
transformers classes at toy sizes (wan_variants_tiny.py's transformers, make_tiny_wan.py's umT5 text encoder, tokenizer,
2.1 VAE and CLIP image encoder), so the pipeline class loads it and renders a few frames on a CPU. Every model is
randomly initialised from ``--seed``; nothing is downloaded.

| variant      | pipeline                           | transformer(s)                     | CLIP | flow shift |
|--------------|------------------------------------|------------------------------------|------|------------|
| vace         | WanVACEPipeline                    | Wan2.1-VACE                        | -    | 3.0        |
| vace-a14b    | WanVACEPipeline                    | two VACE experts, boundary 0.875   | -    | 3.0        |
| animate      | WanAnimatePipeline                 | Wan2.2-Animate                     | yes  | 5.0        |
| skyreels-df  | SkyReelsV2DiffusionForcingPipeline | diffusion forcing (fps embedding)  | -    | default    |
| skyreels-t2v | SkyReelsV2Pipeline                 | T2V                                | -    | default    |
| skyreels-i2v | SkyReelsV2ImageToVideoPipeline     | I2V (CLIP image branch)            | yes  | default    |
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never let a from_pretrained reach for the Hub

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_wan import build_image_encoder  # noqa: E402
from tiny_models import build_text_encoder, build_tokenizer, pipeline_command  # noqa: E402
from wan_tiny_configs import TINY_TEXT_DIM, build_tiny_vae  # noqa: E402
from wan_variants_tiny import build_tiny_variant  # noqa: E402

# variant -> (pipeline class, transformer shape class, expert count, CLIP, pipeline settings, scheduler flow shift)
VARIANTS = {
    "vace": ("WanVACEPipeline", "vace", 1, False, {}, 3.0),
    "vace-a14b": ("WanVACEPipeline", "vace", 2, False, {"boundary_ratio": 0.875}, 3.0),
    "animate": ("WanAnimatePipeline", "animate", 1, True, {}, 5.0),
    "skyreels-df": ("SkyReelsV2DiffusionForcingPipeline", "skyreels-df", 1, False, {}, None),
    "skyreels-t2v": ("SkyReelsV2Pipeline", "skyreels-t2v", 1, False, {}, None),
    "skyreels-i2v": ("SkyReelsV2ImageToVideoPipeline", "skyreels-i2v", 1, True, {}, None),
}


def build_scheduler(flow_shift: float | None):
    from diffusers import UniPCMultistepScheduler

    shift = {} if flow_shift is None else {"flow_shift": flow_shift}
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000,
                                   **shift)


def build_tiny_pipeline(variant: str = "vace", seed: int = 0):
    """A fresh tiny pipeline of the variant, fp32 on CPU."""
    import diffusers

    pipeline_class, shape_class, experts, clip, settings, shift = VARIANTS[variant]
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    components = dict(tokenizer=tokenizer, text_encoder=build_text_encoder(len(tokenizer), TINY_TEXT_DIM, umt5=True),
                      vae=build_tiny_vae("2.1", seed), scheduler=build_scheduler(shift),
                      transformer=build_tiny_variant(shape_class, seed))
    if experts == 2:  # the low-noise expert: same shape, other weights
        components["transformer_2"] = build_tiny_variant(shape_class, seed + 1)
    if clip:
        components["image_encoder"], components["image_processor"] = build_image_encoder()
        if pipeline_class == "SkyReelsV2ImageToVideoPipeline":  # its signature (and its conversion script's) class
            components["image_encoder"] = with_projection(components["image_encoder"])
    return getattr(diffusers, pipeline_class)(**components, **settings)


def with_projection(encoder):
    """A CLIPVisionModelWithProjection of the same (tiny) config, randomly initialised."""
    from transformers import CLIPVisionModelWithProjection

    return CLIPVisionModelWithProjection(encoder.config).eval()


main = pipeline_command(build_tiny_pipeline, "Wan variant", click.option(
    "--variant", type=click.Choice(list(VARIANTS)), default="vace", show_default=True))


if __name__ == "__main__":
    main()
