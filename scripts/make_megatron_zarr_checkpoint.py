"""Make a bf16 Megatron-Core run saved with the ``zarr`` backend by megatron-core's own ``dist_checkpointing.save``
(``sharded_strategy=("zarr", 1)``), on CPU, with the ground truth taken inside the ranks before the save: the data
of tests/data/megatron-zarr/ (its README says how it was made).

    ZARR_VENV/bin/python scripts/make_megatron_zarr_checkpoint.py OUT --tp 2

The zarr backend was the default of Megatron-Core's distributed checkpoints before ``torch_dist``; megatron-core 0.16
dropped it, so this runs in a venv of its own with megatron-core 0.15.3 (the last release with
``strategies/zarr.py``), zarr 2 (the strategy calls zarr 2's API) and tensorstore (whose import registers numpy's
``bfloat16``, without which the strategy cannot save bf16 tensors), seeing this venv's torch:

    python -m venv /tmp/zarr-venv
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/zarr-venv/lib/python3.11/site-packages/zz-cogexport.pth
    /tmp/zarr-venv/bin/pip install --no-deps megatron-core==0.15.3
    /tmp/zarr-venv/bin/pip install "zarr<3" tensorstore

The run is make_megatron_bf16_checkpoint.py's (a tiny bf16 GPTModel, trained as Float16OptimizerWithFloat16Params
trains it: fp32 masters saved as ``optimizer.state.fp32_param.<key>``, Adam's states, a frozen output layer, the
norms in fp32), at TP=2, one iteration; only the backend differs. The same two CUDA calls are stood in for, and the
zarr strategy's own ``torch.cuda.synchronize`` is the first of them.

    OUT/run/iter_0000003/, OUT/run/latest_checkpointed_iteration.txt ("3")
    OUT/truth.safetensors, OUT/truth.json   as make_megatron_bf16_checkpoint.py writes them
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_megatron_bf16_checkpoint import FROZEN, ITERATION, trained  # noqa: E402
from make_megatron_checkpoint import rng_state, stand_in_cuda  # noqa: E402
from megatron_iteration import save_iteration, truth_keys, write_truth  # noqa: E402
from tiny_training import gloo_group, launch  # noqa: E402

BACKEND = ("zarr", 1)


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
        run = save_iteration(spec["out"], rank, ITERATION, state, sharded_strategy=BACKEND)
        if rank == 0:
            import megatron.core

            facts = {"keys": truth_keys(truth, "model"), "trainable": truth_keys(truth, "master"), "frozen": FROZEN,
                     "tp": spec["tp"], "num_layers": config.num_layers, "megatron_core": megatron.core.__version__}
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
