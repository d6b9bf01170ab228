"""Train a tiny CogVideoX transformer under DeepSpeed AutoTP (tensor parallelism) + ZeRO on CPU ranks, and save it.

    python scripts/make_autotp_checkpoint.py BASE OUT --tp 2 --world-size 4 --stage 3 --dtype fp32

BASE is a pipeline folder from make_tiny_cogvideox.py (only BASE/transformer is read). The transformer is the
DeepSpeed module; ``tensor_parallel.autotp_size`` splits its attention and feed-forward layers over ``--tp`` ranks by
a ``partition_config`` (q, k, v and the feed-forward's first layer column-parallel, the attention output and the
feed-forward's second layer row-parallel, everything else replicated), and ZeRO partitions each tensor-parallel
rank's share over the data-parallel ranks (world size / tp). On disk, OUT/checkpoint/ is the save dir:

    latest, global_stepN/
      zero_pp_rank_{dp}_mp_rank_{tp:02d}_model_states.pt            ZeRO-3 (stages 1-2: mp_rank_{tp:02d}_model_states.pt)
      [bf16_]zero_pp_rank_{dp}_mp_rank_{tp:02d}_optim_states.pt

Each attention module's ``heads`` is divided by tp after AutoTP has split q, k and v (Diffusers' attention
processors reshape by ``attn.heads``), as a tensor-parallel training script of a Diffusers model must.

Ground truth, taken inside training after the last step: OUT/truth.safetensors holds every parameter's full fp32
master: each rank's tensor-parallel share from ``safe_get_full_fp32_param`` (a gather over its data-parallel
group), the shares of a tensor-parallel group gathered and joined by the kind of layer AutoTP made (column-parallel
layers on dim 0, row-parallel weights on dim 1; row biases and untouched parameters held whole by every rank, and
checked equal across the group). OUT/truth.json has the state_dict order, the names and the run's settings. With
``--no-norm-allreduce`` the per-head norms' gradients are not summed over the TP group, so each rank's copy drifts
apart (the mistake such a run can make): those names are listed under "drifted" and have no truth tensor.
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
from deepspeed_cpu import deepspeed_config, import_deepspeed  # noqa: E402
from finetune_tiny_cogvideox import diffusion_loss  # noqa: E402
from tiny_training import TRAIN_DTYPES, launch, pick  # noqa: E402

# AutoTP's configurable API: the patterns name weights; a layer's bias follows its weight.
PARTITION_CONFIG = {
    "use_default_specs": False,
    "layer_specs": [
        {"patterns": [r".*\.attn1\.to_[qkv]\.weight$", r".*\.ff\.net\.0\.proj\.weight$"], "partition_type": "column"},
        {"patterns": [r".*\.attn1\.to_out\.0\.weight$", r".*\.ff\.net\.2\.weight$"], "partition_type": "row"},
        # per-head norms stay whole but see only this rank's heads: their gradients are summed over the TP group,
        # or the copies drift apart from the first step
        {"patterns": [r".*\.attn1\.norm_[qk]\.(weight|bias)$"], "partition_type": "skip", "grad_allreduce": True},
    ],
}


def autotp_config(spec: dict) -> dict:
    config = deepspeed_config(spec["stage"], spec["dtype"], lr=spec["lr"])
    partition = PARTITION_CONFIG
    if not spec["norm_allreduce"]:  # the mistake a run can make: each rank's copy of the per-head norms drifts
        partition = {**partition, "layer_specs": [s for s in partition["layer_specs"] if not s.get("grad_allreduce")]}
    config["tensor_parallel"] = {"autotp_size": spec["tp"], "partition_config": partition}
    if spec["stage"] == 3:
        # keep even tiny parameters partitioned, so every trained tensor really is split over the DP ranks
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    return config


def build_engine(deepspeed, spec: dict):
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.attention_processor import Attention

    transformer = CogVideoXTransformer3DModel.from_pretrained(Path(spec["base"]) / "transformer").train()
    engine, *_ = deepspeed.initialize(model=transformer, model_parameters=list(transformer.parameters()),
                                      config=autotp_config(spec))
    for module in engine.module.modules():
        if isinstance(module, Attention):
            module.heads //= spec["tp"]  # q, k and v now hold this rank's heads only
    return engine


def full_master(deepspeed, module, name: str, param, tp_group, tp: int) -> tuple[torch.Tensor | None, bool]:
    """The full fp32 master of ``name`` (a collective over the whole world), and whether it is held whole by every
    tensor-parallel rank (then the copies must agree)."""
    from deepspeed.module_inject.layers import LinearAllreduce, LinearLayer

    local = deepspeed.utils.safe_get_full_fp32_param(param).detach().clone().cpu()
    shares = [None] * tp
    torch.distributed.all_gather_object(shares, local, group=tp_group)
    owner = module.get_submodule(name.rpartition(".")[0])
    leaf = name.rpartition(".")[2]
    if isinstance(owner, LinearLayer):
        return torch.cat(shares, dim=0), False
    if isinstance(owner, LinearAllreduce) and leaf == "weight":
        return torch.cat(shares, dim=1), False
    if any(not torch.equal(share, shares[0]) for share in shares[1:]):
        return None, True  # the ranks trained their copies apart: there is no one true value
    return shares[0], True


def collect_truth(deepspeed, engine, spec: dict) -> dict:
    from deepspeed.utils import groups

    tp_group = groups.get_tensor_model_parallel_group()
    tensors, replicated, drifted = {}, [], []
    for name, param in engine.module.named_parameters():
        tensors[name], whole = full_master(deepspeed, engine.module, name, param, tp_group, spec["tp"])
        if whole:
            replicated.append(name)
        if tensors[name] is None:
            del tensors[name]
            drifted.append(name)
    parameters = dict(engine.module.named_parameters())
    buffers = [name for name in engine.module.state_dict() if name not in parameters]
    persistent = dict(engine.module.named_buffers())
    tensors.update({name: persistent[name].detach().clone().cpu() for name in buffers})
    return {"tensors": tensors, "order": list(engine.module.state_dict()),
            "trainable": [name for name in parameters if name in tensors], "frozen": [], "tied": {},
            "buffers": buffers, "replicated": replicated, "drifted": drifted, "global_steps": engine.global_steps}


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed = import_deepspeed()
    from deepspeed.utils import groups
    from diffusers import CogVideoXDDIMScheduler

    torch.manual_seed(0)
    engine = build_engine(deepspeed, spec)
    scheduler = CogVideoXDDIMScheduler.from_pretrained(Path(spec["base"]) / "scheduler")
    # every rank of a tensor-parallel group must see the same batch (DeepSpeed checks): seed by data-parallel rank
    dp_rank = groups.get_data_parallel_rank()
    for step in range(spec["steps"]):
        loss = diffusion_loss(engine, engine.module.config, scheduler, step, dp_rank, TRAIN_DTYPES[spec["dtype"]])
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(spec["save_dir"])
    truth = collect_truth(deepspeed, engine, spec)
    if rank == 0:
        from safetensors.torch import save_file

        out = Path(spec["out"])
        save_file({name: tensor.contiguous() for name, tensor in truth.pop("tensors").items()},
                  out / "truth.safetensors")
        settings = pick(spec, "base", "tp", "stage", "dtype", "world_size", "steps", "lr", "norm_allreduce")
        (out / "truth.json").write_text(json.dumps({**truth, "settings": settings}, indent=1))
    deepspeed.comm.barrier()


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--tp", type=click.IntRange(2), default=2, show_default=True, help="tensor_parallel.autotp_size")
@click.option("--world-size", type=click.IntRange(2, 16), default=4, show_default=True, help="tp x data-parallel ranks")
@click.option("--stage", type=click.IntRange(1, 3), default=3, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="fp32", show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--lr", type=float, default=1e-2, show_default=True)
@click.option("--norm-allreduce/--no-norm-allreduce", default=True, show_default=True,
              help="Sum the per-head norms' gradients over the TP group (without: their copies drift apart).")
def main(base: Path, out: Path, **spec) -> None:
    """Train BASE's transformer under AutoTP + ZeRO on CPU; write OUT/checkpoint and the ground truth."""
    if spec["world_size"] % spec["tp"]:
        raise click.UsageError("--world-size must be a multiple of --tp")
    launch(train_and_save, out, base, save_dir="checkpoint", **spec)
    click.echo(f"wrote {Path(out) / 'checkpoint'} and {Path(out) / 'truth.safetensors'}", err=True)


if __name__ == "__main__":
    main()
