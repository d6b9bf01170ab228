"""Fine-tune a tiny LTX-2 transformer on CPU ranks the way Diffusers-based trainers do (the Diffusers
LTX2VideoTransformer3DModel is the trained module, so checkpoints hold Diffusers names), and save it as the trainer
saves it:

    python scripts/finetune_tiny_ltx2.py BASE OUT --writer deepspeed --stage 3 --world-size 2 --dtype bf16
    python scripts/finetune_tiny_ltx2.py BASE OUT --writer plain --world-size 2        # FSDP2 + dcp.save
    python scripts/finetune_tiny_ltx2.py BASE OUT --writer torchtitan --world-size 2   # FSDP2, torchtitan's layout

BASE is a pipeline folder from make_tiny_ltx2.py (only BASE/transformer is read). Writers:
- ``deepspeed``: a real DeepSpeed ZeRO engine; OUT/checkpoint/ is its save dir; OUT/truth.* every trainable
  parameter's fp32 master taken inside training (make_deepspeed_checkpoint.py's ground truth).
- ``plain`` / ``torchtitan``: FSDP2 (fully_shard per block, then the root) and torch.distributed.checkpoint, saved as
  ``dcp.save({"model": ..., "optimizer": ...})`` in OUT/run/checkpoint/, or torchtitan's OUT/run/checkpoint/step-N/ with
  the model's keys at the top level; OUT/truth.* the full state dict gathered inside training
  (make_dcp_checkpoint.py's ground truth, plus the model's config).

Data is random: video and audio latents and caption features of the base model's sizes, LTX-2's rectified-flow
velocity loss on both streams.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_training import (TRAIN_DTYPES, gloo_group, launch, save_dcp, save_deepspeed, train_deepspeed,  # noqa: E402
                           train_fsdp2)

WRITERS = ("deepspeed", "plain", "torchtitan")
FRAMES, HEIGHT, WIDTH, AUDIO_FRAMES, TEXT = 2, 2, 2, 4, 4  # latent grids and caption tokens of one random sample


def flow_loss(model, config, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Velocity MSE on one random sample, video and audio: noise - latents, from the latents interpolated at sigma."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    video = torch.randn(1, FRAMES * HEIGHT * WIDTH, config.in_channels, generator=generator)
    audio = torch.randn(1, AUDIO_FRAMES, config.audio_in_channels, generator=generator)
    video_noise, audio_noise = torch.randn_like(video), torch.randn_like(audio)
    caption = torch.randn(1, TEXT, config.caption_channels, generator=generator)
    sigma = torch.rand(1, generator=generator)
    noisy_video, noisy_audio = (1 - sigma) * video + sigma * video_noise, (1 - sigma) * audio + sigma * audio_noise
    video_out, audio_out = model(
        hidden_states=noisy_video.to(dtype), audio_hidden_states=noisy_audio.to(dtype),
        encoder_hidden_states=caption.to(dtype), audio_encoder_hidden_states=caption.to(dtype),
        timestep=(sigma * 1000).to(dtype), encoder_attention_mask=torch.ones(1, TEXT),
        audio_encoder_attention_mask=torch.ones(1, TEXT), num_frames=FRAMES, height=HEIGHT, width=WIDTH,
        audio_num_frames=AUDIO_FRAMES, fps=25.0, return_dict=False)
    return torch.nn.functional.mse_loss(video_out.float(), video_noise - video) + \
        torch.nn.functional.mse_loss(audio_out.float(), audio_noise - audio)


def load_transformer(spec: dict):
    from diffusers import LTX2VideoTransformer3DModel

    return LTX2VideoTransformer3DModel.from_pretrained(Path(spec["base"]) / "transformer").train()


def deepspeed_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    dtype = TRAIN_DTYPES[spec["dtype"]]
    deepspeed, engine = train_deepspeed(load_transformer(spec), spec, lambda engine, step: flow_loss(
        engine, engine.module.config, step, rank, dtype), lr=1e-3)
    save_deepspeed(deepspeed, engine, spec, rank)


def save_torchtitan(model, optimizer, folder: Path) -> None:
    """torchtitan's layout: the model's keys at the top level, the optimizer state flattened."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
        get_optimizer_state_dict

    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    state = {**get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer, options=flat)}
    dcp.save(state, checkpoint_id=str(folder))


def dcp_run(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    """FSDP2 and dcp.save, in the plain or the torchtitan layout; the ground truth gathered after the last step."""
    from make_dcp_checkpoint import record_truth, shard_fsdp2

    checkpoint = Path(spec["out"]) / "run" / "checkpoint"
    torchtitan = spec["writer"] == "torchtitan"

    def save(model, optimizer, step: int) -> None:
        if torchtitan:
            save_torchtitan(model, optimizer, checkpoint / f"step-{step}")
        else:
            save_dcp(model, optimizer, checkpoint, step)

    with gloo_group(rendezvous, rank, world_size):
        plain = load_transformer(spec)
        model = shard_fsdp2(plain, {"compile": False, "model": "ltx2"}, world_size)
        optimizer = train_fsdp2(model, spec, lambda model, step: flow_loss(model, plain.config, step, rank,
                                                                           torch.float32), save=save)
        last = checkpoint / f"step-{spec['steps']}" if torchtitan else checkpoint
        record_truth(model, optimizer, plain, {**spec, "lora_rank": None, "compile": False}, rank,
                     str(last.relative_to(Path(spec["out"]))))
        if rank == 0:
            path = Path(spec["out"]) / "truth.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "config": dict(plain.config)}, indent=1,
                                       default=str))


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--writer", type=click.Choice(WRITERS), default="deepspeed", show_default=True)
@click.option("--stage", type=click.Choice(["1", "2", "3"]), default="2", show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True,
              help="DeepSpeed's training precision (FSDP2 runs train in fp32).")
def main(base: Path, out: Path, writer: str, stage: str, world_size: int, steps: int, dtype: str) -> None:
    """Fine-tune BASE's transformer on CPU ranks; write OUT (the trainer's checkpoint) and the ground truth."""
    launch(deepspeed_run if writer == "deepspeed" else dcp_run, out, base, save_dir="checkpoint", stage=int(stage),
           world_size=world_size, steps=steps, dtype=dtype, writer=writer, model="ltx2")
    click.echo(f"wrote {out} and its ground truth", err=True)


if __name__ == "__main__":
    main()
