"""Resume a toy run from a universal checkpoint under real DeepSpeed, at any world size, and record what it got.

    python scripts/resume_universal.py LOAD_DIR OUT --stage 2 --dtype bf16 --world-size 3 [--optimizer sgd]

Builds the same toy model as make_deepspeed_checkpoint.py (same seed), loads LOAD_DIR with
``{"checkpoint": {"load_universal": true}}`` (LOAD_DIR holds ``latest_universal``), then writes OUT/resumed.json and
OUT/resumed.safetensors in the same form as that script's truth files: fp32 masters, optimizer states, step, lr,
global step and the loss on the fixed evaluation batch, all taken inside the resumed training process. It then
trains --steps-after more steps and records their losses and the step counts they reach.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import import_deepspeed, spawn_ranks  # noqa: E402
from make_deepspeed_checkpoint import (MODELS, OPTIMIZER_STATES, build_engine, collect_truth, eval_loss,  # noqa: E402
                                       optimizer_step, train, write_truth)


def resume(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed = import_deepspeed()
    engine = build_engine(deepspeed, spec, checkpoint={"load_universal": True})
    engine.load_checkpoint(spec["load_dir"])
    resumed = collect_truth(deepspeed, engine, spec["stage"], OPTIMIZER_STATES[spec["optimizer"]])
    resumed["eval_loss"] = eval_loss(engine, spec)
    start = engine.global_steps
    resumed["losses_after"] = train(engine, spec, rank, range(start, start + spec["steps_after"]))
    resumed["global_steps_after"] = engine.global_steps
    resumed["optimizer_step_after"] = optimizer_step(engine)
    if rank == 0:
        write_truth(resumed, spec, Path(spec["out"]), name="resumed")
    deepspeed.comm.barrier()


@click.command()
@click.argument("load_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", type=click.Choice(sorted(MODELS)), default="toy", show_default=True)
@click.option("--stage", type=click.IntRange(1, 3), required=True)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), required=True)
@click.option("--world-size", type=click.IntRange(1, 16), required=True)
@click.option("--bf16-optimizer", is_flag=True)
@click.option("--optimizer", type=click.Choice(sorted(OPTIMIZER_STATES)), default="adam", show_default=True)
@click.option("--steps-after", type=click.IntRange(0), default=2, show_default=True)
def main(load_dir: Path, out: Path, **spec) -> None:
    """Resume from the universal checkpoint in LOAD_DIR and record the state it restored into OUT."""
    out.mkdir(parents=True, exist_ok=True)
    spec.update(load_dir=str(load_dir), out=str(out), sub_group_size=None, parameter_alignment=False, steps=None,
                tag=None)
    spawn_ranks(resume, spec["world_size"], spec)
    click.echo(json.dumps({"wrote": str(out)}), err=True)


if __name__ == "__main__":
    main()
