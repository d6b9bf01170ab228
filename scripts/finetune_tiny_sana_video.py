"""Fine-tune a tiny SanaVideo transformer on CPU gloo ranks under FSDP2 and save PyTorch distributed (DCP) checkpoints,
as a SimpleTuner ``sanavideo`` run under FSDP2 does (the Diffusers class trained, Diffusers' names).

    python scripts/finetune_tiny_sana_video.py OUT --world-size 2

Each transformer block and then the root sharded with ``fully_shard``, AdamW, ``dcp.save({"model": ...,
"optimizer": ..., "step": ...})`` into OUT/run/checkpoint after each step. Ground truth, taken inside the training
process: the model's full state dict (``get_model_state_dict(full_state_dict=True)``) in OUT/truth.safetensors, its
names, the settings and the model config in OUT/truth.json. Data is random, of the tiny model's sizes, with a
flow-matching loss on the video latents.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_sana_video import build_transformer  # noqa: E402
from tiny_training import SAVE_DIRS, gloo_group, launch, train_fsdp2_and_save  # noqa: E402


def flow_matching_loss(model, config: dict, step: int, rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)  # different data on every rank and step
    latents = torch.randn(1, config["in_channels"], 2, 4, 4, generator=generator)  # (batch, channels, f, h, w)
    noise = torch.randn(latents.shape, generator=generator)
    t = torch.rand(1, generator=generator)
    text = torch.randn(1, 6, config["caption_channels"], generator=generator)
    prediction = model(hidden_states=(1 - t) * noise + t * latents, encoder_hidden_states=text,
                       timestep=t * 1000, return_dict=False)[0]
    return nn.functional.mse_loss(prediction, noise - latents)


def dcp_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    with gloo_group(rendezvous, rank, world_size):
        model = build_transformer(seed=0).train()
        train_fsdp2_and_save(model, model.transformer_blocks, spec, rank, lambda model, step:
                             flow_matching_loss(model, dict(model.config), step, rank))


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
def main(out: Path, **spec) -> None:
    """Train a tiny SanaVideo transformer on CPU under FSDP2; write OUT/run/checkpoint (DCP)."""
    spec.update(writer="dcp", stage=0, dtype="fp32")
    launch(dcp_run, out, save_dir=SAVE_DIRS["dcp"], model="sana_video", **spec)
    click.echo(f"wrote {out / SAVE_DIRS['dcp']}", err=True)


if __name__ == "__main__":
    main()
