"""Make a bf16 Megatron-Core ``torch_dist`` run whose distributed optimizer saved its state in the
``fully_sharded_model_space`` layout (megatron-core 0.8-0.15's default), with megatron-core's own code, on CPU, and
the ground truth taken inside the ranks before the save: the data of tests/data/megatron-fsms-tp2/.

    PYTHONPATH=$PWD /tmp/mcore-venv/bin/python scripts/make_megatron_fsms_checkpoint.py OUT --tp 2 --dp 2

megatron-core 0.16 and later refuse a ShardedTensor with a ``flattened_range`` ("not supported"), so this runs in a
venv holding megatron-core 0.15.3 (``--no-deps``) that sees this project's torch, as make_megatron_zarr_checkpoint.py
does (its docstring has the commands; zarr and tensorstore are not needed here); ``PYTHONPATH`` lets the shared
helpers import this checkout's cogexport. ``--check-only`` runs the last step alone on an OUT already made.

The run is make_megatron_bf16_checkpoint.py's (a tiny bf16 GPTModel, its output layer frozen, trained three steps as
the mixed-precision optimizers train it: Adam on an fp32 master of each bf16 parameter), here on ``tp * dp`` gloo
ranks. megatron-core's ``DistributedOptimizer`` cannot be built on a CPU-only torch (it allocates CUDA tensors), but
its layout is made by its own code:

- the model is wrapped in megatron-core's ``DistributedDataParallel`` (``use_distributed_optimizer``, small buckets)
  and ``DistributedOptimizer._build_gbuf_range_map`` cuts its grad buffers into each data-parallel rank's ranges: a
  parameter's shard on this rank is a flat range of it, a parameter can be split between the two ranks;
- ``DistributedOptimizer.sharded_param_state_fs_model_space`` itself is called with those ranges and each range's
  fp32 master and Adam states (the slices ``_get_main_param_and_optimizer_states`` returns), building the
  ``optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<key>`` ShardedTensors with their ``flattened_range``;
- ``dist_checkpointing.save`` (torch_dist) writes them, reformulated as its strategy does.

    OUT/run/iter_0000003/, OUT/run/latest_checkpointed_iteration.txt ("3")
    OUT/truth.safetensors   model.<key> every model tensor as saved, master.<key> every bf16 parameter's fp32 master
    OUT/truth.json          the keys, which have masters, the ranges each data-parallel rank held, versions

The same two CUDA calls as make_megatron_checkpoint.py are stood in for, and numpy's ``product`` (an alias of
``prod`` numpy 2 removed, which megatron-core 0.15.3 still calls for flattened tensors) is put back. After the save,
one more process loads the iteration with megatron-core's own ``load_plain_tensors`` (which undoes the
reformulation) and checks it against the truth.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_megatron_bf16_checkpoint import FROZEN, ITERATION, saved_dtypes, trained_model  # noqa: E402
from make_megatron_checkpoint import gathered_truth, rng_state, sharded_tensors, stand_in_cuda  # noqa: E402
from megatron_iteration import save_iteration, truth_keys, write_truth  # noqa: E402
from tiny_training import gloo_group, launch  # noqa: E402

BUCKET_SIZE = 600  # elements: small, so the model's parameters fall into several buckets, some split between ranks


def stand_in_numpy_product() -> None:
    """megatron-core 0.15.3 checks flattened tensors with ``numpy.product``, an alias of ``numpy.prod`` that numpy 2
    removed (this project's numpy is 2.x): the alias put back, in these processes only."""
    import numpy

    if not hasattr(numpy, "product"):
        numpy.product = numpy.prod


def gbuf_ranges(model, config) -> list:
    """Each grad buffer's range map as the DistributedOptimizer builds it (its own classmethod), from megatron-core's
    DistributedDataParallel around the trained model."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(
        use_distributed_optimizer=True, bucket_size=BUCKET_SIZE), model)
    return ddp, [DistributedOptimizer._build_gbuf_range_map(buffer) for buffer in ddp.buffers]


def fs_model_space_state(model, model_state, ranges: list, masters: list, optimizer) -> dict:
    """``sharded_param_state_fs_model_space`` run on a stand-in of the optimizer: the attributes it reads, the main
    param and Adam states of each parameter's range on this rank (``_get_main_param_and_optimizer_states``)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    trainable = [p for p in model.parameters() if p.requires_grad]
    stepped = iter(masters)
    main = {p: (next(stepped) if p.dtype == torch.bfloat16 else p) for p in trainable}  # fp32 params: themselves
    where = {param: maps["param"] for buffer in ranges for per_bucket in buffer.values() for bucket in per_bucket
             for param, maps in bucket["param_map"].items()}

    def states_of(model_param):
        flat = slice(where[model_param].start, where[model_param].end)
        state = optimizer.state[main[model_param]]
        return {"param": main[model_param].detach().view(-1)[flat],
                "exp_avg": state["exp_avg"].view(-1)[flat], "exp_avg_sq": state["exp_avg_sq"].view(-1)[flat]}

    stand_in = types.SimpleNamespace(gbuf_ranges=ranges, distributed_optimizer_instance_id=0,
                                     _get_main_param_and_optimizer_states=states_of)
    return DistributedOptimizer.sharded_param_state_fs_model_space(stand_in, model_state)


def master_truth(model, model_state, masters: list) -> dict[str, torch.Tensor]:
    """Every bf16 parameter's fp32 master whole, put together as the model tensors are."""
    from dataclasses import replace

    by_data = {sh.data: sh for sh in sharded_tensors(model_state)}
    low = [p for p in model.parameters() if p.requires_grad and p.dtype == torch.bfloat16]
    pieces = [replace(by_data[p], data=m.detach(), dtype=torch.float32) for p, m in zip(low, masters)]
    return gathered_truth({"masters": pieces})


def held_ranges(param_state: dict) -> list:
    return sorted([sh.key, sh.flattened_range.start, sh.flattened_range.stop]
                  for tensors in param_state.values() for sh in tensors.values() if sh.key.count("fp32_param"))


def rank_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    warnings.filterwarnings("ignore")
    stand_in_cuda()
    stand_in_numpy_product()
    from megatron.core import parallel_state

    torch.manual_seed(1234)  # every rank alike: the data-parallel replicas train the same weights
    with gloo_group(rendezvous, rank, world_size):
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=spec["tp"])
        model, config, masters, optimizer = trained_model(spec["tp"])
        ddp, ranges = gbuf_ranges(model, config)
        model_state = model.sharded_state_dict()
        param_state = fs_model_space_state(model, model_state, ranges, masters, optimizer)
        dtypes = saved_dtypes(model_state)
        truth = {f"model.{key}": t.to(dtypes[key]) for key, t in gathered_truth(model_state).items()}
        truth.update({f"master.{key}": t for key, t in master_truth(model, model_state, masters).items()})
        every: list = [None] * world_size
        torch.distributed.all_gather_object(every, held_ranges(param_state))
        optimizer_part = {"param_state": param_state, "param_state_sharding_type": "fully_sharded_model_space"}
        state = {"checkpoint_version": 3.0, "iteration": ITERATION, "model": model_state,
                 "optimizer": optimizer_part, "rng_state": rng_state(spec["tp"], 1)}
        run = save_iteration(spec["out"], rank, ITERATION, state)
        if rank == 0:
            write_outputs(spec, run, truth, every, config)
        parallel_state.destroy_model_parallel()


def write_outputs(spec: dict, run: Path, truth: dict, every: list, config) -> None:
    import megatron.core

    facts = {"keys": truth_keys(truth, "model"), "trainable": truth_keys(truth, "master"),
             "frozen": FROZEN, "tp": spec["tp"], "dp": spec["dp"], "num_layers": config.num_layers,
             "bucket_size": BUCKET_SIZE, "megatron_core": megatron.core.__version__,
             "fp32_param_ranges_by_rank": every}
    write_truth(spec["out"], run, ITERATION, truth, facts)


def check_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    """megatron-core's own load of every model tensor and master (its strategy undoes the reformulation), on one
    rank, against the truth; a flat master comes back flat, in its parameter's C order."""
    warnings.filterwarnings("ignore")
    stand_in_cuda()
    stand_in_numpy_product()
    from megatron.core import dist_checkpointing
    from safetensors.torch import load_file

    truth = load_file(str(Path(spec["out"]) / "truth.safetensors"))
    with gloo_group(rendezvous, rank, world_size):
        loaded = dist_checkpointing.load_plain_tensors(str(Path(spec["out"]) / "run" / f"iter_{ITERATION:07d}"))
    compared = 0
    for name, expected in truth.items():
        kind, key = name.split(".", 1)
        got = loaded[key if kind == "model" else f"optimizer.state.fp32_param.{key}"]
        if not torch.equal(got.reshape(expected.shape), expected):
            raise RuntimeError(f"megatron-core's load of {name} differs from the truth")
        compared += 1
    print(f"megatron-core's load_plain_tensors: {compared} tensors equal to the truth")


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--tp", default=2, show_default=True)
@click.option("--dp", default=2, show_default=True)
@click.option("--check-only", is_flag=True, help="only load OUT's iteration with megatron-core and compare")
def main(out: Path, tp: int, dp: int, check_only: bool) -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    if not check_only:
        launch(rank_main, out, world_size=tp * dp, tp=tp, dp=dp)
    launch(check_main, out, world_size=1)


if __name__ == "__main__":
    main()
