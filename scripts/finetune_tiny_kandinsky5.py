"""Fine-tune a tiny Kandinsky 5 transformer on CPU gloo ranks: under real DeepSpeed, or under FSDP2 with a PyTorch
distributed (DCP) checkpoint.

    python scripts/finetune_tiny_kandinsky5.py OUT --writer deepspeed --stage 2 --world-size 2
    python scripts/finetune_tiny_kandinsky5.py OUT --writer dcp --world-size 2

The trained module is Diffusers' Kandinsky5Transformer3DModel, whose parameter names are the kandinsky-5 repo's
DiffusionTransformer3D's (the release file's) too: a run of the repo's trainer, musubi-tuner or a Diffusers-based
trainer has these names. ``deepspeed``: ``engine.save_checkpoint`` into OUT/checkpoint. ``dcp``: each visual block and
then the root sharded with ``fully_shard``, AdamW, ``dcp.save({"model": ..., "optimizer": ..., "step": ...})`` into
OUT/run/checkpoint after each step.

Ground truth, taken inside the training process: deepspeed, every parameter's fp32 master
(make_deepspeed_checkpoint.collect_truth); dcp, the model's full state dict (``get_model_state_dict(
full_state_dict=True)``). truth.json holds the names, the settings and the model config. Data is random, of the tiny
model's sizes, with a flow-matching loss on the visual latents (the condition channels filled as the I2V pipeline
fills them).
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
from kandinsky5_tiny import LATENT, build_tiny_transformer  # noqa: E402
from tiny_training import (SAVE_DIRS, TRAIN_DTYPES, config_facts, gloo_group, launch, save_deepspeed,  # noqa: E402
                           train_deepspeed, train_fsdp2_and_save)


def flow_matching_loss(model, config: dict, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)  # different data on every rank and step
    latents = torch.randn(1, 2, 4, 4, LATENT, generator=generator)  # (batch, frames, height, width, channels)
    noise = torch.randn(latents.shape, generator=generator)
    t = torch.rand(1, generator=generator)
    condition = torch.cat([latents, torch.ones(1, 2, 4, 4, 1)], dim=-1)
    visual = torch.cat([(1 - t) * noise + t * latents, condition], dim=-1)
    text = torch.randn(1, 6, config["in_text_dim"], generator=generator)
    pooled = torch.randn(1, config["in_text_dim2"], generator=generator)
    prediction = model(hidden_states=visual.to(dtype), encoder_hidden_states=text.to(dtype),
                       timestep=t.to(dtype), pooled_projections=pooled.to(dtype),
                       visual_rope_pos=[torch.arange(2), torch.arange(2), torch.arange(2)],
                       text_rope_pos=torch.arange(6), return_dict=False)
    return nn.functional.mse_loss(prediction.float(), latents - noise)


def deepspeed_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    model = build_tiny_transformer("t2v", seed=0).train()
    dtype = TRAIN_DTYPES[spec["dtype"]]
    deepspeed, engine = train_deepspeed(model, spec, lambda engine, step: flow_matching_loss(
        engine, dict(model.config), step, rank, dtype))
    save_deepspeed(deepspeed, engine, spec, rank, facts={"config": config_facts(model.config)})


def dcp_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    with gloo_group(rendezvous, rank, world_size):
        model = build_tiny_transformer("t2v", seed=0).train()
        train_fsdp2_and_save(model, model.visual_transformer_blocks, spec, rank, lambda model, step:
                             flow_matching_loss(model, dict(model.config), step, rank, torch.float32))


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--writer", type=click.Choice(list(SAVE_DIRS)), default="deepspeed", show_default=True)
@click.option("--stage", type=click.IntRange(0, 3), default=2, show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
# fp32 by default: the model computes its time embedding in fp32 (Diffusers keeps time_embeddings and the modulations
# in fp32, _keep_in_fp32_modules), which a DeepSpeed bf16 engine's all-bf16 module would not take
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="fp32", show_default=True)
def main(out: Path, **spec) -> None:
    """Train a tiny Kandinsky 5 transformer on CPU; write OUT/checkpoint (DeepSpeed) or OUT/run/checkpoint (DCP)."""
    folder = SAVE_DIRS[spec["writer"]]
    rank_main = deepspeed_run if spec["writer"] == "deepspeed" else dcp_run
    launch(rank_main, out, save_dir=folder, model="kandinsky5", **spec)
    click.echo(f"wrote {out / folder}", err=True)


if __name__ == "__main__":
    main()
