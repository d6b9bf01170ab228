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
from kandinsky5_tiny import LATENT, build_tiny_transformer  # noqa: E402
from make_deepspeed_checkpoint import collect_truth, write_truth  # noqa: E402


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


def train_deepspeed(rank: int, spec: dict) -> None:
    deepspeed = import_deepspeed()
    model = build_tiny_transformer("t2v", seed=0).train()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    ds_config = deepspeed_config(spec["stage"], spec["dtype"], lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=ds_config)
    for step in range(spec["steps"]):
        engine.backward(flow_matching_loss(engine, dict(model.config), step, rank, dtype))
        engine.step()
    engine.save_checkpoint(spec["save_dir"])
    truth = collect_truth(deepspeed, engine, spec["stage"])
    if rank == 0:
        truth["config"] = {k: list(v) if isinstance(v, tuple) else v for k, v in dict(model.config).items()}
        write_truth(truth, spec, Path(spec["out"]))
    deepspeed.comm.barrier()


def train_dcp(rank: int, world_size: int, spec: dict) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
        get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = build_tiny_transformer("t2v", seed=0).train()
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.visual_transformer_blocks:
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
@click.option("--stage", type=click.IntRange(0, 3), default=2, show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
# fp32 by default: the model computes its time embedding in fp32 (Diffusers keeps time_embeddings and the modulations
# in fp32, _keep_in_fp32_modules), which a DeepSpeed bf16 engine's all-bf16 module would not take
@click.option("--dtype", type=click.Choice(["bf16", "fp32"]), default="fp32", show_default=True)
def main(out: Path, **spec) -> None:
    """Train a tiny Kandinsky 5 transformer on CPU; write OUT/checkpoint (DeepSpeed) or OUT/run/checkpoint (DCP)."""
    out.mkdir(parents=True, exist_ok=True)
    folder = out / "checkpoint" if spec["writer"] == "deepspeed" else out / "run" / "checkpoint"
    spec.update(out=str(out), save_dir=str(folder), model="kandinsky5")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(train_and_save, spec["world_size"], spec)
    click.echo(f"wrote {folder}", err=True)


if __name__ == "__main__":
    main()
