"""A tiny Cosmos run saved as NVIDIA's imaginaire saves it (cosmos-predict2.5's DCP checkpointer), on 2 CPU gloo ranks
under FSDP2 (tests, docs):

    OUT/run/checkpoints/latest_checkpoint.txt        "iter_000000002"
    OUT/run/checkpoints/iter_00000000N/model/        net.* (bf16, trained) and net_ema.* (fp32, its EMA), flat
    OUT/run/checkpoints/iter_00000000N/optim/        get_optimizer_state_dict(flatten_optimizer_state_dict=True)
    OUT/run/checkpoints/iter_00000000N/scheduler/    the LR scheduler's state dict
    OUT/run/checkpoints/iter_00000000N/trainer/      {"grad_scaler": ..., "iteration": N}
    OUT/truth/iter_00000000N.safetensors             the model state dict (net.* and net_ema.*) gathered in training
    OUT/base/                                         the Diffusers config the run was made from (for --base)

    python scripts/train_tiny_cosmos_imaginaire.py OUT

imaginaire's network (MiniTrainDIT) needs Transformer Engine and a GPU; the stand-in here has exactly its state dict
(the tiny Diffusers model's weights under NVIDIA's names, and the buffers beside them: scripts/make_tiny_cosmos.py's
independent writer) as nested modules, so that FSDP2 shards it block by block and DCP saves it under the same flat
names imaginaire's does. Transformer Engine's extra state is a uint8 buffer here (TE returns it from
get_extra_state; the saved tensor is the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_cosmos import build_transformer, release_state_dict  # noqa: E402
from tiny_training import gloo_group, launch  # noqa: E402

ITERATIONS = 2
EMA_DECAY = 0.5  # large steps, so that the EMA differs visibly from the weights after two iterations


def _module_tree(state: dict[str, torch.Tensor], parameters_dtype: torch.dtype, trainable: bool) -> nn.Module:
    """Nested modules holding ``state`` under its dotted names: floating weights as parameters, the counters, RoPE
    tables and extra state (no weights in MiniTrainDIT either) as buffers."""
    root = nn.Module()
    for name, tensor in state.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        if _is_buffer(name):
            module.register_buffer(leaf, tensor.clone())
        else:
            module.register_parameter(leaf, nn.Parameter(tensor.to(parameters_dtype), requires_grad=trainable))
    return root


def _is_buffer(name: str) -> bool:
    return name.startswith(("accum_", "pos_embedder.")) or name.endswith("._extra_state")


def _diffusion_model() -> nn.Module:
    """imaginaire's DiffusionModel as its state dict sees it: ``net`` trained in bf16, ``net_ema`` in fp32."""
    model = nn.Module()
    weights = {name.removeprefix("net."): t for name, t in release_state_dict(build_transformer("2", seed=0)).items()}
    model.net = _module_tree(weights, torch.bfloat16, trainable=True)
    model.net_ema = _module_tree(weights, torch.float32, trainable=False)
    return model


def _shard(model: nn.Module, world_size: int) -> None:
    """FSDP2 as imaginaire applies it: each block of each network, then each network, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    for network in (model.net, model.net_ema):
        for block in network.blocks.children():
            fully_shard(block, mesh=mesh)
        fully_shard(network, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _train_step(model: nn.Module, optimizer, iteration: int, rank: int) -> None:
    """A made-up loss (each rank its own noise), AdamW, the EMA and imaginaire's counters updated."""
    generator = torch.Generator().manual_seed(100 * iteration + rank)
    # on each rank's shard (FSDP2 keeps each parameter as a DTensor sharded on dim 0; no forward gathers it here)
    loss = sum((p.to_local().float() * torch.randn(p.to_local().shape, generator=generator)).sum()
               for p in model.net.parameters())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        for ema, trained in zip(model.net_ema.parameters(), model.net.parameters()):
            ema.to_local().lerp_(trained.to_local().float(), 1 - EMA_DECAY)
        model.net.accum_iteration += 1
        model.net.accum_video_sample_counter += 4


def _save(model: nn.Module, optimizer, scheduler, iteration: int, checkpoints: Path, rank: int) -> None:
    """The four DCP folders of one iteration, then latest_checkpoint.txt (rank 0), as imaginaire's checkpointer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    tag = f"iter_{iteration:09}"
    saved = {"model": get_model_state_dict(model),
             "optim": get_optimizer_state_dict(model, optimizer,
                                               options=StateDictOptions(flatten_optimizer_state_dict=True)),
             "scheduler": scheduler.state_dict(),
             "trainer": {"grad_scaler": {}, "iteration": iteration}}
    for folder, state in saved.items():
        dcp.save(state, checkpoint_id=str(checkpoints / tag / folder),
                 planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True))
    if rank == 0:
        (checkpoints / "latest_checkpoint.txt").write_text(f"{tag}\n")


def _write_truth(model: nn.Module, iteration: int, out: Path, rank: int) -> None:
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        (out / "truth").mkdir(exist_ok=True)
        save_file({name: t.detach().clone().contiguous() for name, t in weights.items()},
                  out / "truth" / f"iter_{iteration:09}.safetensors")


def rank_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    out = Path(spec["out"])
    checkpoints = out / "run" / "checkpoints"
    with gloo_group(rendezvous, rank, world_size):
        model = _diffusion_model()
        _shard(model, world_size)
        optimizer = torch.optim.AdamW(model.net.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        for iteration in range(1, ITERATIONS + 1):
            _train_step(model, optimizer, iteration, rank)
            scheduler.step()
            _save(model, optimizer, scheduler, iteration, checkpoints, rank)
            _write_truth(model, iteration, out, rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    out = launch(rank_main, args.out, world_size=2)
    build_transformer("2", seed=0).save_pretrained(out / "base")
    (out / "truth" / "facts.json").write_text(json.dumps({"iterations": ITERATIONS, "world_size": 2}))


if __name__ == "__main__":
    main()
