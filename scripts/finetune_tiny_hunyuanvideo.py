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
from deepspeed_cpu import deepspeed_config, import_deepspeed, spawn_ranks  # noqa: E402
from hunyuanvideo_tiny import diffusers_converter, random_original_state_dict, tiny_config  # noqa: E402
from make_deepspeed_checkpoint import collect_truth, write_truth  # noqa: E402

EMA_DECAY = 0.5  # large steps, so two steps move the EMA visibly away from both the start and the weights


class OriginalLayoutTransformer(nn.Module):
    """HunyuanVideo's parameters under the original names; the forward runs Diffusers' model on them."""

    def __init__(self, config: dict, seed: int) -> None:
        super().__init__()
        from diffusers import HunyuanVideoTransformer3DModel

        for name, tensor in random_original_state_dict(config, seed).items():
            owner = self
            *path, leaf = name.split(".")
            for part in path:
                if part not in owner._modules:
                    owner.add_module(part, nn.Module())
                owner = owner._modules[part]
            owner.register_parameter(leaf, nn.Parameter(tensor))
        # kept out of the module tree: its own parameters are placeholders, replaced on every call
        self._diffusers = [HunyuanVideoTransformer3DModel(**config).requires_grad_(False)]
        self._convert = diffusers_converter(config["num_attention_heads"] * config["attention_head_dim"])

    def forward(self, **inputs) -> torch.Tensor:
        weights = self._convert(dict(self.named_parameters()))
        inputs = {**inputs, "return_dict": False}
        return torch.func.functional_call(self._diffusers[0], weights, args=(), kwargs=inputs)[0]


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
                        guidance=torch.full((1,), 6000.0))
    return nn.functional.mse_loss(prediction.float(), noise - latents)


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed = import_deepspeed()
    config = tiny_config("t2v")
    model = OriginalLayoutTransformer(config, seed=0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    model._diffusers[0].to(dtype)
    ds_config = deepspeed_config(spec["stage"], spec["dtype"], lr=1e-2)
    if spec["stage"] == 3:
        raise click.UsageError("the forward reads every parameter by name, which ZeRO-3's per-module gathering "
                               "does not cover; use stage 1 or 2")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=ds_config)
    ema = {name: param.detach().float().clone() for name, param in engine.module.named_parameters()}
    for step in range(spec["steps"]):
        loss = flow_matching_loss(engine, config, step, rank, dtype)
        engine.backward(loss)
        engine.step()
        for name, param in engine.module.named_parameters():
            ema[name].mul_(EMA_DECAY).add_(param.detach().float(), alpha=1 - EMA_DECAY)
    engine.save_checkpoint(spec["save_dir"], client_state={"ema": ema})
    truth = collect_truth(deepspeed, engine, spec["stage"])
    if rank == 0:
        truth["tensors"].update({f"ema/{name}": tensor for name, tensor in ema.items()})
        truth["config"] = {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
        write_truth(truth, spec, Path(spec["out"]))
    deepspeed.comm.barrier()


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--stage", type=click.IntRange(0, 2), default=2, show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(["bf16", "fp32"]), default="bf16", show_default=True)
def main(out: Path, **spec) -> None:
    """Train a tiny original-layout HunyuanVideo transformer under DeepSpeed on CPU; write OUT/checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    spec.update(out=str(out), save_dir=str(out / "checkpoint"), model="hunyuanvideo-original")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(train_and_save, spec["world_size"], spec)
    click.echo(f"wrote {out / 'checkpoint'}", err=True)


if __name__ == "__main__":
    main()
