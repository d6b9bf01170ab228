"""Make a Megatron-Core ``torch_dist`` iteration of a mixture-of-experts model with megatron-core's own
``dist_checkpointing.save`` on CPU, expert-parallel, with the ground truth taken inside the ranks before the save.

    python scripts/make_megatron_moe_checkpoint.py OUT --ep 2

A tiny ``GPTModel`` whose layers are MoE layers (megatron-core's local layer spec with 4 experts, a ``SequentialMLP``
each, top-2 routing) is built on ``ep`` CPU ranks over gloo, each rank holding its share of the experts, and saved
as built (the layout, not training, is the point): megatron-core stacks each layer's experts on an axis of their own
after the layer axis (``decoder.layers.mlp.experts.experts.linear_fc1.weight`` [L, E, ...]), each rank's local
experts at their global places.

    OUT/run/iter_0000001/, OUT/run/latest_checkpointed_iteration.txt ("1")
    OUT/truth.safetensors   every model tensor whole under megatron-core's key, put together by rank 0 from each
                            rank's shard and the global_slice() megatron-core declares for it
    OUT/truth.json          the keys, the experts, the expert-parallel size

The same two CUDA calls as make_megatron_checkpoint.py are stood in for.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_megatron_checkpoint import gathered_truth, stand_in_cuda  # noqa: E402
from megatron_iteration import save_iteration, write_truth  # noqa: E402
from tiny_training import gloo_group, launch  # noqa: E402

EXPERTS = 4


def tiny_moe_gpt():
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                               use_cpu_initialization=True, num_moe_experts=EXPERTS, moe_router_topk=2,
                               moe_ffn_hidden_size=32)
    return GPTModel(config, get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False), vocab_size=32,
                    max_sequence_length=8), config


def rank_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    warnings.filterwarnings("ignore")
    stand_in_cuda()
    from megatron.core import parallel_state

    torch.manual_seed(1234)  # every rank alike: the weights outside the experts are replicated
    with gloo_group(rendezvous, rank, world_size):
        parallel_state.initialize_model_parallel(expert_model_parallel_size=spec["ep"])
        model, config = tiny_moe_gpt()
        own = torch.Generator().manual_seed(100 + rank)  # each rank's experts (and every bias) their own values,
        with torch.no_grad():                            # so no expert is another's
            for name, parameter in model.named_parameters():
                if ".experts." in name:
                    parameter.normal_(0.0, 0.02, generator=own)
                elif name.endswith(".bias"):
                    parameter.normal_(0.0, 0.02)
        state = model.sharded_state_dict()
        truth = gathered_truth(state)
        run = save_iteration(spec["out"], rank, 1, {"checkpoint_version": 3.0, "iteration": 1, "model": state})
        if rank == 0:
            facts = {"keys": sorted(truth), "experts": EXPERTS, "ep": spec["ep"], "num_layers": config.num_layers}
            write_truth(spec["out"], run, 1, truth, facts)
        parallel_state.destroy_model_parallel()


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--ep", default=2, show_default=True)
def main(out: Path, ep: int) -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    launch(rank_main, out, world_size=ep, ep=ep)


if __name__ == "__main__":
    main()
