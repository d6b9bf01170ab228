"""Make a real torch.distributed.checkpoint (DCP) save on CPU, as each trainer writes it, with ground truth.

    python scripts/make_dcp_checkpoint.py OUT --writer accelerate-fsdp2 --model cogvideox-2b --world-size 2
    python scripts/make_dcp_checkpoint.py OUT --writer torchtitan --model toy --world-size 3

Ranks are fresh processes meeting over gloo (torchrun-style RANK / WORLD_SIZE), training MODEL ``--steps`` steps
with AdamW and saving after every step, into OUT/run/ laid out the way the writer lays it out:

    accelerate-fsdp1/2  run/checkpoint-{step}/pytorch_model_fsdp_0/ and optimizer_0/ (``Accelerator.save_state`` with
                        FSDP SHARDED_STATE_DICT), random_states_{rank}.pkl
    torchtitan          run/checkpoint/step-{step}/: model keys at the top level, ``optimizer.*`` (flattened),
                        ``lr_scheduler``, ``dataloader``, ``train_state`` with BytesIO loss histories
    finetrainers        run/finetrainers_step_{step}/: ``model.*`` cast to bf16 before sharding, ``optimizer.*``,
                        ``lr_scheduler``, ``dataloader``, ``train_state``; CogVideoX models also get
                        run/model_weights/{step:06d}/transformer/ (save_pretrained), as finetrainers writes beside
    plain               run/checkpoint/ (``dcp.save`` of ``{"model": model.state_dict(), "optimizer": ...}`` of an
                        FSDP2 model: the module's own state_dict, so ``--compile`` leaves ``_orig_mod.`` in the keys;
                        the toy model shards ``side.weight`` on dim 1)

accelerate decides FSDP only for accelerator devices; on CPU it would quietly train plain DDP-less and save
``model.safetensors``. So after building the ``Accelerator`` (gloo, the FSDP plugin given) the script sets the
distributed type to FSDP on accelerate's shared state, which is what accelerate itself sets on a GPU machine;
``prepare`` and ``save_state`` then run their real FSDP code.

Ground truth (OUT/truth.safetensors, OUT/truth.json), gathered inside training after the last step with
``get_model_state_dict(full_state_dict=True)``: every entry of the model's state dict under the module's own names
in the saved dtype (fp32, or bf16 for finetrainers), and under ``optimizer.<fqn>.<state>`` every per-parameter
optimizer state; truth.json holds the state-dict order, the trainable / frozen / buffer names, the last step, the
checkpoint folder of that step, and the settings.

Models: ``toy`` has sizes no world size divides (13, 29, 7, 2 rows: a zero-size chunk on 3 ranks), a frozen
layer, a float and an int buffer; ``cogvideox-VARIANT`` is a tiny CogVideoX transformer, ``wan-t2v``,
``hunyuanvideo-t2v`` and ``ltx-2b`` tiny Wan 2.1, HunyuanVideo and LTX-Video ones (``--lora-rank`` adds a PEFT adapter
to any of them and trains only it); ``bench`` is the ~1.9 GB model of the DeepSpeed benchmark (``bench-small`` the
same at width 1024).
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import spawn_ranks  # noqa: E402
from tiny_training import add_lora, gloo_group  # noqa: E402

WRITERS = ("accelerate-fsdp1", "accelerate-fsdp2", "torchtitan", "finetrainers", "plain")
COGVIDEOX_MODELS = ("cogvideox-2b", "cogvideox-5b", "cogvideox-5b-i2v", "cogvideox-1.5-5b", "cogvideox-1.5-5b-i2v")
# Diffusers transformers (a LoRA can be trained on them)
DIFFUSERS_MODELS = (*COGVIDEOX_MODELS, "wan-t2v", "hunyuanvideo-t2v", "ltx-2b")


class ShardingToy(nn.Module):
    """Sizes no world size divides evenly, a frozen layer, a layer to shard on dim 1, buffers of two dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(13, 29), nn.GELU(), nn.Linear(29, 13))
        self.norm = nn.LayerNorm(13)
        self.frozen_proj = nn.Linear(13, 7)
        self.frozen_proj.requires_grad_(False)
        self.head = nn.Linear(13, 2)
        self.side = nn.Linear(12, 13)  # sharded on dim 1 by the plain writer (FSDP needs that dim to divide evenly)
        self.register_buffer("running_scale", torch.linspace(0.5, 1.5, 5))
        self.register_buffer("step_count", torch.tensor([3, 1, 4], dtype=torch.int64))

    def forward(self, step: int, rank: int) -> torch.Tensor:  # the loss of one step (FSDP gathers in forward)
        generator = torch.Generator().manual_seed(1000 * step + rank)
        batch, side = torch.randn(4, 13, generator=generator), torch.randn(4, 12, generator=generator)
        hidden = self.norm(batch + self.block(batch) + self.side(side))
        return self.head(hidden).float().pow(2).mean() + self.frozen_proj(hidden).float().pow(2).mean()


def build_model(spec: dict) -> nn.Module:
    torch.manual_seed(0)
    name = spec["model"]
    if name == "toy":
        return ShardingToy()
    if name == "bench":
        from make_deepspeed_checkpoint import BenchModel

        return BenchModel()
    if name == "bench-small":
        return small_bench_model()
    if name.startswith("wan-"):
        from wan_tiny_configs import build_tiny_transformer as build_wan

        model = build_wan(name[len("wan-"):]).train()
    elif name.startswith("hunyuanvideo-"):
        from hunyuanvideo_tiny import build_tiny_transformer as build_hunyuanvideo

        model = build_hunyuanvideo(name[len("hunyuanvideo-"):]).train()
    elif name.startswith("ltx-"):
        from make_tiny_ltx_video import build_transformer as build_ltx

        model = build_ltx(name[len("ltx-"):]).train()
    else:
        from cogvideox_tiny_configs import build_tiny_transformer

        model = build_tiny_transformer(name[len("cogvideox-"):]).train()
    if spec["lora_rank"]:
        add_lora(model, spec["lora_rank"], spec["lora_rank"] * 2, ["to_q", "to_k", "to_v", "to_out.0"])
        torch.manual_seed(1)  # the same LoRA values on every rank; B non-zero so the adapter is not a no-op
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if "lora_B" in param_name:
                    param.normal_(0, 0.02)
    return model


def small_bench_model() -> nn.Module:
    """The bench model at width 1024 (about 0.12 GB in fp32), to check the benchmark quickly."""
    from make_deepspeed_checkpoint import BenchModel

    class SmallBenchModel(BenchModel):
        width = 1024

        @staticmethod
        def batch(step: int, rank: int) -> torch.Tensor:
            return torch.randn(1, 1024, generator=torch.Generator().manual_seed(1000 * step + rank)) * 1e-3

    return SmallBenchModel()


def training_loss(model: nn.Module, plain: nn.Module, spec: dict, step: int, rank: int) -> torch.Tensor:
    """One step's loss: ``model`` is what the trainer calls (maybe an FSDP1 wrapper), ``plain`` the inner module."""
    if spec["model"] == "toy":
        return model(step, rank)
    if spec["model"].startswith("bench"):
        return model(plain.batch(step, rank))
    dtype = next(plain.parameters()).dtype
    if spec["model"].startswith("wan-"):
        from wan_tiny_configs import transformer_forward_inputs

        inputs = {name: value.to(dtype) if value.is_floating_point() else value
                  for name, value in transformer_forward_inputs(dict(plain.config), seed=1000 * step + rank).items()}
        return model(**inputs, return_dict=False)[0].float().pow(2).mean()
    if spec["model"].startswith("hunyuanvideo-"):
        from finetune_tiny_hunyuanvideo import flow_matching_loss

        return flow_matching_loss(model, dict(plain.config), step, rank, dtype)
    if spec["model"].startswith("ltx-"):
        from finetune_tiny_ltx_video import flow_loss

        return flow_loss(model, plain.config, step, rank, dtype)
    from diffusers import CogVideoXDDIMScheduler
    from finetune_tiny_cogvideox import diffusion_loss

    return diffusion_loss(model, plain.config, CogVideoXDDIMScheduler(), step, rank, dtype)


# -- writers ------------------------------------------------------------------------------------------------------
def mesh(world_size: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world_size,))


def shard_fsdp2(model: nn.Module, spec: dict, world_size: int) -> nn.Module:
    """fully_shard each transformer block (compiled first with ``--compile``), then the root."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    device_mesh = mesh(world_size)
    blocks = getattr(model, "transformer_blocks", None) or getattr(model, "blocks", None)  # CogVideoX, Wan
    if blocks is not None:
        for index, block in enumerate(blocks):
            if spec["compile"]:
                # backend="eager": dynamo wraps and traces the block as torch.compile does, but needs no C compiler.
                block = torch.compile(block, backend="eager")
                blocks.register_module(str(index), block)
            fully_shard(block, mesh=device_mesh)

    def placement(param: nn.Parameter):
        # The toy's side layer is sharded on dim 1 (as a TP-style layout would save it).
        return Shard(1) if param is model.side.weight else None

    fully_shard(model, mesh=device_mesh, shard_placement_fn=placement if spec["model"] == "toy" else None)
    return model


def make_accelerator(spec: dict):
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, InitProcessGroupKwargs

    version = 1 if spec["writer"] == "accelerate-fsdp1" else 2
    # One FSDP unit per block (per Linear for the bench model, so no rank ever gathers the whole 1.9 GB).
    blocks = {"cogvideox": ["CogVideoXBlock"], "wan": ["WanTransformerBlock"], "ltx": ["LTXVideoTransformerBlock"],
              "hunyuanvideo": ["HunyuanVideoTransformerBlock", "HunyuanVideoSingleTransformerBlock"],
              "bench": ["Linear"]}.get(spec["model"].split("-")[0])
    wrap = {"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": blocks} if blocks else {}
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, state_dict_type="SHARDED_STATE_DICT",
                                            **({"use_orig_params": True} if version == 1 else {}), **wrap)
    accelerator = Accelerator(fsdp_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    # What accelerate sets by itself on an accelerator machine (see the module docstring).
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    PartialState().distributed_type = DistributedType.FSDP
    return accelerator


def train_accelerate(spec: dict, rank: int, world_size: int) -> None:
    accelerator = make_accelerator(spec)
    plain = build_model(spec)
    if spec["writer"] == "accelerate-fsdp1":  # FSDP1 wants the model first, its optimizer built on the wrapped one
        model = accelerator.prepare(plain)
        optimizer = accelerator.prepare(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2))
    else:  # FSDP2 wants both at once, and moves the optimizer onto the sharded parameters itself
        optimizer = torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], lr=1e-2)
        model, optimizer = accelerator.prepare(plain, optimizer)
    inner = accelerator.unwrap_model(model)
    run = Path(spec["out"]) / "run"
    for step in range(1, spec["steps"] + 1):
        loss = training_loss(model, inner, spec, step, rank)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.save_state(run / f"checkpoint-{step}")
    if spec["truth"]:
        record_truth(model, optimizer, inner, spec, rank, f"run/checkpoint-{spec['steps']}")


def train_dcp(spec: dict, rank: int, world_size: int) -> None:
    """torchtitan, finetrainers and plain: FSDP2 (fully_shard) and dcp.save, no accelerate."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
        get_optimizer_state_dict

    plain = build_model(spec)
    if spec["writer"] == "finetrainers":
        plain.to(torch.bfloat16)  # finetrainers casts the model to the training dtype before sharding
    model = shard_fsdp2(plain, spec, world_size)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    losses = []
    run = Path(spec["out"]) / "run"
    for step in range(1, spec["steps"] + 1):
        loss = training_loss(model, plain, spec, step, rank)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        history = io.BytesIO()
        torch.save(losses, history)
        flat = StateDictOptions(flatten_optimizer_state_dict=True)
        if spec["writer"] == "torchtitan":
            folder = run / "checkpoint" / f"step-{step}"
            state = {**get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer, options=flat),
                     "lr_scheduler": {"last_epoch": scheduler.last_epoch},
                     "dataloader": {"rank": rank, "samples": 4 * step},
                     "train_state": {"step": step, "ntokens_seen": 52 * step, "global_avg_losses": history}}
        elif spec["writer"] == "finetrainers":
            folder = run / f"finetrainers_step_{step}"
            state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer,
                                                                                               options=flat),
                     "lr_scheduler": scheduler.state_dict(), "dataloader": {"rank": rank, "epoch": 0},
                     "train_state": {"step": torch.tensor(step, dtype=torch.int32),
                                     "observed_data_samples": torch.tensor(4 * step, dtype=torch.int32),
                                     "global_avg_losses": history}}
        else:
            folder = run / "checkpoint"
            state = {"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, optimizer),
                     "step": step}
        dcp.save(state, checkpoint_id=str(folder))
        if spec["writer"] == "finetrainers" and spec["model"].startswith("cogvideox"):
            save_finetrainers_export(model, plain, run / "model_weights" / f"{step:06d}" / "transformer", rank)
    if spec["truth"]:
        record_truth(model, optimizer, plain, spec, rank, str(folder.relative_to(Path(spec["out"]))))


def save_finetrainers_export(model: nn.Module, plain: nn.Module, folder: Path, rank: int) -> None:
    """The ready-to-load weights finetrainers writes beside its DCP steps (rank 0, save_pretrained)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        from diffusers import CogVideoXTransformer3DModel

        export = CogVideoXTransformer3DModel.from_config(plain.config)
        export.load_state_dict(full)
        export.to(torch.bfloat16).save_pretrained(folder)


# -- ground truth -------------------------------------------------------------------------------------------------
def record_truth(model: nn.Module, optimizer, plain: nn.Module, spec: dict, rank: int, checkpoint: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
        get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    weights = get_model_state_dict(model, options=options)
    optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, flatten_optimizer_state_dict=True))
    if rank != 0:
        return
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().clone().contiguous() for name, tensor in weights.items()}
    for key, value in optim.items():  # state.<fqn>.<name>
        if key.startswith("state.") and isinstance(value, torch.Tensor) and value.dim() > 0:
            fqn, state_name = key[len("state."):].rsplit(".", 1)
            tensors[f"optimizer.{fqn}.{state_name}"] = value.detach().clone().contiguous()
    out = Path(spec["out"])
    save_file(tensors, out / "truth.safetensors")
    buffers = [name for name, _ in plain.named_buffers() if name in weights]
    params = dict(plain.named_parameters())
    clean = {name.replace("_orig_mod.", ""): param for name, param in params.items()}
    truth = {
        "order": list(weights),
        "trainable": [n for n in weights if n in clean and clean[n].requires_grad],
        "frozen": [n for n in weights if n in clean and not clean[n].requires_grad],
        "buffers": [n.replace("_orig_mod.", "") for n in buffers],
        "dtype": str(next(iter(weights.values())).dtype).replace("torch.", ""),
        "step": spec["steps"],
        "checkpoint": checkpoint,
        "settings": {k: spec[k] for k in ("writer", "model", "world_size", "steps", "lora_rank", "compile")},
    }
    if spec["model"] in DIFFUSERS_MODELS:
        truth["config"] = dict(plain.config)
    (out / "truth.json").write_text(json.dumps(truth, indent=1, default=str))


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    with gloo_group(rendezvous, rank, world_size):
        if spec["writer"].startswith("accelerate"):
            train_accelerate(spec, rank, world_size)
        else:
            train_dcp(spec, rank, world_size)


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--writer", type=click.Choice(WRITERS), required=True)
@click.option("--model", type=click.Choice(["toy", "bench", "bench-small", *DIFFUSERS_MODELS]), default="toy",
              show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--lora-rank", type=click.IntRange(1), default=None,
              help="Diffusers transformers: train only a PEFT LoRA adapter.")
@click.option("--compile", is_flag=True, help="FSDP2 writers: torch.compile each block (keys gain _orig_mod.).")
@click.option("--truth/--no-truth", default=True, show_default=True, help="Write truth.safetensors and truth.json.")
def main(out: Path, **spec) -> None:
    """Train MODEL a few steps on CPU ranks and save DCP checkpoints as WRITER does, into OUT/run."""
    if spec["lora_rank"] and spec["model"] not in DIFFUSERS_MODELS:
        raise click.UsageError("--lora-rank needs a Diffusers transformer (cogvideox-*, wan-*, hunyuanvideo-*, ltx-*)")
    out.mkdir(parents=True, exist_ok=True)
    spec.update(out=str(out.resolve()))
    spawn_ranks(train_and_save, spec["world_size"], spec)
    click.echo(f"wrote {out / 'run'}", err=True)


if __name__ == "__main__":
    main()
