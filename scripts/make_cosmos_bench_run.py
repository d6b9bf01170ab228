"""One iteration of an imaginaire run (NVIDIA cosmos-predict2.5's DCP checkpointer) at full Cosmos Predict 2.5 2B
width, of random weights, saved by 2 CPU gloo ranks under FSDP2 (scripts/benchmark_cosmos.py):

    OUT/run/checkpoints/latest_checkpoint.txt       "iter_000000001"
    OUT/run/checkpoints/iter_000000001/model/       net.* (bf16) and net_ema.* (fp32), flat, DTensor shards
    OUT/run/checkpoints/iter_000000001/scheduler/   a LR scheduler's state dict
    OUT/run/checkpoints/iter_000000001/trainer/     {"grad_scaler": {}, "iteration": 1}
    OUT/base/config.json                            the Diffusers config of that size (for --base)

    python scripts/make_cosmos_bench_run.py OUT [--layers 4]

The network is train_tiny_cosmos_imaginaire.py's stand-in for MiniTrainDIT (its exact state dict as nested modules),
built on the meta device from the Diffusers model's names and shapes, sharded block by block as imaginaire shards it,
then given memory: each rank fills only its own shards (seeded noise, N(0, 0.02)), so no rank ever holds a whole
network. No training step is taken and ``optim/`` is not written: at this size the Adam states would be twice the
trained weights on disk, and neither tool under benchmark reads them.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_cosmos import original_name, release_buffers  # noqa: E402
from tiny_training import gloo_group, launch  # noqa: E402
from train_tiny_cosmos_imaginaire import _module_tree, _shard  # noqa: E402

FULL_LAYERS = 28  # Cosmos Predict 2.5 2B
TAG = "iter_000000001"


def bench_config(layers: int) -> dict:
    """Cosmos Predict 2.5 2B's Diffusers config (cogexport's variant data) with ``layers`` blocks."""
    from cogexport.models.family import family_named

    family = family_named("cosmos")
    return {**family.transformer_config(family.variant_named("Cosmos-Predict2.5-2B")), "num_layers": layers}


def original_state(config: dict) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(MiniTrainDIT's weights as meta tensors, the real buffers beside them), under NVIDIA's names."""
    from diffusers import CosmosTransformer3DModel

    with torch.device("meta"):
        model = CosmosTransformer3DModel.from_config(config)
    weights = {original_name(name): tensor for name, tensor in model.state_dict().items()}
    return weights, release_buffers(dict(model.config))


def _fill(model: torch.nn.Module, buffers: dict[str, torch.Tensor], rank: int) -> None:
    """Every parameter's local shard seeded noise (the seed from its name and the rank), every buffer its value."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            local = parameter.to_local()
            generator = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}".encode()))
            local.copy_(torch.randn(local.shape, generator=generator) * 0.02)
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name.split(".", 1)[1]])


def _save(model: torch.nn.Module, checkpoints: Path, rank: int) -> None:
    """The model, scheduler and trainer folders of one iteration, then latest_checkpoint.txt, as imaginaire saves."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    saved = {"model": get_model_state_dict(model),
             "scheduler": {"base_lrs": [1e-4], "last_epoch": 1, "_step_count": 2},
             "trainer": {"grad_scaler": {}, "iteration": 1}}
    for folder, state in saved.items():
        dcp.save(state, checkpoint_id=str(checkpoints / TAG / folder),
                 planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True))
    if rank == 0:
        (checkpoints / "latest_checkpoint.txt").write_text(f"{TAG}\n")


def rank_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    weights, buffers = original_state(spec["config"])
    state = {**weights, **{name: tensor.to("meta") for name, tensor in buffers.items()}}
    with gloo_group(rendezvous, rank, world_size):
        model = torch.nn.Module()
        model.net = _module_tree(state, torch.bfloat16, trainable=True)
        model.net_ema = _module_tree(state, torch.float32, trainable=False)
        _shard(model, world_size)
        model.to_empty(device="cpu")
        _fill(model, buffers, rank)
        _save(model, Path(spec["out"]) / "run" / "checkpoints", rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    config = bench_config(args.layers)
    out = launch(rank_main, args.out, world_size=2, config=config)
    from diffusers import CosmosTransformer3DModel

    with torch.device("meta"):
        CosmosTransformer3DModel.from_config(config).save_config(out / "base")


if __name__ == "__main__":
    main()
