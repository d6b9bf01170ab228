"""Fully fine-tune a tiny transformer of one of Wan's variants two steps on CPU, as their trainers save it:

    python scripts/finetune_tiny_wan_variants.py BASE OUT --trainer deepspeed --names original --stage 2
    python scripts/finetune_tiny_wan_variants.py BASE OUT --trainer dcp

BASE is a pipeline folder from make_tiny_wan_variants.py (only BASE/transformer is read).

- ``--trainer deepspeed``: accelerate's DeepSpeed integration (tiny_training.py), ZeRO-2 or 3, bf16, saved by
  ``accelerator.save_state(OUT/checkpoint-K)``. ``--names original`` trains the model under the original repo's
  names, as DiffSynth-Studio's and musubi-tuner's full fine-tunes of Wan VACE do: the Diffusers model's layers
  re-registered under VaceWanModel's names (finetune_tiny_wan.py's hand-written WanModel naming, plus the VACE blocks
  and control embedding, written here from the facts, independently of cogexport's tables); its forward is the
  Diffusers model's. ZeRO-2 only for that (the modulation tables the blocks hold directly escape ZeRO-3's gathering
  hooks when called through the Diffusers modules). ``--names diffusers`` trains the Diffusers model as it is, as
  diffusers-based trainers do.
- ``--trainer dcp``: FSDP2 (``fully_shard`` per block, then the root) and ``torch.distributed.checkpoint.save`` of
  ``{"model": ..., "optimizer": ...}`` into OUT/run/checkpoint (fp32, Diffusers names).

Ground truth taken inside training: OUT/truth.safetensors (every trainable parameter's fp32 master, or for DCP the
full model state dict gathered with get_model_state_dict) and OUT/truth.json. The loss is made up: the output's
distance from noise on wan_variants_tiny.py's forward inputs.
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
from tiny_training import (TRAIN_DTYPES, gloo_group, launch, pick, save_accelerate, save_dcp,  # noqa: E402
                           shard_blocks, start_accelerator, train_accelerate, train_fsdp2, write_full_state_truth)
from finetune_tiny_wan import OriginalNamedWan  # noqa: E402
from wan_variants_tiny import forward_inputs  # noqa: E402


class OriginalNamedVace(OriginalNamedWan):
    """A WanVACETransformer3DModel's layers under VaceWanModel's names (VACE blocks are Wan blocks, the first with
    before_proj, every one with after_proj); forward runs the Diffusers model."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.vace_patch_embedding = model.vace_patch_embedding
        self.vace_blocks = nn.ModuleList(self._vace_block(block) for block in model.vace_blocks)

    def _vace_block(self, block) -> nn.Module:
        original = self._block(block)
        if block.proj_in is not None:
            original.before_proj = block.proj_in
        original.after_proj = block.proj_out
        return original


def shape_class_of(config: dict) -> str:
    """The wan_variants_tiny shape class a tiny transformer config is."""
    name = config["_class_name"]
    if name == "SkyReelsV2Transformer3DModel":
        return "skyreels-df" if config.get("inject_sample_info") else \
            "skyreels-i2v" if config.get("image_dim") else "skyreels-t2v"
    return {"WanVACETransformer3DModel": "vace", "WanAnimateTransformer3DModel": "animate"}[name]


def loss_of(forward, shape_class: str, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """``forward(**inputs)`` gives the model's output tensor."""
    inputs = forward_inputs(shape_class, seed=1000 * step + rank)  # other data on every rank and step
    inputs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    output = forward(**inputs).float()
    return (output - torch.randn(output.shape, generator=torch.Generator().manual_seed(step))).pow(2).mean()


def _base_model(spec: dict):
    import diffusers

    folder = Path(spec["base"]) / "transformer"
    config = json.loads((folder / "config.json").read_text())
    return getattr(diffusers, config["_class_name"]).from_pretrained(folder), shape_class_of(config)


def train_deepspeed(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed, accelerator = start_accelerator(spec, rank, world_size)
    model, shape_class = _base_model(spec)
    dtype = TRAIN_DTYPES[spec["dtype"]]
    model.to(dtype=dtype).requires_grad_(True).train()
    original = spec["names"] == "original"
    module = OriginalNamedVace(model) if original else model

    def loss(engine, step: int) -> torch.Tensor:
        # the wrapper returns the Diffusers model's output; the model itself a tuple without return_dict
        forward = engine if original else (lambda **inputs: engine(**inputs, return_dict=False)[0])
        return loss_of(forward, shape_class, step, rank, dtype)

    engine = train_accelerate(accelerator, module, spec, loss)
    save_accelerate(deepspeed, accelerator, engine, spec, rank, lambda checkpoint: {
        **pick(spec, "base", "stage", "dtype", "world_size", "steps", "lr", "names"), "checkpoint": checkpoint})


def train_dcp(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    with gloo_group(rendezvous, rank, world_size):
        model, shape_class = _base_model(spec)
        model.train()
        blocks = [block for stack in ("blocks", "vace_blocks", "face_adapter") for block in getattr(model, stack, None)
                  or ()]
        shard_blocks(model, blocks, world_size)
        optimizer = train_fsdp2(model, spec, lambda model, step: loss_of(
            lambda **inputs: model(**inputs, return_dict=False)[0], shape_class, step, rank, torch.float32),
            lr=spec["lr"])
        save_dcp(model, optimizer, Path(spec["out"]) / "run" / "checkpoint")
        write_full_state_truth(model, rank, spec["out"], {"checkpoint": "run/checkpoint", "settings": spec})


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--trainer", type=click.Choice(["deepspeed", "dcp"]), default="deepspeed", show_default=True)
@click.option("--names", type=click.Choice(["original", "diffusers"]), default="diffusers", show_default=True,
              help="DeepSpeed: train under the original repo's names (Wan VACE) or the Diffusers model's.")
@click.option("--stage", type=click.Choice(["2", "3"]), default="2", show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
def main(base: Path, out: Path, trainer: str, stage: str, **options) -> None:
    """Fine-tune BASE's transformer under DeepSpeed or FSDP2 + DCP on CPU."""
    if trainer == "deepspeed" and options["names"] == "original" and stage == "3":
        raise click.UsageError("--names original trains under ZeRO-2 only (see the module docstring)")
    launch(train_deepspeed if trainer == "deepspeed" else train_dcp, out, base, stage=int(stage), **options)
    click.echo(f"wrote {out} and {Path(out) / 'truth.safetensors'}", err=True)


if __name__ == "__main__":
    main()
