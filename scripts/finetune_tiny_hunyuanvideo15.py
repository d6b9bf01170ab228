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

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import deepspeed_config, import_deepspeed, spawn_ranks  # noqa: E402
from hunyuanvideo15_tiny import (LATENT, build_tiny_transformer, random_original_state_dict,  # noqa: E402
                                 reference_to_diffusers, tiny_config)
from make_deepspeed_checkpoint import collect_truth, write_truth  # noqa: E402

SHAPE_CLASS = "t2v"


class OriginalLayoutTransformer(nn.Module):
    """HunyuanVideo 1.5's parameters under the original names; the forward runs Diffusers' model on them."""

    def __init__(self, config: dict, seed: int) -> None:
        super().__init__()
        from diffusers import HunyuanVideo15Transformer3DModel

        for name, tensor in random_original_state_dict(config, seed).items():
            owner = self
            *path, leaf = name.split(".")
            for part in path:
                if part not in owner._modules:
                    owner.add_module(part, nn.Module())
                owner = owner._modules[part]
            owner.register_parameter(leaf, nn.Parameter(tensor))
        # kept out of the module tree: its own parameters are placeholders, replaced on every call
        self._diffusers = [HunyuanVideo15Transformer3DModel(**config).requires_grad_(False)]

    def forward(self, **inputs) -> tuple[torch.Tensor]:
        weights = reference_to_diffusers(dict(self.named_parameters()))
        return torch.func.functional_call(self._diffusers[0], weights, args=(), kwargs=inputs)


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


def train_deepspeed(rank: int, spec: dict) -> None:
    deepspeed = import_deepspeed()
    config = tiny_config(SHAPE_CLASS)
    model = OriginalLayoutTransformer(config, seed=0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    model._diffusers[0].to(dtype)
    if spec["stage"] == 3:
        raise click.UsageError("the forward reads every parameter by name, which ZeRO-3's per-module gathering "
                               "does not cover; use stage 1 or 2")
    ds_config = deepspeed_config(spec["stage"], spec["dtype"], lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=ds_config)
    for step in range(spec["steps"]):
        engine.backward(flow_matching_loss(engine, config, step, rank, dtype))
        engine.step()
    engine.save_checkpoint(spec["save_dir"])
    truth = collect_truth(deepspeed, engine, spec["stage"])
    if rank == 0:
        truth["config"] = {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
        write_truth(truth, spec, Path(spec["out"]))
    deepspeed.comm.barrier()


def train_dcp(rank: int, world_size: int, spec: dict) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
        get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = build_tiny_transformer(SHAPE_CLASS, seed=0).train()
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.transformer_blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(1, spec["steps"] + 1):
        flow_matching_loss(model, dict(model.config), step, rank, torch.float32).backward()
        optimizer.step()
        optimizer.zero_grad()
        state = {"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, optimizer), "step": step}
        dcp.save(state, checkpoint_id=spec["save_dir"])
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        from safetensors.torch import save_file

        save_file({name: t.detach().clone().contiguous() for name, t in weights.items()},
                  Path(spec["out"]) / "truth.safetensors")
        truth = {"order": list(weights), "config": dict(model.config), "step": spec["steps"],
                 "settings": {k: spec[k] for k in ("writer", "world_size", "steps")}}
        (Path(spec["out"]) / "truth.json").write_text(json.dumps(truth, indent=1, default=str))


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    if spec["writer"] == "deepspeed":
        train_deepspeed(rank, spec)
        return
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world_size)
    try:
        train_dcp(rank, world_size, spec)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--writer", type=click.Choice(["deepspeed", "dcp"]), default="deepspeed", show_default=True)
@click.option("--stage", type=click.IntRange(0, 2), default=2, show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(["bf16", "fp32"]), default="bf16", show_default=True)
def main(out: Path, **spec) -> None:
    """Train a tiny HunyuanVideo 1.5 transformer on CPU; write OUT/checkpoint (DeepSpeed) or OUT/run/checkpoint
    (DCP)."""
    out.mkdir(parents=True, exist_ok=True)
    folder = out / "checkpoint" if spec["writer"] == "deepspeed" else out / "run" / "checkpoint"
    spec.update(out=str(out), save_dir=str(folder), model="hunyuanvideo15-original")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(train_and_save, spec["world_size"], spec)
    click.echo(f"wrote {folder}", err=True)


if __name__ == "__main__":
    main()
