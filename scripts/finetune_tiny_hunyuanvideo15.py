"""Fine-tune a tiny HunyuanVideo 1.5 transformer on CPU gloo ranks: under real DeepSpeed in the original layout, or
under FSDP2 with a PyTorch distributed (DCP) checkpoint in Diffusers names.

    python scripts/finetune_tiny_hunyuanvideo15.py OUT --writer deepspeed --stage 2 --world-size 2 --dtype bf16
    python scripts/finetune_tiny_hunyuanvideo15.py OUT --writer dcp --world-size 2

``deepspeed``: the trained module has the original model's parameter names and shapes
(``double_blocks.0.img_attn_q.weight``, ``byt5_in.fc1.weight``, ...), as a run of the HunyuanVideo-1.5 repo's
train.py or a musubi-tuner full fine-tune has them. The original class is not installable, so the module holds exactly
those parameters and its forward hands them, renamed as Diffusers' conversion script renames them
(hunyuanvideo15_tiny.reference_to_diffusers), to HunyuanVideo15Transformer3DModel (``torch.func.functional_call``):
every original tensor trains under its original name. ZeRO-3 is refused: the forward reads every parameter by name,
which ZeRO-3's per-module gathering does not cover.

``dcp``: the Diffusers model, each double block and then the root sharded with ``fully_shard``, AdamW, and after each
step ``dcp.save({"model": model.state_dict(), "optimizer": ..., "step": step})`` into run/checkpoint (as a plain FSDP2
training loop of SimpleTuner- or finetrainers-style code saves it).

Ground truth, taken inside the training process: deepspeed, every parameter's fp32 master
(make_deepspeed_checkpoint.collect_truth); dcp, the model's full state dict (``get_model_state_dict(
full_state_dict=True)``). truth.json holds the names, the settings and the model config. Data is random, of the tiny
model's sizes, with a flow-matching loss; the image embeddings are not zero, so the image projection trains too.
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
from hunyuanvideo15_tiny import (LATENT, build_tiny_transformer, random_original_state_dict,  # noqa: E402
                                 reference_to_diffusers, tiny_config)
from tiny_training import (SAVE_DIRS, TRAIN_DTYPES, OriginalLayoutModule, config_facts, gloo_group,  # noqa: E402
                           launch, save_deepspeed, train_deepspeed, train_fsdp2_and_save)

SHAPE_CLASS = "t2v"


def flow_matching_loss(model, config: dict, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)  # different data on every rank and step
    latents = torch.randn(1, LATENT, 2, 4, 4, generator=generator)
    noise = torch.randn(latents.shape, generator=generator)
    t = torch.rand(1, generator=generator)
    noisy = torch.cat([(1 - t) * latents + t * noise, latents, torch.ones(1, 1, 2, 4, 4)], dim=1)
    text = torch.randn(1, 6, config["text_embed_dim"], generator=generator)
    glyph = torch.randn(1, 3, config["text_embed_2_dim"], generator=generator)
    image = torch.randn(1, 2, config["image_embed_dim"], generator=generator)
    prediction = model(hidden_states=noisy.to(dtype), timestep=(t * 1000).to(dtype),
                       encoder_hidden_states=text.to(dtype), encoder_attention_mask=torch.ones(1, 6),
                       encoder_hidden_states_2=glyph.to(dtype), encoder_attention_mask_2=torch.ones(1, 3),
                       image_embeds=image.to(dtype), return_dict=False)[0]
    return nn.functional.mse_loss(prediction.float(), noise - latents)


def original_layout_transformer(config: dict, dtype: torch.dtype) -> OriginalLayoutModule:
    """HunyuanVideo 1.5's parameters under the original names; the forward runs Diffusers' model on them."""
    from diffusers import HunyuanVideo15Transformer3DModel

    diffusers_model = HunyuanVideo15Transformer3DModel(**config).to(dtype)
    return OriginalLayoutModule(random_original_state_dict(config, seed=0), diffusers_model, reference_to_diffusers)


def deepspeed_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    # ZeRO-1/2 only (the --stage choices): the forward reads every parameter by name, which ZeRO-3's per-module
    # gathering does not cover
    config, dtype = tiny_config(SHAPE_CLASS), TRAIN_DTYPES[spec["dtype"]]
    model = original_layout_transformer(config, dtype)
    deepspeed, engine = train_deepspeed(model, spec, lambda engine, step: flow_matching_loss(
        engine, config, step, rank, dtype))
    save_deepspeed(deepspeed, engine, spec, rank, facts={"config": config_facts(config)})


def dcp_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    with gloo_group(rendezvous, rank, world_size):
        model = build_tiny_transformer(SHAPE_CLASS, seed=0).train()
        train_fsdp2_and_save(model, model.transformer_blocks, spec, rank, lambda model, step: flow_matching_loss(
            model, dict(model.config), step, rank, torch.float32))


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--writer", type=click.Choice(list(SAVE_DIRS)), default="deepspeed", show_default=True)
@click.option("--stage", type=click.IntRange(0, 2), default=2, show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True)
def main(out: Path, **spec) -> None:
    """Train a tiny HunyuanVideo 1.5 transformer on CPU; write OUT/checkpoint (DeepSpeed) or OUT/run/checkpoint
    (DCP)."""
    folder = SAVE_DIRS[spec["writer"]]
    rank_main = deepspeed_run if spec["writer"] == "deepspeed" else dcp_run
    launch(rank_main, out, save_dir=folder, model="hunyuanvideo15-original", **spec)
    click.echo(f"wrote {out / folder}", err=True)


if __name__ == "__main__":
    main()
