"""Make a Megatron-Core ``torch_dist`` run on CPU with megatron-core's own ``dist_checkpointing.save``, with the ground
truth taken inside the ranks before each save.

    python scripts/make_megatron_checkpoint.py OUT --tp 2 --pp 2

A tiny ``GPTModel`` (megatron-core's local layer spec: no Transformer Engine) is built on ``tp * pp`` CPU ranks over
gloo, trained one step per iteration with torch's Adam on its local shards (the loss is half the sum of squares, so
each gradient is the weight itself), and saved after iterations 5 and 10 as Megatron-LM saves it:

    OUT/run/iter_0000005/, OUT/run/iter_0000010/    dist_checkpointing.save of {args, checkpoint_version, iteration,
                                                    model (sharded_state_dict), optimizer (megatron-core's
                                                    optim_state_to_sharding_state: optimizer.state.exp_avg.<key>, ...),
                                                    rng_state (a ShardedObject per pp/tp rank)}
    OUT/run/latest_checkpointed_iteration.txt       "10", written after the save, as Megatron-LM's tracker

Ground truth: OUT/truth.safetensors holds every model tensor at each iteration as ``iter<N>.<key>``, the full global
tensor under megatron-core's key (stacked layers [L, ...]), put together by rank 0 from each rank's local shard and the
``global_slice()`` megatron-core declares for it; OUT/truth.json the keys, the config and the iterations.

megatron-core 0.19.2 saves on CPU with two CUDA calls stood in for, in these processes only: ``torch.cuda.synchronize``
(after FileSystemWriterAsync's non-blocking copies to CPU, which are already done on CPU) is a no-op, and
``torch.cuda.current_device`` (the device of the one-element failure flag save_state_dict_async_finalize
all-reduces) answers "cpu". Everything else runs as shipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_training import gloo_group, launch  # noqa: E402

ITERATIONS = (5, 10)
LEARNING_RATE = 1e-2


def stand_in_cuda() -> None:
    """The two CUDA calls megatron-core's save makes that a CPU-only torch cannot answer (see the docstring)."""
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: "cpu"


def tiny_gpt(tp: int, pp: int):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(num_layers=4, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                               use_cpu_initialization=True, params_dtype=torch.float32, pipeline_dtype=torch.float32,
                               tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    return GPTModel(config, get_gpt_layer_local_spec(), vocab_size=32, max_sequence_length=8,
                    pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage(),
                    share_embeddings_and_output_weights=False), config


def sharded_tensors(state: dict) -> list:
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return [value for value in nested_values(state) if isinstance(value, ShardedTensor)]


def gathered_truth(model_state: dict) -> dict[str, torch.Tensor]:
    """Every model tensor whole: each rank's local shard put where megatron-core says it lies (rank 0's result)."""
    import torch.distributed as dist

    pieces = [(sh.key, tuple(sh.global_shape), sh.global_slice(), sh.data.detach().clone())
              for sh in sharded_tensors(model_state)]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, pieces)
    full: dict[str, torch.Tensor] = {}
    for key, shape, where, data in (piece for rank_pieces in every for piece in rank_pieces):
        box = full.setdefault(key, torch.full(shape, float("nan")))[where]
        if not torch.isnan(box).all() and not torch.equal(box, data):
            raise RuntimeError(f"the replicas of {key} differ: no one truth to compare with")
        box.copy_(data)
    return full


def rng_state(tp: int, pp: int):
    """Megatron-LM's rng_state entry: one ShardedObject per pipeline and tensor rank."""
    import random

    import numpy
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = [{"random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
              "torch_rng_state": torch.get_rng_state()}]
    return ShardedObject("rng_state", state, (pp, tp), (parallel_state.get_pipeline_model_parallel_rank(),
                                                       parallel_state.get_tensor_model_parallel_rank()),
                         replica_id=parallel_state.get_data_parallel_rank())


def rank_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    warnings.filterwarnings("ignore")
    stand_in_cuda()
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.optimizer import (get_param_id_to_sharded_param_map,
                                                            optim_state_to_sharding_state)

    torch.manual_seed(1234)  # every rank alike, as Megatron's seeding makes replicated weights (position embeddings)
    with gloo_group(rendezvous, rank, world_size):
        tp, pp = spec["tp"], spec["pp"]
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
        model, config = tiny_gpt(tp, pp)
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        run, truth, keys = Path(spec["out"]) / "run", {}, {}
        for iteration in range(1, ITERATIONS[-1] + 1):
            optimizer.zero_grad()
            (0.5 * sum((p * p).sum() for p in model.parameters())).backward()
            optimizer.step()
            if iteration not in ITERATIONS:
                continue
            model_state = model.sharded_state_dict()
            for key, tensor in gathered_truth(model_state).items():
                truth[f"iter{iteration}.{key}"] = tensor
                keys[key] = list(tensor.shape)
            id_to_sharded = get_param_id_to_sharded_param_map(model_state, model.parameters())
            optimizer_state = optimizer.state_dict()
            # as megatron-core's FP32Optimizer.sharded_state_dict: the per-parameter step saved once, in common state
            step = next(iter(optimizer_state["state"].values()))["step"]
            optim_state_to_sharding_state(optimizer_state, id_to_sharded, exclude_keys="step")
            optimizer_state["state"]["common_step"] = step
            args = argparse.Namespace(num_layers=config.num_layers, hidden_size=config.hidden_size,
                                      num_attention_heads=config.num_attention_heads, tensor_model_parallel_size=tp,
                                      pipeline_model_parallel_size=pp, iteration=iteration, ckpt_format="torch_dist")
            state = {"args": args, "checkpoint_version": 3.0, "iteration": iteration, "model": model_state,
                     "optimizer": optimizer_state, "rng_state": rng_state(tp, pp)}
            folder = run / f"iter_{iteration:07d}"
            if rank == 0:
                folder.mkdir(parents=True, exist_ok=True)
            torch.distributed.barrier()
            dist_checkpointing.save(state, str(folder))
            if rank == 0:
                (run / "latest_checkpointed_iteration.txt").write_text(str(iteration))
        if rank == 0:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in truth.items()}, str(Path(spec["out"]) / "truth.safetensors"))
            facts = {"keys": keys, "iterations": list(ITERATIONS), "tp": tp, "pp": pp,
                     "num_layers": config.num_layers, "hidden_size": config.hidden_size}
            (Path(spec["out"]) / "truth.json").write_text(json.dumps(facts, indent=1))
        parallel_state.destroy_model_parallel()


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--tp", default=2, show_default=True)
@click.option("--pp", default=2, show_default=True)
def main(out: Path, tp: int, pp: int) -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    launch(rank_main, out, world_size=tp * pp, tp=tp, pp=pp)


if __name__ == "__main__":
    main()
