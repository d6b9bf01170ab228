"""Build a tiny but complete CogVideoX pipeline folder, fully offline (tests, README demo, benchmarks).

    python scripts/make_tiny_cogvideox.py OUT --variant t2v --seed 0
    python scripts/make_tiny_cogvideox.py OUT --variant 1.5-5b-i2v

OUT is what ``DiffusionPipeline.save_pretrained`` writes: ``model_index.json`` plus ``scheduler/``,
``text_encoder/``, ``tokenizer/``, ``transformer/`` and ``vae/``, all real Diffusers / transformers classes at
toy sizes, so ``CogVideoXPipeline.from_pretrained(OUT)`` (or the image-to-video pipeline) loads it and renders
a 9-frame 32x48 clip in seconds on a CPU. Nothing is downloaded: the tokenizer is a T5 Unigram tokenizer over
a written-out vocabulary of about a hundred pieces; every model is randomly initialised from ``--seed``.

The transformer and VAE are exactly the ones ``cogvideox_tiny_configs`` builds for the SAT fixtures (same
configs, same seeded weights), and the T5 width and tokenizer cap match their text_embed_dim and text length,
so a SAT or DeepSpeed fixture and a pipeline folder of the same variant and seed fit together.

Variants: the five real families (2b, 5b, 5b-i2v, 1.5-5b, 1.5-5b-i2v), each with its own VAE scaling,
1.5's inverted latent scaling and its scheduler SNR shift; ``t2v`` is short for 2b, ``i2v`` for 5b-i2v.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Local folders only: never let a from_pretrained fall back to the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cogvideox_tiny_configs import (  # noqa: E402
    TINY_TEXT_EMBED_DIM,
    VARIANTS as FAMILIES,
    build_tiny_transformer,
    full_vae_config,
    tiny_vae_config,
)
from tiny_models import build_text_encoder, build_tokenizer, pipeline_command, randomize_  # noqa: E402

ALIASES = {"t2v": "2b", "i2v": "5b-i2v"}
VARIANT_CHOICES = (*ALIASES, *FAMILIES)

def family(variant: str) -> str:
    """The real model family a variant name stands for ("t2v" -> "2b", "i2v" -> "5b-i2v")."""
    name = ALIASES.get(variant, variant)
    if name not in FAMILIES:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANT_CHOICES)}")
    return name


def pipeline_class_name(variant: str) -> str:
    return "CogVideoXImageToVideoPipeline" if family(variant).endswith("i2v") else "CogVideoXPipeline"


def build_vae(variant: str, seed: int):
    """The shared tiny VAE (same weights as ``build_tiny_vae(seed)``) with the family's latent scaling."""
    from diffusers import AutoencoderKLCogVideoX

    torch.manual_seed(seed)
    vae = AutoencoderKLCogVideoX(**tiny_vae_config(), **full_vae_config(family(variant)))
    return randomize_(vae, seed).eval()


def build_transformer(variant: str, seed: int):
    """The shared tiny transformer; learned positions stored in fp32 like every other tensor."""
    transformer = build_tiny_transformer(family(variant), seed=seed)
    if transformer.config.use_learned_positional_embeddings:
        # Diffusers keeps this buffer in float64 (its sin-cos init); real checkpoints store it like the weights.
        transformer.patch_embed.pos_embedding.data = transformer.patch_embed.pos_embedding.data.float()
    return transformer


def build_scheduler(variant: str):
    """The scheduler every CogVideoX family ships with; only the SNR shift differs (3.0 for 2b, else 1.0)."""
    from diffusers import CogVideoXDDIMScheduler

    return CogVideoXDDIMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=True,
        steps_offset=0,
        prediction_type="v_prediction",
        timestep_spacing="trailing",
        rescale_betas_zero_snr=True,
        snr_shift_scale=3.0 if family(variant) == "2b" else 1.0,
    )


def build_tiny_pipeline(variant: str = "t2v", seed: int = 0):
    """A fresh tiny CogVideoXPipeline or CogVideoXImageToVideoPipeline, fp32 on CPU."""
    import diffusers

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    text_encoder = build_text_encoder(len(tokenizer), TINY_TEXT_EMBED_DIM)
    return getattr(diffusers, pipeline_class_name(variant))(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=build_vae(variant, seed),
        transformer=build_transformer(variant, seed),
        scheduler=build_scheduler(variant),
    )


main = pipeline_command(build_tiny_pipeline, "CogVideoX", click.option(
    "--variant", type=click.Choice(VARIANT_CHOICES), default="t2v", show_default=True))


if __name__ == "__main__":
    main()
