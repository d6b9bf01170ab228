"""Fine-tune a tiny SanaVideo transformer on CPU gloo ranks, as a SimpleTuner ``sanavideo`` run does (the Diffusers
class trained, Diffusers' names), under FSDP2 with PyTorch distributed (DCP) saves or under DeepSpeed ZeRO.

    python scripts/finetune_tiny_sana_video.py OUT --world-size 2                                  # FSDP2 + dcp.save
    python scripts/finetune_tiny_sana_video.py OUT --writer deepspeed --stage 2 --dtype bf16       # DeepSpeed ZeRO-2

- ``dcp``: each transformer block and then the root sharded with ``fully_shard``, AdamW, ``dcp.save({"model": ...,
  "optimizer": ..., "step": ...})`` into OUT/run/checkpoint after each step. Ground truth, taken inside the training
  process: the model's full state dict (``get_model_state_dict(full_state_dict=True)``) in OUT/truth.safetensors, its
  names, the settings and the model config in OUT/truth.json.
- ``deepspeed``: a real DeepSpeed ZeRO engine (the stage and training dtype given); OUT/checkpoint/ is its save dir;
  OUT/truth.* every trainable parameter's fp32 master taken from the live engine (make_deepspeed_checkpoint.py's
  ground truth).

Data is random, of the tiny model's sizes, with a flow-matching loss on the video latents.
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
from tiny_training import (SAVE_DIRS, TRAIN_DTYPES, gloo_group, launch, save_deepspeed,  # noqa: E402
                           train_deepspeed, train_fsdp2_and_save)


def flow_matching_loss(model, config: dict, step: int, rank: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)  # different data on every rank and step
    latents = torch.randn(1, config["in_channels"], 2, 4, 4, generator=generator)  # (batch, channels, f, h, w)
    noise = torch.randn(latents.shape, generator=generator)
    t = torch.rand(1, generator=generator)
    text = torch.randn(1, 6, config["caption_channels"], generator=generator)
    # a DeepSpeed engine has cast the model to its training dtype: the inputs go in that dtype
    prediction = model(hidden_states=((1 - t) * noise + t * latents).to(dtype), encoder_hidden_states=text.to(dtype),
                       timestep=(t * 1000).to(dtype), return_dict=False)[0]
    return nn.functional.mse_loss(prediction.float(), noise - latents)


def dcp_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    with gloo_group(rendezvous, rank, world_size):
        model = build_transformer(seed=0).train()
        train_fsdp2_and_save(model, model.transformer_blocks, spec, rank, lambda model, step:
                             flow_matching_loss(model, dict(model.config), step, rank))


def deepspeed_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    dtype = TRAIN_DTYPES[spec["dtype"]]
    deepspeed, engine = train_deepspeed(build_transformer(seed=0).train(), spec, lambda engine, step:
                                        flow_matching_loss(engine, dict(engine.module.config), step, rank, dtype))
    save_deepspeed(deepspeed, engine, spec, rank)


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--writer", type=click.Choice(sorted(SAVE_DIRS)), default="dcp", show_default=True)
@click.option("--stage", type=click.Choice(["1", "2", "3"]), default="2", show_default=True,
              help="DeepSpeed's ZeRO stage (FSDP2 runs have none).")
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True,
              help="DeepSpeed's training precision (FSDP2 runs train in fp32).")
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
def main(out: Path, writer: str, stage: str, dtype: str, **spec) -> None:
    """Train a tiny SanaVideo transformer on CPU; write OUT/run/checkpoint (DCP) or OUT/checkpoint (DeepSpeed)."""
    if writer == "dcp":
        spec.update(writer="dcp", stage=0, dtype="fp32")  # the settings the DCP fixture has always recorded
        launch(dcp_run, out, save_dir=SAVE_DIRS["dcp"], model="sana_video", **spec)
    else:
        launch(deepspeed_run, out, save_dir=SAVE_DIRS["deepspeed"], model="sana_video", writer=writer,
               stage=int(stage), dtype=dtype, **spec)
    click.echo(f"wrote {out / SAVE_DIRS[writer]}", err=True)


if __name__ == "__main__":
    main()
