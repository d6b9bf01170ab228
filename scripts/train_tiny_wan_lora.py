"""Train a LoRA on a tiny Wan transformer under real DeepSpeed on CPU, as a Diffusers-based trainer does.

    python scripts/train_tiny_wan_lora.py OUT --stage 2 --world-size 2 --dtype bf16

A tiny WanTransformer3DModel (seeded) is wrapped by PEFT (``inject_adapter_in_model``) with per-module ranks and
alphas (rank_pattern, alpha_pattern) on the blocks' attention and FFN layers and the output projection; only the
LoRA matrices train, a few steps on random data. On disk:

    OUT/base/transformer/                      the base model (save_pretrained), for --base
    OUT/checkpoint/latest, OUT/checkpoint/global_stepN/    the DeepSpeed save dir: blocks.0.attn1.to_q.base_layer.weight,
                                               blocks.0.attn1.to_q.lora_A.default.weight, every other weight as is
    OUT/checkpoint/adapter_config.json         PEFT's LoraConfig, as the run records it beside its checkpoints
    OUT/truth.safetensors, OUT/truth.json      ground truth taken inside the training process: every trainable
                                               parameter's fp32 master, every frozen parameter as stored
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import deepspeed_config, import_deepspeed, spawn_ranks  # noqa: E402
from make_deepspeed_checkpoint import collect_truth  # noqa: E402

# A Wan 2.1 T2V in miniature: 2 heads of 16, 2 blocks.
CONFIG = {"patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4,
          "out_channels": 4, "text_dim": 24, "freq_dim": 32, "ffn_dim": 64, "num_layers": 2, "rope_max_seq_len": 32}
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2",
                                                    "proj_out"],
        # distinct strengths: 8/4, 2/4 on cross-attention keys, 32/8 on the FFN output, 4/4 on the head
        "rank_pattern": {"ffn.net.2": 8}, "alpha_pattern": {"attn2.to_k": 2, "ffn.net.2": 32, "proj_out": 4}}


def build_model():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel.from_config(CONFIG)
    with torch.no_grad():
        for parameter in model.parameters():  # weights of a trained model's size, not the init's zeros
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    return model


def loss_on_batch(engine, step: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    latents = torch.randn(1, CONFIG["in_channels"], 2, 4, 4, generator=generator)
    text = torch.randn(1, 3, CONFIG["text_dim"], generator=generator)
    timestep = torch.randint(0, 1000, (1,), generator=generator)
    output = engine(hidden_states=latents.to(dtype), encoder_hidden_states=text.to(dtype), timestep=timestep,
                    return_dict=False)[0]
    return output.float().pow(2).mean()


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed = import_deepspeed()
    from peft import LoraConfig, inject_adapter_in_model

    out = Path(spec["out"])
    model = build_model()
    if rank == 0:
        model.save_pretrained(out / "base" / "transformer")
    torch.manual_seed(1)  # the same LoRA init on every rank
    model = inject_adapter_in_model(LoraConfig(**LORA), model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".lora_" in name)
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable,
                                      config=deepspeed_config(spec["stage"], spec["dtype"], lr=1e-2))
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec["dtype"]]
    for step in range(spec["steps"]):  # B starts at zero: the first step makes it non-zero, then A moves too
        loss = loss_on_batch(engine, step, rank, dtype)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(str(out / "checkpoint"))
    truth = collect_truth(deepspeed, engine, spec["stage"])
    if rank == 0:
        from safetensors.torch import save_file

        LoraConfig(**LORA).save_pretrained(str(out / "checkpoint"))
        save_file({k: v.contiguous() for k, v in truth.pop("tensors").items()}, out / "truth.safetensors")
        (out / "truth.json").write_text(json.dumps({**truth, "settings": {**spec, "lora": LORA}}, indent=1))
    deepspeed.comm.barrier()


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--stage", type=click.IntRange(1, 3), default=2, show_default=True)
@click.option("--world-size", type=click.IntRange(1, 8), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(["bf16", "fp32"]), default="bf16", show_default=True)
@click.option("--steps", type=click.IntRange(2), default=2, show_default=True)
def main(out: Path, **spec) -> None:
    """Train a LoRA of a tiny Wan transformer under DeepSpeed on CPU; write OUT/checkpoint and the ground truth."""
    out.mkdir(parents=True, exist_ok=True)
    spec["out"] = str(out.resolve())
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(train_and_save, spec["world_size"], spec)
    click.echo(f"wrote {out / 'checkpoint'}", err=True)


if __name__ == "__main__":
    main()
