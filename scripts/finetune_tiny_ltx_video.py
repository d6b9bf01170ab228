"""Fine-tune a tiny LTX-Video transformer under real DeepSpeed on CPU, as Diffusers-based trainers (finetrainers,
diffusers' training scripts) do: the Diffusers LTXVideoTransformer3DModel is the DeepSpeed module, so the checkpoint's
names are Diffusers names.

    python scripts/finetune_tiny_ltx_video.py BASE OUT --stage 2 --world-size 2 --steps 2 --dtype bf16

BASE is a pipeline folder from make_tiny_ltx_video.py (only BASE/transformer is read). OUT/checkpoint/ is the
DeepSpeed save dir; OUT/truth.safetensors and OUT/truth.json are the ground truth taken inside the training process
(every trainable parameter's fp32 master, as make_deepspeed_checkpoint.py takes it). Data is random: latents and
caption features of the base model's sizes, a rectified-flow velocity loss (LTX-Video's objective).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_training import TRAIN_DTYPES, launch, save_deepspeed, train_deepspeed  # noqa: E402

FRAMES, HEIGHT, WIDTH, TEXT = 2, 2, 2, 4  # latent grid and caption tokens of one random sample


def flow_loss(engine, config, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Velocity MSE on one random sample: noise - latents, predicted from the interpolated latents at sigma."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    tokens = FRAMES * HEIGHT * WIDTH
    latents = torch.randn(1, tokens, config.in_channels, generator=generator)
    noise = torch.randn(1, tokens, config.in_channels, generator=generator)
    caption = torch.randn(1, TEXT, config.caption_channels, generator=generator)
    sigma = torch.rand(1, generator=generator)
    noisy = (1 - sigma) * latents + sigma * noise
    prediction = engine(hidden_states=noisy.to(dtype), encoder_hidden_states=caption.to(dtype),
                        timestep=(sigma * 1000).to(dtype), encoder_attention_mask=torch.ones(1, TEXT),
                        num_frames=FRAMES, height=HEIGHT, width=WIDTH, return_dict=False)[0]
    return torch.nn.functional.mse_loss(prediction.float(), noise - latents)


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    from diffusers import LTXVideoTransformer3DModel

    transformer = LTXVideoTransformer3DModel.from_pretrained(Path(spec["base"]) / "transformer").train()
    dtype = TRAIN_DTYPES[spec["dtype"]]
    deepspeed, engine = train_deepspeed(transformer, spec, lambda engine, step: flow_loss(
        engine, engine.module.config, step, rank, dtype), lr=1e-3)
    save_deepspeed(deepspeed, engine, spec, rank)


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--stage", type=click.Choice(["1", "2", "3"]), default="2", show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True)
def main(base: Path, out: Path, stage: str, world_size: int, steps: int, dtype: str) -> None:
    """Fine-tune BASE's transformer under DeepSpeed on CPU; write OUT/checkpoint and the ground truth."""
    launch(train_and_save, out, base, save_dir="checkpoint", stage=int(stage), world_size=world_size, steps=steps,
           dtype=dtype, model="ltx-video")
    click.echo(f"wrote {out / 'checkpoint'} and {out / 'truth.safetensors'}", err=True)


if __name__ == "__main__":
    main()
