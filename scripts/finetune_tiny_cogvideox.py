"""Fine-tune a tiny CogVideoX transformer under real DeepSpeed on CPU, leaving what CogVideo's finetune/ leaves.

    python scripts/finetune_tiny_cogvideox.py BASE OUT --stage 2 --world-size 2 --steps 2 --dtype bf16
    python scripts/finetune_tiny_cogvideox.py BASE OUT --stage 2 --world-size 2 --lora-rank 4

BASE is a pipeline folder from make_tiny_cogvideox.py; only BASE/transformer and BASE/scheduler are read.
Training runs the way CogVideo's ``finetune/`` trainer runs it: accelerate's DeepSpeed integration
(``Accelerator(deepspeed_plugin=...)``, ``prepare``, ``backward``), the optimizer declared in the DeepSpeed
config, and ``accelerator.save_state(OUT/checkpoint-K)`` at the end. On disk:

    OUT/checkpoint-K/latest                             "pytorch_model"
    OUT/checkpoint-K/pytorch_model/                     the DeepSpeed tag dir (ZeRO-2 or ZeRO-3 files)
    OUT/checkpoint-K/zero_to_fp32.py, zero_to_torch.py  DeepSpeed's own consolidation scripts
    OUT/checkpoint-K/random_states_{r}.pkl              accelerate's per-rank RNG state
    OUT/checkpoint-K/pytorch_lora_weights.safetensors   LoRA runs (finetune/'s save_state hook)
    OUT/pytorch_lora_weights.safetensors                LoRA runs (the final adapter file)
    OUT/truth.safetensors, OUT/truth.json               ground truth, taken inside the training process

Module keys are plain Diffusers transformer names (the transformer is the DeepSpeed module itself); with
``--lora-rank`` peft's ``add_adapter`` wraps to_q/to_k/to_v/to_out.0, so keys read ``...to_q.base_layer.weight``
and ``...to_q.lora_A.default.weight`` and only the LoRA matrices train.

Ground truth: truth.safetensors holds every trainable parameter's fp32 master (``safe_get_full_fp32_param``),
every frozen parameter in its stored training dtype and every persistent buffer; truth.json holds the
state_dict order, the trainable / frozen / buffer names and the run's settings (LoRA rank and alpha too).
The LoRA file is written like finetune/ writes it: peft's ``get_peft_model_state_dict`` of the live module
(so training-dtype values, not fp32 masters) through ``save_lora_weights``, with no alpha metadata.

Data is random: latents and T5 embeddings of the shapes the base model takes, a v-prediction loss on
scheduler-noised latents. Every trainable parameter gets a gradient (LoRA's A from the second step on,
since B starts at zero).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_training import (TRAIN_DTYPES, add_lora, launch, pick, save_accelerate, start_accelerator,  # noqa: E402
                           train_accelerate)

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # finetune/'s default target_modules


def load_transformer(base: Path, spec: dict):
    """BASE's transformer, with a LoRA adapter added the way finetune/ adds it when a rank is given."""
    from diffusers import CogVideoXTransformer3DModel

    transformer = CogVideoXTransformer3DModel.from_pretrained(base / "transformer")
    # finetune/ moves the transformer to the training dtype before DeepSpeed sees it. DeepSpeed itself casts
    # only parameters, so this is what puts persistent buffers (I2V's learned positions) in that dtype.
    transformer.to(dtype=TRAIN_DTYPES[spec["dtype"]])
    if spec["lora_rank"]:
        add_lora(transformer, spec["lora_rank"], spec["lora_alpha"], LORA_TARGETS)
        # finetune/'s cast_training_params: the trainable LoRA matrices start in fp32.
        for param in transformer.parameters():
            if param.requires_grad:
                param.data = param.data.float()
    else:
        transformer.requires_grad_(True)
    return transformer.train()


def latent_frame_count(config) -> int:
    """Latent frames at the transformer's sample size; 1.5 pads them to a multiple of its temporal patch."""
    frames = (config.sample_frames - 1) // config.temporal_compression_ratio + 1
    if config.patch_size_t:
        frames = -(-frames // config.patch_size_t) * config.patch_size_t
    return frames


def rotary_embedding(config, latent_frames: int):
    """RoPE cos/sin for the transformer's own sample grid, built the way the pipelines build them."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    grid = (config.sample_height // config.patch_size, config.sample_width // config.patch_size)
    if config.patch_size_t is None:  # 1.0: crop coordinates over the whole grid
        return get_3d_rotary_pos_embed(config.attention_head_dim, ((0, 0), grid), grid, latent_frames)
    return get_3d_rotary_pos_embed(  # 1.5: slices of a table sized for the sample grid
        config.attention_head_dim, None, grid, latent_frames // config.patch_size_t, grid_type="slice", max_size=grid
    )


def diffusion_loss(engine, config, scheduler, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """v-prediction MSE on one random sample: the objective finetune/ trains with, on made-up data."""
    generator = torch.Generator().manual_seed(1000 * step + rank)  # different data on every rank and step
    latent_frames = latent_frame_count(config)
    shape = (1, latent_frames, config.out_channels, config.sample_height, config.sample_width)
    latents = torch.randn(shape, generator=generator)
    noise = torch.randn(shape, generator=generator)
    text = torch.randn(1, config.max_text_seq_length, config.text_embed_dim, generator=generator)
    timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (1,), generator=generator)
    noisy = scheduler.add_noise(latents, noise, timesteps)
    model_input = noisy
    if config.in_channels == 2 * config.out_channels:
        # Image-to-video: the first frame's latents, zero-padded in time, ride along on the channel axis.
        image_latents = torch.cat([latents[:, :1], torch.zeros_like(latents[:, 1:])], dim=1)
        model_input = torch.cat([noisy, image_latents], dim=2)
    prediction = engine(
        hidden_states=model_input.to(dtype),
        encoder_hidden_states=text.to(dtype),
        timestep=timesteps,
        # 1.5 I2V conditions on a frame-rate offset; its pipeline always passes 2.0.
        ofs=torch.full((1,), 2.0) if config.ofs_embed_dim else None,
        image_rotary_emb=rotary_embedding(config, latent_frames) if config.use_rotary_positional_embeddings else None,
        return_dict=False,
    )[0]
    target = scheduler.get_velocity(latents, noise, timesteps)
    return torch.nn.functional.mse_loss(prediction.float(), target)


def lora_state_dict(deepspeed, module, stage: int) -> dict:
    """peft's LoRA state dict of the live module (a collective at stage 3, where the params are partitioned).

    This is what finetune/'s save hook hands to ``save_lora_weights``: the module's own tensors, in the
    training dtype. Under ZeRO-3 finetune/ would read 0-element placeholders; gathering first keeps the
    file meaningful.
    """
    from peft import get_peft_model_state_dict

    lora_params = [param for name, param in module.named_parameters() if "lora_" in name]
    with deepspeed.zero.GatheredParameters(lora_params, enabled=stage == 3):
        return {name: tensor.detach().clone() for name, tensor in get_peft_model_state_dict(module).items()}


def save_lora_file(deepspeed, module, stage: int, out_dir: Path, rank: int) -> None:
    """Write OUT_DIR/pytorch_lora_weights.safetensors as finetune/ does: Diffusers names, no alpha metadata."""
    from diffusers import CogVideoXPipeline  # the I2V pipeline shares its LoRA mixin: same file either way

    layers = lora_state_dict(deepspeed, module, stage)
    if rank == 0:
        CogVideoXPipeline.save_lora_weights(out_dir, transformer_lora_layers=layers)


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed, accelerator = start_accelerator(spec, rank, world_size)
    from diffusers import CogVideoXDDIMScheduler

    base, lora = Path(spec["base"]), spec["lora_rank"]
    torch.manual_seed(0)  # LoRA A init must match on every rank
    transformer = load_transformer(base, spec)
    scheduler = CogVideoXDDIMScheduler.from_pretrained(base / "scheduler")
    dtype = TRAIN_DTYPES[spec["dtype"]]
    if lora:
        # finetune/ registers a save_state hook that writes the adapter file into the checkpoint folder.
        # accelerate runs it on every rank, after DeepSpeed has saved, so the ZeRO-3 gather inside is safe.
        def save_lora_hook(models, weights, output_dir):
            save_lora_file(deepspeed, accelerator.unwrap_model(models[0]), spec["stage"], Path(output_dir), rank)

        accelerator.register_save_state_pre_hook(save_lora_hook)

    engine = train_accelerate(accelerator, transformer, spec, lambda engine, step: diffusion_loss(
        engine, engine.module.config, scheduler, step, rank, dtype))
    pipeline_class = json.loads((base / "model_index.json").read_text())["_class_name"]

    def settings(checkpoint: str) -> dict:
        return {**pick(spec, "base", "stage", "dtype", "world_size", "steps", "lr", "lora_rank", "lora_alpha"),
                "pipeline_class": pipeline_class, "checkpoint": checkpoint,
                "lora_target_modules": LORA_TARGETS if lora else None}

    def save_final_lora() -> None:  # the final adapter file, beside the checkpoint folder
        save_lora_file(deepspeed, engine.module, spec["stage"], Path(spec["out"]), rank)

    save_accelerate(deepspeed, accelerator, engine, spec, rank, settings, save_final_lora if lora else None)


def finetune(
    base: str | os.PathLike,
    out: str | os.PathLike,
    *,
    stage: int = 2,
    world_size: int = 2,
    steps: int = 2,
    dtype: str = "bf16",
    lr: float = 1e-3,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
) -> Path:
    """Run the fine-tune in ``world_size`` fresh processes; returns OUT/checkpoint-K."""
    if stage not in (2, 3) or dtype not in TRAIN_DTYPES:
        raise ValueError(f"stage must be 2 or 3 and dtype one of {sorted(TRAIN_DTYPES)}")
    if lora_rank is None and lora_alpha is not None:
        raise ValueError("lora_alpha needs lora_rank")
    if lora_rank and importlib.util.find_spec("peft") is None:
        raise RuntimeError("a LoRA run needs peft, as CogVideo's finetune/ does: pip install peft")
    if lora_rank and lora_alpha is None:
        lora_alpha = lora_rank / 2  # finetune/'s default ratio: alpha 64 for rank 128
    launch(train_and_save, out, base, stage=stage, world_size=world_size, steps=steps, dtype=dtype, lr=lr,
           lora_rank=lora_rank, lora_alpha=lora_alpha)
    return Path(out).resolve() / f"checkpoint-{steps}"


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--stage", type=click.Choice(["2", "3"]), default="2", show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--lora-rank", type=click.IntRange(1), default=None, help="Train only a LoRA of this rank.")
@click.option("--lora-alpha", type=float, default=None, help="LoRA alpha [default: rank / 2, as finetune/'s 64 / 128].")
def main(base: Path, out: Path, stage: str, **options) -> None:
    """Fine-tune BASE's transformer under DeepSpeed on CPU; write OUT/checkpoint-K and the ground truth."""
    if options["lora_rank"] is None and options["lora_alpha"] is not None:
        raise click.UsageError("--lora-alpha needs --lora-rank")
    checkpoint = finetune(base, out, stage=int(stage), **options)
    click.echo(f"wrote {checkpoint} and {Path(out) / 'truth.safetensors'}", err=True)


if __name__ == "__main__":
    main()
