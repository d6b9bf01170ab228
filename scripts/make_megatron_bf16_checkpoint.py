"""Make a bf16 Megatron-Core ``torch_dist`` run whose optimizer keeps fp32 masters, saved with megatron-core's own
``dist_checkpointing.save`` on CPU, with the ground truth taken inside the ranks before the save.

    python scripts/make_megatron_bf16_checkpoint.py OUT --tp 2

A tiny ``GPTModel`` (megatron-core's local layer spec) with bf16 parameters is built on ``tp`` CPU ranks over gloo and
trained as megatron-core's ``Float16OptimizerWithFloat16Params`` trains it: an fp32 copy of every trainable bf16
parameter (the main param) is what Adam steps, and the bf16 parameter is that copy rounded after each step (the
norms' fp32 weights are stepped themselves, without a copy). The
output layer is frozen (no master, no optimizer state). megatron-core's own optimizer needs CUDA tensors, so
the loop is written here; the save is laid out by megatron-core's own code as that optimizer's
``sharded_state_dict`` lays it out: each master through ``make_sharded_optimizer_tensor(..., prefix=
'optimizer.state.fp32_param')`` under ``fp32_from_fp16_params``, the Adam states through
``optim_state_to_sharding_state``.

    OUT/run/iter_0000003/, OUT/run/latest_checkpointed_iteration.txt ("3")

Ground truth: OUT/truth.safetensors holds, under megatron-core's keys (stacked layers [L, ...]), every model tensor
as saved (bf16; the norms' fp32) as ``model.<key>`` and every fp32 master as ``master.<key>``, each put together by
rank 0 from the ranks' shards and the ``global_slice()`` megatron-core declares for them; OUT/truth.json the keys,
which have masters, and the config. The same two CUDA calls as make_megatron_checkpoint.py are stood in for.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_megatron_checkpoint import LEARNING_RATE, gathered_truth, rng_state, stand_in_cuda  # noqa: E402
from megatron_iteration import save_iteration, truth_keys, write_truth  # noqa: E402
from tiny_training import gloo_group, launch  # noqa: E402

ITERATION = 3
FROZEN = "output_layer.weight"  # a bf16 parameter left untrained: no master, no optimizer state


def tiny_bf16_gpt(tp: int):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                               use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True,
                               pipeline_dtype=torch.bfloat16, tensor_model_parallel_size=tp)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=32, max_sequence_length=8,
                     share_embeddings_and_output_weights=False)
    return model, config


def train(model) -> tuple[list, torch.optim.Adam]:
    """Steps of Adam as Float16OptimizerWithFloat16Params takes them: on an fp32 master of each trainable bf16
    parameter (the parameter is its master rounded after every step), on a trainable fp32 parameter (megatron-core's
    norms keep fp32 weights) itself. The loss is half the sum of squares, so each gradient is the parameter itself.
    Returns the masters (one per bf16 parameter, in order) and the optimizer."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    stepped = [p.detach().clone().float() if p.dtype == torch.bfloat16 else p for p in trainable]
    optimizer = torch.optim.Adam(stepped, lr=LEARNING_RATE)
    for _ in range(ITERATION):
        for parameter in trainable:
            parameter.grad = None
        (0.5 * sum((p.float() * p.float()).sum() for p in trainable)).backward()
        for master, parameter in zip(stepped, trainable):
            if master is not parameter:
                master.grad = parameter.grad.float()
        optimizer.step()
        with torch.no_grad():
            for master, parameter in zip(stepped, trainable):
                if master is not parameter:
                    parameter.copy_(master)
    return [m for m, p in zip(stepped, trainable) if m is not p], optimizer


def optimizer_state(model, model_state: dict, masters: list, optimizer: torch.optim.Adam) -> dict:
    """The optimizer's part of the save, laid out by megatron-core's own functions as its mixed-precision optimizer
    lays it out: the masters of the bf16 parameters as fp32_param, Adam's states of every trainable parameter."""
    from megatron.core.dist_checkpointing.optimizer import (get_param_id_to_sharded_param_map,
                                                            make_sharded_optimizer_tensor,
                                                            optim_state_to_sharding_state)

    trainable = [p for p in model.parameters() if p.requires_grad]
    id_to_sharded = get_param_id_to_sharded_param_map(model_state, trainable)
    state = {"optimizer": optimizer.state_dict()}
    low = [param_id for param_id, p in enumerate(trainable) if p.dtype == torch.bfloat16]
    state["fp32_from_fp16_params"] = [make_sharded_optimizer_tensor(id_to_sharded[param_id], master,
                                                                    prefix="optimizer.state.fp32_param")
                                      for param_id, master in zip(low, masters)]
    step = next(iter(state["optimizer"]["state"].values()))["step"]
    optim_state_to_sharding_state(state["optimizer"], id_to_sharded, exclude_keys="step")
    state["optimizer"]["state"]["common_step"] = step
    return state


def saved_dtypes(model_state: dict) -> dict[str, torch.dtype]:
    from make_megatron_checkpoint import sharded_tensors

    return {sharded.key: sharded.data.dtype for sharded in sharded_tensors(model_state)}


def trained_model(tp: int):
    """The model trained as Float16OptimizerWithFloat16Params trains it (biases started off zero: each its own
    values, so none is another's; the output layer frozen), its config, masters and optimizer."""
    model, config = tiny_bf16_gpt(tp)
    dict(model.named_parameters())[FROZEN].requires_grad_(False)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, 0.02)
    masters, optimizer = train(model)
    return model, config, masters, optimizer


def trained(tp: int) -> tuple:
    """The trained model's config, its sharded state, the optimizer's part of the save and the truth: every model
    tensor in its own dtype (the gathered tensors are fp32) and every master."""
    model, config, masters, optimizer = trained_model(tp)
    model_state = model.sharded_state_dict()
    optimizer_part = optimizer_state(model, model_state, masters, optimizer)
    dtypes = saved_dtypes(model_state)
    truth = {f"model.{key}": t.to(dtypes[key]) for key, t in gathered_truth(model_state).items()}
    prefix = "optimizer.state.fp32_param."
    truth.update({f"master.{key[len(prefix):]}": t
                  for key, t in gathered_truth(optimizer_part["fp32_from_fp16_params"]).items()})
    return config, model_state, optimizer_part, truth


def rank_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    warnings.filterwarnings("ignore")
    stand_in_cuda()
    from megatron.core import parallel_state

    torch.manual_seed(1234)
    with gloo_group(rendezvous, rank, world_size):
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=spec["tp"])
        config, model_state, optimizer_part, truth = trained(spec["tp"])
        state = {"checkpoint_version": 3.0, "iteration": ITERATION, "model": model_state,
                 "optimizer": optimizer_part, "rng_state": rng_state(spec["tp"], 1)}
        run = save_iteration(spec["out"], rank, ITERATION, state)
        if rank == 0:
            facts = {"keys": truth_keys(truth, "model"), "trainable": truth_keys(truth, "master"), "frozen": FROZEN,
                     "tp": spec["tp"], "num_layers": config.num_layers}
            write_truth(spec["out"], run, ITERATION, truth, facts)
        parallel_state.destroy_model_parallel()


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--tp", default=2, show_default=True)
def main(out: Path, tp: int) -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    launch(rank_main, out, world_size=tp, tp=tp)


if __name__ == "__main__":
    main()
