"""Make a real DeepSpeed ZeRO checkpoint on CPU, with the ground truth taken inside the training process.

    python scripts/make_deepspeed_checkpoint.py OUT --stage 2 --dtype bf16 --world-size 2

OUT/checkpoint/ is the DeepSpeed save dir (``latest``, the tag dir). With ``--truth``, OUT/truth.safetensors
holds what a consolidated checkpoint must equal: every trainable parameter's fp32 master (from
``safe_get_full_fp32_param``), every frozen parameter in its stored training dtype and every persistent
buffer, and (under ``optimizer/<state>/<name>``) every per-parameter optimizer state
(``safe_get_full_optimizer_state``); OUT/truth.json lists the module's state_dict order, which names are
trainable, frozen, tied aliases (alias -> source) and buffers, the optimizer step, lr and global step, the loss
on a fixed evaluation batch, and the run's settings. resume_universal.py records the same after a resume.
``--stream-truth`` writes truth.safetensors tensor by tensor as each is gathered (with cogexport's streaming
safetensors writer) instead of holding the whole truth on every rank: for the benchmark model, whose masters and
Adam moments are 5.7 GB.

Models: ``toy`` has odd sizes (so partitions are padded), a frozen layer, a tied weight, a float and an int
buffer; ``bench`` is 28 x Linear(4096, 4096) plus an odd-sized head (about 1.9 GB in fp32), for the benchmark;
``bench-small`` is the same shape at 4 x Linear(256, 256), to try the benchmarks quickly.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import click
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import deepspeed_config, import_deepspeed, spawn_ranks  # noqa: E402

from cogexport.lazy import LazyTensor  # noqa: E402


class ToyModel(nn.Module):
    """Every kind of state a reader must handle, at sizes that never divide evenly between ranks."""

    vocab = 37

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.vocab, 13)
        self.block = nn.Sequential(nn.Linear(13, 29), nn.GELU(), nn.Linear(29, 13))
        self.norm = nn.LayerNorm(13)
        self.frozen_proj = nn.Linear(13, 7)
        self.frozen_proj.requires_grad_(False)
        self.side = nn.Linear(7, 3)
        self.head = nn.Linear(13, self.vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("running_scale", torch.linspace(0.5, 1.5, 5))
        self.register_buffer("step_count", torch.tensor([3, 1, 4], dtype=torch.int64))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)

    def forward(self, batch: torch.Tensor, update_buffers: bool = True) -> torch.Tensor:
        hidden = self.norm(self.embed(batch) + self.block(self.embed(batch)))
        logits = self.head(hidden)
        side = self.side(self.frozen_proj(hidden))
        if update_buffers:
            with torch.no_grad():
                self.step_count += 1
                self.running_scale.mul_(0.75)
        return logits.float().pow(2).mean() + side.float().pow(2).mean()

    @staticmethod
    def batch(step: int, rank: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(1000 * step + rank)
        return torch.randint(0, ToyModel.vocab, (2, 5), generator=generator)


class BenchModel(nn.Module):
    """About 1.9 GB of fp32 parameters, shaped like a real transformer's big matrices."""

    width, depth, head_size = 4096, 28, 1013

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(self.width, self.width, bias=False) for _ in range(self.depth))
        self.head = nn.Linear(self.width, self.head_size)

    def forward(self, batch: torch.Tensor, update_buffers: bool = True) -> torch.Tensor:  # it has no buffers
        hidden = batch.to(self.head.weight.dtype)
        for layer in self.layers:
            hidden = layer(hidden)
        return self.head(hidden).float().pow(2).mean()

    @classmethod
    def batch(cls, step: int, rank: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(1000 * step + rank)
        return torch.randn(1, cls.width, generator=generator) * 1e-3


class SmallBenchModel(BenchModel):
    width, depth = 256, 4


class FrozenNormModel(nn.Module):
    """A frozen LayerNorm and a trainable one whose bf16 copy still equals it after gentle training.

    Stage 0 saves the fp32 masters of the trainable parameters without names, so a reader must place them by
    order, shape and value; here the frozen norm comes first, and only the order says the master is not its.
    ``ambiguous`` puts the frozen norm between, where nothing in the checkpoint can tell the two apart.
    """

    lr = 1e-5  # small enough that the trainable norm's weight still rounds to 1.0 in bf16
    ambiguous = False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        frozen_norm, proj, norm = nn.LayerNorm(8), nn.Linear(8, 8), nn.LayerNorm(8)
        frozen_norm.requires_grad_(False)
        # Registration order is state_dict order, which stage 0 keeps its masters in.
        order = [("proj", proj), ("frozen_norm", frozen_norm)] if self.ambiguous else \
            [("frozen_norm", frozen_norm), ("proj", proj)]
        for name, module in [*order, ("norm", norm)]:
            self.add_module(name, module)

    def forward(self, batch: torch.Tensor, update_buffers: bool = True) -> torch.Tensor:
        batch = batch.to(self.proj.weight.dtype)
        return self.norm(self.proj(self.frozen_norm(batch))).float().pow(2).mean()

    @staticmethod
    def batch(step: int, rank: int) -> torch.Tensor:
        return torch.randn(2, 8, generator=torch.Generator().manual_seed(1000 * step + rank))


class AmbiguousFrozenNormModel(FrozenNormModel):
    ambiguous = True


MODELS = {"toy": ToyModel, "bench": BenchModel, "bench-small": SmallBenchModel, "frozen-norm": FrozenNormModel,
          "ambiguous-frozen-norm": AmbiguousFrozenNormModel}
# The per-parameter state each optimizer keeps (what a universal checkpoint must carry).
OPTIMIZER_STATES = {"adam": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}
EVAL_STEP = 999  # the fixed evaluation batch


def build_engine(deepspeed, spec: dict, **config_extra):
    """The model (seeded, so frozen parameters start equal in every run) under DeepSpeed as ``spec`` asks."""
    torch.manual_seed(0)
    model = MODELS[spec["model"]]()
    config = deepspeed_config(
        spec["stage"],
        spec["dtype"],
        sub_group_size=spec["sub_group_size"],
        parameter_alignment=spec["parameter_alignment"],
        bf16_optimizer=spec["bf16_optimizer"],
        lr=getattr(model, "lr", 1e-2),
    )
    config.update(config_extra)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = None
    if spec.get("optimizer", "adam") == "sgd":  # a client optimizer whose state is not Adam's
        del config["optimizer"]
        config["zero_allow_untested_optimizer"] = True
        optimizer = torch.optim.SGD(trainable, lr=1e-2, momentum=0.9)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, optimizer=optimizer, config=config)
    return engine


def train(engine, spec: dict, rank: int, steps: range) -> list[float]:
    losses = []
    for step in steps:
        loss = engine(MODELS[spec["model"]].batch(step, rank))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def eval_loss(engine, spec: dict) -> float:
    """The loss on a fixed batch, without touching the buffers (every rank takes part under ZeRO-3)."""
    with torch.no_grad():
        return engine(MODELS[spec["model"]].batch(EVAL_STEP, 0), update_buffers=False).item()


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed = import_deepspeed()
    engine = build_engine(deepspeed, spec)
    train(engine, spec, rank, range(spec["steps"]))
    engine.save_checkpoint(spec["save_dir"], tag=spec["tag"], client_state={"epoch": 3, "run_note": "cogexport test"})
    if spec["stream_truth"]:
        stream_truth(deepspeed, engine, spec, rank)
    elif spec["truth"]:
        truth = collect_truth(deepspeed, engine, spec["stage"], OPTIMIZER_STATES[spec["optimizer"]])
        truth["eval_loss"] = eval_loss(engine, spec)
        if rank == 0:
            write_truth(truth, spec, Path(spec["out"]))
    deepspeed.comm.barrier()


def stream_truth(deepspeed, engine, spec: dict, rank: int) -> None:
    """The truth files of train_and_save, written one tensor at a time as it is gathered. Every rank takes part in
    each gather, in the file's storage order; only rank 0 keeps (writes) the result."""
    from cogexport.write.safetensors_file import storage_order, write_safetensors

    tensors, facts = truth_sources(deepspeed, engine, spec["stage"], OPTIMIZER_STATES[spec["optimizer"]])
    if rank == 0:
        write_safetensors(Path(spec["out"]) / "truth.safetensors", tensors)
    else:
        for name in storage_order(tensors):
            tensors[name].load()
    facts["eval_loss"] = eval_loss(engine, spec)
    if rank == 0:
        write_truth_facts(facts, spec, Path(spec["out"]))


def optimizer_step(engine) -> float | None:
    """The step count the torch optimizer keeps (Adam), or None."""
    torch_optimizer = getattr(engine.optimizer, "optimizer", engine.optimizer)  # stage 0 fp32 has no wrapper
    for state in torch_optimizer.state.values():
        if "step" in state:
            return float(state["step"])
    return None


def collect_truth(deepspeed, engine, stage: int, optimizer_states: tuple[str, ...] = ()) -> dict:
    """What the consolidated state dict must hold, read from the live engine (a collective call at stage 3)."""
    tensors, facts = truth_sources(deepspeed, engine, stage, optimizer_states)
    return {"tensors": {name: tensor.load() for name, tensor in tensors.items()}, **facts}


def truth_sources(deepspeed, engine, stage: int, optimizer_states: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """The truth tensors as LazyTensors that read the live engine when loaded (a collective call at stage > 0:
    every rank loads the same names in the same order), and the facts about the module."""
    module = engine.module
    first_name_of: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first_name_of:
            tied[name] = first_name_of[id(param)]
        else:
            first_name_of[id(param)] = name

    def copied(read, *args) -> torch.Tensor:
        return read(*args).detach().clone().cpu()

    def gathered(param) -> torch.Tensor:
        with deepspeed.zero.GatheredParameters([param], enabled=stage == 3):
            return param.detach().clone().cpu()

    tensors: dict[str, LazyTensor] = {}
    trainable, frozen = [], []
    for name, param in module.named_parameters():
        shape = torch.Size(getattr(param, "ds_shape", param.shape))  # ZeRO-3 leaves an empty placeholder
        if param.requires_grad:
            tensors[name] = LazyTensor(shape, torch.float32, partial(copied, fp32_master, deepspeed, engine, param),
                                       f"fp32 master of {name}")
            trainable.append(name)
        else:
            tensors[name] = LazyTensor(shape, param.dtype, partial(gathered, param), f"frozen {name}")
            frozen.append(name)
    buffers = [name for name in module.state_dict() if name not in first_name_of.values() and name not in tied]
    persistent = dict(module.named_buffers())
    for name in buffers:
        buffer = persistent[name].detach().clone().cpu()
        tensors[name] = LazyTensor(buffer.shape, buffer.dtype, lambda value=buffer: value, f"buffer {name}")
    if stage > 0:
        parameters = dict(module.named_parameters())
        for key in optimizer_states:
            for name in trainable:
                # DeepSpeed keeps optimizer states beside the fp32 masters, in fp32 (load() checks).
                tensors[f"optimizer/{key}/{name}"] = LazyTensor(
                    tensors[name].shape, torch.float32,
                    partial(copied, deepspeed.utils.safe_get_full_optimizer_state, parameters[name], key),
                    f"{key} of {name}")
    return tensors, {
        "order": list(module.state_dict().keys()),
        "trainable": trainable,
        "frozen": frozen,
        "tied": tied,
        "buffers": buffers,
        "global_steps": engine.global_steps,
        "optimizer_step": optimizer_step(engine),
        "lr": engine.get_lr()[0],
    }


def fp32_master(deepspeed, engine, param: nn.Parameter) -> torch.Tensor:
    """The optimizer's fp32 master of a trainable parameter, at any stage."""
    master = deepspeed.utils.safe_get_full_fp32_param(param)
    if master is not None:
        return master
    # Stage 0 keeps no fragment mapping: fp32 runs train the parameter itself, bf16/fp16 runs keep
    # per-parameter masters in the wrapper's fp32_groups, aligned with its fp16_groups.
    optimizer = engine.optimizer
    for low_group, master_group in zip(getattr(optimizer, "fp16_groups", []), getattr(optimizer, "fp32_groups", [])):
        for low, master in zip(low_group, master_group):
            if low is param:
                return master
    assert param.dtype == torch.float32, "no fp32 master found for a low-precision parameter"
    return param


def write_truth(truth: dict, spec: dict, out: Path, name: str = "truth") -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in truth.pop("tensors").items()}, out / f"{name}.safetensors")
    write_truth_facts(truth, spec, out, name)


def write_truth_facts(truth: dict, spec: dict, out: Path, name: str = "truth") -> None:
    settings = {k: spec.get(k) for k in ("model", "stage", "dtype", "world_size", "steps", "tag", "sub_group_size",
                                         "parameter_alignment", "bf16_optimizer", "optimizer")}
    (out / f"{name}.json").write_text(json.dumps({**truth, "settings": settings}, indent=1))


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", type=click.Choice(sorted(MODELS)), default="toy", show_default=True)
@click.option("--stage", type=click.IntRange(0, 3), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="bf16", show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--tag", default=None, help="Tag dir name (DeepSpeed's default: global_step{N}).")
@click.option("--sub-group-size", type=int, default=None, help="ZeRO-3 sub-group size (300 gives several on toy).")
@click.option("--parameter-alignment", is_flag=True, help="ZeRO-1/2 alignment gaps between parameters.")
@click.option("--bf16-optimizer", is_flag=True, help="Stage 1 + bf16 + fp32 grad accumulation: BF16_Optimizer.")
@click.option("--optimizer", type=click.Choice(sorted(OPTIMIZER_STATES)), default="adam", show_default=True,
              help="sgd: a client torch SGD with momentum (per-parameter state momentum_buffer).")
@click.option("--truth/--no-truth", default=True, show_default=True, help="Write truth.safetensors and truth.json.")
@click.option("--stream-truth", is_flag=True,
              help="Write the truth one tensor at a time as it is gathered (for big models).")
def main(out: Path, **spec) -> None:
    """Train MODEL a few steps under real DeepSpeed on CPU and save a checkpoint to OUT/checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    spec.update(out=str(out), save_dir=str(out / "checkpoint"))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    spawn_ranks(train_and_save, spec["world_size"], spec)
    click.echo(f"wrote {out / 'checkpoint'}", err=True)


if __name__ == "__main__":
    main()
