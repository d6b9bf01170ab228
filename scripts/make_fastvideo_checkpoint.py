"""Make a FastVideo training run's checkpoints on CPU, laid out as FastVideo's CheckpointManager saves them, with the
ground truth taken inside training.

    python scripts/make_fastvideo_checkpoint.py OUT --world-size 2 --steps 2 [--size bench]

FastVideo (hao-ai-lab/FastVideo) cannot be installed beside this torch, so the run is made here from its facts
(docs: the FastVideo section of training-stacks.md): a tiny Diffusers ``WanTransformer3DModel`` whose parameters are
registered under FastVideo's own module names (``blocks.0.to_q``, ``blocks.0.ffn.fc_in``, ...; the mapping below is
written by hand from FastVideo's ``param_names_mapping`` facts, independently of cogexport's table) and whose forward
runs the Diffusers model on them (tiny_training.OriginalLayoutModule). Ranks are fresh processes over gloo; every role
is one FSDP2 module (``fully_shard`` on its root).

Roles, as a DMD2 run with a causal-CD style EMA and the EMA callback would hold them (OUT/run):

- ``student`` and ``critic``: trainable, each with its own AdamW and LambdaLR scheduler, trained ``--steps`` steps;
- ``ema``: a frozen copy of the student, moved towards it after every step (decay 0.5), saved whole;
- the EMA callback (decay 0.75): each rank's fp32 copy of its LOCAL shard of the student's parameters, saved as plain
  tensors (FastVideo's EMA_FSDP in local_shard mode), so at world size > 1 DCP keeps one rank's piece of each.

After every step, OUT/run/checkpoint-{step}/ is saved as CheckpointManager saves it: rank 0 writes metadata.json
(``{"step": N, "config": {...the run's YAML...}}``), then ``dcp.save`` into ``dcp/`` of

    roles.student.transformer   the student's trainable parameters (get_model_state_dict, requires_grad only)
    optimizers.student          get_optimizer_state_dict of a container whose child ``transformer`` is the student,
                                flattened: state.transformer.<name>.exp_avg|exp_avg_sq|step, param_groups....
    schedulers.student          {"scheduler": scheduler.state_dict()}
    roles.critic.transformer, optimizers.critic, schedulers.critic
    roles.ema.transformer       the EMA module's full state dict
    dataloader                  the sampler's position
    callbacks                   {"ema": {"student_ema": {name: local shard}, "ema_started": True}}

then every rank writes rng_state_rank<R>.pt. The same state is saved as a fine-tuning run with the EMA callback
saves it too (OUT/finetune/checkpoint-{step}: the student, its optimizer and scheduler, dataloader, callbacks; no
critic, no ema role), whose only EMA is the callback's.

Ground truth (OUT/truth.safetensors, OUT/truth.json), gathered with full_state_dict inside training after the last
step: ``student.``, ``critic.``, ``ema.`` and ``callback_ema.`` + each Diffusers name, fp32; truth.json holds the
FastVideo name of every Diffusers name (in the state dict's order), the Diffusers config, the step and settings.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_training import OriginalLayoutModule, gloo_group, launch, shard_blocks  # noqa: E402
from wan_tiny_configs import build_tiny_transformer, transformer_forward_inputs  # noqa: E402

EMA_ROLE_DECAY = 0.5
CALLBACK_DECAY = 0.75
LEARNING_RATE = 1e-2
# --size bench: Wan2.1-1.3B's widths (12 heads of 128, ffn 8960) at 2 of its 30 blocks (0.38 GB fp32), the tiny text
# and latent widths kept: the benchmark's bytes are in the blocks (scripts/benchmark_training_stacks.py)
SIZES = {"tiny": {}, "bench": {"num_attention_heads": 12, "attention_head_dim": 128, "ffn_dim": 8960, "num_layers": 2}}
# Diffusers name prefix -> FastVideo name prefix (``#`` a block index); every other name is the same in both.
RENAMED_PREFIXES = (
    ("patch_embedding.", "patch_embedding.proj."),
    ("condition_embedder.text_embedder.linear_1.", "condition_embedder.text_embedder.fc_in."),
    ("condition_embedder.text_embedder.linear_2.", "condition_embedder.text_embedder.fc_out."),
    ("condition_embedder.time_embedder.linear_1.", "condition_embedder.time_embedder.mlp.fc_in."),
    ("condition_embedder.time_embedder.linear_2.", "condition_embedder.time_embedder.mlp.fc_out."),
    ("condition_embedder.time_proj.", "condition_embedder.time_modulation.linear."),
    ("condition_embedder.image_embedder.ff.net.0.proj.", "condition_embedder.image_embedder.ff.fc_in."),
    ("condition_embedder.image_embedder.ff.net.2.", "condition_embedder.image_embedder.ff.fc_out."),
    *((f"blocks.#.attn1.{part}.", f"blocks.#.{part}.") for part in ("to_q", "to_k", "to_v", "norm_q", "norm_k")),
    ("blocks.#.attn1.to_out.0.", "blocks.#.to_out."),
    ("blocks.#.attn2.to_out.0.", "blocks.#.attn2.to_out."),
    ("blocks.#.ffn.net.0.proj.", "blocks.#.ffn.fc_in."),
    ("blocks.#.ffn.net.2.", "blocks.#.ffn.fc_out."),
    ("blocks.#.norm2.", "blocks.#.self_attn_residual_norm.norm."),
)


def _prefix_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(prefix).replace(re.escape("#"), r"(\d+)"))


def rename(name: str, to_fastvideo: bool) -> str:
    """One parameter's name in the other naming; at most one prefix rule may apply (none: the same name)."""
    hits = []
    for diffusers, fastvideo in RENAMED_PREFIXES:
        source, target = (diffusers, fastvideo) if to_fastvideo else (fastvideo, diffusers)
        found = _prefix_pattern(source).match(name)
        if found:
            index = found.group(1) if found.groups() else ""
            hits.append(target.replace("#", index) + name[found.end():])
    if len(hits) > 1:
        raise ValueError(f"{name} matches several renames: {hits}")
    return hits[0] if hits else name


def to_diffusers_names(weights: dict) -> dict:
    return {rename(name, to_fastvideo=False): tensor for name, tensor in weights.items()}


# -- the roles ------------------------------------------------------------------------------------------------------
def fastvideo_module(seed: int, trainable: bool, size: str = "tiny") -> OriginalLayoutModule:
    """A tiny Wan transformer's parameters under FastVideo's names; its forward is the Diffusers model's."""
    diffusers_model = build_transformer(seed, size).train()
    state = {rename(name, to_fastvideo=True): tensor.detach().clone() for name, tensor in
             diffusers_model.state_dict().items()}
    back = to_diffusers_names(state)
    if set(back) != set(diffusers_model.state_dict()) or len(back) != len(state):
        raise RuntimeError("the FastVideo naming does not run back to every Diffusers name")
    module = OriginalLayoutModule(state, diffusers_model, to_diffusers_names)
    return module.requires_grad_(trainable)


def build_transformer(seed: int, size: str):
    """The seeded tiny t2v Wan transformer, or (``bench``) the same with wider blocks."""
    if size == "tiny":
        return build_tiny_transformer("t2v", seed=seed)
    from diffusers import WanTransformer3DModel

    from tiny_models import randomize_
    from wan_tiny_configs import tiny_transformer_config

    torch.manual_seed(seed)
    return randomize_(WanTransformer3DModel(**{**tiny_transformer_config("t2v"), **SIZES[size]}), seed).eval()


class RoleContainer(nn.Module):
    """What FastVideo's optimizer state is taken over: a module whose child ``transformer`` is the role's."""

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        self.transformer = transformer


class TrainableRole:
    """A trainable role as the run keeps it: its module, AdamW, a LambdaLR scheduler and its own data."""

    def __init__(self, name: str, seed: int, world_size: int, size: str = "tiny") -> None:
        self.name, self.seed = name, seed
        self.module = shard_blocks(fastvideo_module(seed, trainable=True, size=size), [], world_size)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=LEARNING_RATE)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0 / (1 + step))

    def train_step(self, step: int, rank: int) -> None:
        config = dict(self.module._diffusers[0].config)
        inputs = transformer_forward_inputs(config, seed=1000 * step + 100 * self.seed + rank)
        output = self.module(**inputs, return_dict=False)[0]
        output.float().pow(2).mean().backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()


# -- what CheckpointManager hands dcp.save: Stateful objects, each called for its state dict ---------------------
class TrainableWeights:
    """The role's trainable parameters (FastVideo's ModelWrapper)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        trained = {name for name, param in self.module.named_parameters() if param.requires_grad}
        return {name: value for name, value in get_model_state_dict(self.module).items() if name in trained}

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError


class WholeModule(TrainableWeights):
    """A frozen role mutated in training (the EMA role): its whole state dict."""

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.module)


class OptimizerState(TrainableWeights):
    def __init__(self, role: TrainableRole) -> None:
        super().__init__(RoleContainer(role.module))
        self.optimizer = role.optimizer

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(self.module, self.optimizer,
                                        options=StateDictOptions(flatten_optimizer_state_dict=True))


class PlainState(TrainableWeights):
    """Any other state: a function giving its dict."""

    def __init__(self, give) -> None:
        super().__init__(None)
        self.give = give

    def state_dict(self) -> dict:
        return self.give()


def checkpoint_states(trainable: list[TrainableRole], ema: nn.Module | None, callback: dict, rank: int,
                      step: int) -> dict:
    states = {}
    for role in trainable:
        states[f"roles.{role.name}.transformer"] = TrainableWeights(role.module)
        states[f"optimizers.{role.name}"] = OptimizerState(role)
        states[f"schedulers.{role.name}"] = PlainState(lambda role=role: {"scheduler": role.scheduler.state_dict()})
    if ema is not None:
        states["roles.ema.transformer"] = WholeModule(ema)
    states["dataloader"] = PlainState(lambda: {"sampler": {"rank": rank, "samples_yielded": 4 * step}})
    states["callbacks"] = PlainState(lambda: {"ema": {"student_ema": {k: v.clone() for k, v in callback.items()},
                                                      "ema_started": True}})
    return states


def save_checkpoint(run: Path, step: int, states: dict, config: dict, rank: int) -> None:
    """As CheckpointManager.save: metadata.json (rank 0), dcp.save into dcp/, then each rank's RNG snapshot."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    folder = run / f"checkpoint-{step}"
    (folder / "dcp").mkdir(parents=True, exist_ok=True)
    if rank == 0:
        (folder / "metadata.json").write_text(json.dumps({"step": step, "config": config}, indent=2))
    dcp.save(states, checkpoint_id=str(folder / "dcp"))
    dist.barrier()
    torch.save({"torch_rng": torch.get_rng_state(), "python_rng": random.getstate()},
               folder / f"rng_state_rank{rank}.pt")
    dist.barrier()


# -- EMAs -------------------------------------------------------------------------------------------------------
def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


@torch.no_grad()
def update_ema_role(ema: nn.Module, student: nn.Module) -> None:
    for target, source in zip(ema.parameters(), student.parameters()):
        local(target).mul_(EMA_ROLE_DECAY).add_(local(source), alpha=1 - EMA_ROLE_DECAY)


@torch.no_grad()
def update_callback(shadow: dict, student: nn.Module) -> None:
    """The callback's fp32 CPU copy of each local shard (EMA_FSDP, local_shard mode)."""
    for name, param in student.named_parameters():
        value = local(param.detach()).float()
        if name not in shadow:
            shadow[name] = value.clone()
        else:
            shadow[name].mul_(CALLBACK_DECAY).add_(value, alpha=1 - CALLBACK_DECAY)


@torch.no_grad()
def update_full_callback(shadow: dict, student: nn.Module) -> None:
    """The same EMA kept on full tensors (a collective): the callback's truth, element for element."""
    for name, param in student.named_parameters():
        value = param.detach().full_tensor().float() if hasattr(param, "full_tensor") else param.detach().float()
        if name not in shadow:
            shadow[name] = value.clone()
        else:
            shadow[name].mul_(CALLBACK_DECAY).add_(value, alpha=1 - CALLBACK_DECAY)


# -- the run ----------------------------------------------------------------------------------------------------
def run_config(spec: dict, method: str) -> dict:
    """The run's YAML as metadata.json keeps it (FastVideo's RunConfig sections)."""
    model = {"_target_": "fastvideo.train.models.wan.WanModel", "init_from": "tiny-wan-t2v"}
    models = {"student": {**model, "trainable": True}, "critic": {**model, "trainable": True},
              "teacher": {**model, "trainable": False}} if method == "DMD2Method" else \
        {"student": {**model, "trainable": True}}
    package = "distribution_matching.dmd2" if method == "DMD2Method" else "fine_tuning.finetune"
    return {"models": models, "method": {"_target_": f"fastvideo.train.methods.{package}.{method}"},
            "callbacks": {"ema": {"decay": CALLBACK_DECAY, "start_iter": 0}},
            "training": {"checkpoint": {"save_steps": 1, "keep_last": 0},
                         "distributed": {"num_gpus": spec["world_size"]}}}


def full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    return {name: tensor.detach().clone().contiguous() for name, tensor in weights.items()}


def write_truth(out: Path, roles: dict[str, dict], spec: dict, config: dict) -> None:
    from safetensors.torch import save_file

    tensors = {f"{role}.{rename(name, to_fastvideo=False)}": tensor for role, weights in roles.items()
               for name, tensor in weights.items()}
    save_file(tensors, out / "truth.safetensors")
    names = {rename(name, to_fastvideo=False): name for name in roles["student"]}
    truth = {"names": names, "config": config, "step": spec["steps"], "roles": ["student", "critic", "ema"],
             "checkpoint": f"run/checkpoint-{spec['steps']}", "settings": spec}
    (out / "truth.json").write_text(json.dumps(truth, indent=1, default=str))


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    with gloo_group(rendezvous, rank, world_size):
        size = spec.get("size", "tiny")
        student, critic = (TrainableRole("student", 0, world_size, size), TrainableRole("critic", 1, world_size, size))
        ema = shard_blocks(fastvideo_module(0, trainable=False, size=size), [], world_size)
        callback, callback_truth = {}, {}
        update_callback(callback, student.module)
        update_full_callback(callback_truth, student.module)
        out = Path(spec["out"])
        for step in range(1, spec["steps"] + 1):
            student.train_step(step, rank)
            critic.train_step(step, rank)
            update_ema_role(ema, student.module)
            update_callback(callback, student.module)
            update_full_callback(callback_truth, student.module)
            save_checkpoint(out / "run", step, checkpoint_states([student, critic], ema, callback, rank, step),
                            run_config(spec, "DMD2Method"), rank)
            save_checkpoint(out / "finetune", step, checkpoint_states([student], None, callback, rank, step),
                            run_config(spec, "FinetuneMethod"), rank)
        roles = {"student": full_weights(student.module), "critic": full_weights(critic.module),
                 "ema": full_weights(ema),
                 "callback_ema": callback_truth}
        if rank == 0:
            write_truth(Path(spec["out"]), roles, spec, dict(student.module._diffusers[0].config))


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--size", type=click.Choice(sorted(SIZES)), default="tiny", show_default=True,
              help="bench: Wan2.1-1.3B's block widths at 2 blocks (the training-stacks benchmark).")
def main(out: Path, **spec) -> None:
    """Train a tiny Wan as a FastVideo run on CPU ranks; write OUT/run/checkpoint-N and the truth."""
    launch(train_and_save, out, **spec)
    click.echo(f"wrote {out / 'run'}", err=True)


if __name__ == "__main__":
    main()
