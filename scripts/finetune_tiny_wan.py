"""Fine-tune a tiny Wan transformer in the original names under real DeepSpeed on CPU, as musubi-tuner and
DiffSynth-Studio full fine-tunes are trained (their WanModel keeps the Wan repo's names: blocks.0.self_attn.q, ...).

    python scripts/finetune_tiny_wan.py BASE OUT --world-size 2 --steps 2 --dtype bf16

BASE is a pipeline folder from make_tiny_wan.py; only BASE/transformer is read. The module DeepSpeed trains is the
Diffusers WanTransformer3DModel's own layers re-registered under the original WanModel names (the mapping below is
written from the facts page, by hand, independently of cogexport's tables): its state dict and parameter names are
the original layout's, and its forward is the Diffusers model's. Training goes through accelerate's DeepSpeed
integration (tiny_training.py, shared with the CogVideoX fine-tune), ZeRO-2, and ends with
``accelerator.save_state(OUT/checkpoint-K)``:

    OUT/checkpoint-K/pytorch_model/          the DeepSpeed tag dir (original names)
    OUT/truth.safetensors, OUT/truth.json    ground truth taken inside training: every parameter's fp32 master

ZeRO-2 only: the forward runs through the Diffusers modules, which ZeRO-3's gathering hooks would not see for the
tensors the blocks hold directly (the modulation tables). Data is random: a flow-matching loss on noised latents.
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
from tiny_training import (TRAIN_DTYPES, launch, pick, save_accelerate, start_accelerator,  # noqa: E402
                           train_accelerate)

TEXT_TOKENS = 8


def _container(**children: nn.Module) -> nn.Module:
    """A plain module holding ``children`` under the given names (indices of the original nn.Sequentials too)."""
    module = nn.Module()
    for name, child in children.items():
        module.add_module(name.lstrip("_"), child)
    return module


class OriginalNamedWan(nn.Module):
    """A WanTransformer3DModel's layers under WanModel's names; forward runs the Diffusers model."""

    def __init__(self, model) -> None:
        super().__init__()
        embedder = model.condition_embedder
        self.patch_embedding = model.patch_embedding
        self.text_embedding = _container(_0=embedder.text_embedder.linear_1, _2=embedder.text_embedder.linear_2)
        self.time_embedding = _container(_0=embedder.time_embedder.linear_1, _2=embedder.time_embedder.linear_2)
        self.time_projection = _container(_1=embedder.time_proj)
        self.blocks = nn.ModuleList(self._block(block) for block in model.blocks)
        self.head = _container(head=model.proj_out)
        self.head.modulation = model.scale_shift_table
        if embedder.image_embedder is not None:
            image = embedder.image_embedder
            self.img_emb = _container(proj=_container(_0=image.norm1, _1=image.ff.net[0].proj, _3=image.ff.net[2],
                                                      _4=image.norm2))
            if image.pos_embed is not None:
                self.img_emb.emb_pos = image.pos_embed
        object.__setattr__(self, "diffusers_model", model)  # not a child: its names must not appear

    @staticmethod
    def _block(block) -> nn.Module:
        def attention(attn, image: bool) -> nn.Module:
            parts = dict(q=attn.to_q, k=attn.to_k, v=attn.to_v, o=attn.to_out[0], norm_q=attn.norm_q,
                         norm_k=attn.norm_k)
            if image:
                parts.update(k_img=attn.add_k_proj, v_img=attn.add_v_proj, norm_k_img=attn.norm_added_k)
            return _container(**parts)

        # the original's norm3 (before cross-attention, affine) is Diffusers' norm2
        original = _container(self_attn=attention(block.attn1, False),
                              cross_attn=attention(block.attn2, block.attn2.add_k_proj is not None),
                              norm3=block.norm2, ffn=_container(_0=block.ffn.net[0].proj, _2=block.ffn.net[2]))
        original.modulation = block.scale_shift_table
        return original

    def forward(self, **inputs) -> torch.Tensor:
        return self.diffusers_model(**inputs, return_dict=False)[0]


def flow_matching_loss(engine, config, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """The rectified-flow objective Wan trains with, on made-up latents and text features."""
    generator = torch.Generator().manual_seed(1000 * step + rank)  # different data on every rank and step
    latents = torch.randn(1, config.out_channels, 2, 4, 6, generator=generator)
    noise = torch.randn(latents.shape, generator=generator)
    text = torch.randn(1, TEXT_TOKENS, config.text_dim, generator=generator)
    sigma = torch.rand(1, generator=generator)
    noisy = (1 - sigma) * latents + sigma * noise
    prediction = engine(hidden_states=noisy.to(dtype), encoder_hidden_states=text.to(dtype),
                        timestep=sigma * 1000)
    return torch.nn.functional.mse_loss(prediction.float(), noise - latents)


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed, accelerator = start_accelerator(spec, rank, world_size)
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(Path(spec["base"]) / "transformer")
    dtype = TRAIN_DTYPES[spec["dtype"]]
    model.to(dtype=dtype).requires_grad_(True).train()
    engine = train_accelerate(accelerator, OriginalNamedWan(model), spec, lambda engine, step: flow_matching_loss(
        engine, model.config, step, rank, dtype))
    save_accelerate(deepspeed, accelerator, engine, spec, rank, lambda checkpoint: {
        **pick(spec, "base", "stage", "dtype", "world_size", "steps", "lr"), "checkpoint": checkpoint,
        "names": "original (WanModel)"})


def finetune(base: str | os.PathLike, out: str | os.PathLike, *, world_size: int = 2, steps: int = 2,
             dtype: str = "bf16", lr: float = 1e-3) -> Path:
    """Run the fine-tune in ``world_size`` fresh processes; returns OUT/checkpoint-K."""
    launch(train_and_save, out, base, stage=2, world_size=world_size, steps=steps, dtype=dtype, lr=lr)
    return Path(out).resolve() / f"checkpoint-{steps}"


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
def main(base: Path, out: Path, **options) -> None:
    """Fine-tune BASE's Wan transformer in original names under DeepSpeed ZeRO-2 on CPU."""
    checkpoint = finetune(base, out, **options)
    click.echo(f"wrote {checkpoint} and {Path(out) / 'truth.safetensors'}", err=True)


if __name__ == "__main__":
    main()
