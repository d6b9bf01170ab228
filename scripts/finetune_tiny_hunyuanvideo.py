"""Fine-tune a tiny HunyuanVideo transformer in the original layout under real DeepSpeed on CPU.

    python scripts/finetune_tiny_hunyuanvideo.py OUT --stage 2 --world-size 2 --steps 2 --dtype bf16

The trained module has the original model's parameter names and shapes (``double_blocks.0.img_attn_qkv.weight``,
``single_blocks.0.linear1.weight``, ...), as a run of the HunyuanVideo repo's HYVideoDiffusionTransformer, FastVideo
or musubi-tuner has them. The original class is not installable, so the module holds exactly those parameters and
its forward hands them through Diffusers' own single-file converter to HunyuanVideoTransformer3DModel
(``torch.func.functional_call``): every original tensor trains, under its original name. The training code keeps an
EMA of the weights and saves it beside the module, as the releases' ``ema`` entry: ``engine.save_checkpoint(...,
client_state={"ema": ...})``. On disk:

    OUT/checkpoint/latest, OUT/checkpoint/global_stepK/     DeepSpeed's save dir (ZeRO-1/2/3 files)
    OUT/truth.safetensors, OUT/truth.json                  ground truth, taken inside the training process

Ground truth (make_deepspeed_checkpoint.collect_truth): every parameter's fp32 master (``safe_get_full_fp32_param``),
plus ``ema/<name>`` for the saved EMA; truth.json holds the names, the run's settings and the model config.
Data is random: latents, Llama-width text states and CLIP-width pooled states of the tiny model's sizes, and a flow
matching loss (predict noise - latents from the interpolation at a random t), as HunyuanVideo trains.
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
from hunyuanvideo_tiny import diffusers_converter, random_original_state_dict, tiny_config  # noqa: E402
from tiny_training import (TRAIN_DTYPES, OriginalLayoutModule, WeightEma, config_facts, launch,  # noqa: E402
                           save_deepspeed, train_deepspeed)

EMA_DECAY = 0.5  # large steps, so two steps move the EMA visibly away from both the start and the weights


def original_layout_transformer(config: dict, dtype: torch.dtype) -> OriginalLayoutModule:
    """HunyuanVideo's parameters under the original names; the forward runs Diffusers' model on them through
    Diffusers' own single-file converter."""
    from diffusers import HunyuanVideoTransformer3DModel

    diffusers_model = HunyuanVideoTransformer3DModel(**config).to(dtype)
    convert = diffusers_converter(config["num_attention_heads"] * config["attention_head_dim"])
    return OriginalLayoutModule(random_original_state_dict(config, seed=0), diffusers_model, convert)


def flow_matching_loss(engine, config: dict, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)  # different data on every rank and step
    latents = torch.randn(1, 16, 2, 4, 4, generator=generator)
    noise = torch.randn(latents.shape, generator=generator)
    t = torch.rand(1, generator=generator)
    noisy = (1 - t) * latents + t * noise
    text = torch.randn(1, 6, config["text_embed_dim"], generator=generator)
    pooled = torch.randn(1, config["pooled_projection_dim"], generator=generator)
    prediction = engine(hidden_states=noisy.to(dtype), timestep=t * 1000, encoder_hidden_states=text.to(dtype),
                        encoder_attention_mask=torch.ones(1, 6, dtype=torch.bool), pooled_projections=pooled.to(dtype),
                        guidance=torch.full((1,), 6000.0), return_dict=False)[0]
    return nn.functional.mse_loss(prediction.float(), noise - latents)


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    # ZeRO-0/1/2 only (the --stage choices): the forward reads every parameter by name, which ZeRO-3's per-module
    # gathering does not cover
    config, dtype = tiny_config("t2v"), TRAIN_DTYPES[spec["dtype"]]
    model = original_layout_transformer(config, dtype)
    ema = WeightEma(EMA_DECAY)
    deepspeed, engine = train_deepspeed(model, spec, lambda engine, step: flow_matching_loss(
        engine, config, step, rank, dtype), ema=ema)
    save_deepspeed(deepspeed, engine, spec, rank, client_state={"ema": ema.weights},
                   extra_tensors={f"ema/{name}": tensor for name, tensor in ema.weights.items()},
                   facts={"config": config_facts(config)})


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--stage", type=click.IntRange(0, 2), default=2, show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True)
def main(out: Path, **spec) -> None:
    """Train a tiny original-layout HunyuanVideo transformer under DeepSpeed on CPU; write OUT/checkpoint."""
    launch(train_and_save, out, save_dir="checkpoint", model="hunyuanvideo-original", **spec)
    click.echo(f"wrote {out / 'checkpoint'}", err=True)


if __name__ == "__main__":
    main()
