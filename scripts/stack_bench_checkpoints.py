"""The training stacks' benchmark checkpoints (scripts/benchmark_training_stacks.py), each made once per work dir by
the stack's own code at widths where the bytes, not the start, take the time.

    python scripts/stack_bench_checkpoints.py WORK autotp|trainer|fastvideo

- ``cogvideox-base``: make_tiny_cogvideox.py's pipeline with its transformer replaced by a wider one (16 heads of 64,
  ``COGVIDEOX_LAYERS`` layers: 0.8 GB fp32), seeded and randomized like the tiny ones; the makers read only its
  transformer and scheduler.
- ``autotp``: make_autotp_checkpoint.py on it: DeepSpeed AutoTP 2 x ZeRO-3, 2 data-parallel ranks, fp32 training.
- ``trainer``: make_trainer_checkpoint.py on it: transformers' Trainer under DeepSpeed ZeRO-2, bf16, world size 2.
- ``fastvideo``: make_fastvideo_checkpoint.py at ``--size bench`` (a DMD2 run: student, critic and EMA roles).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

COGVIDEOX_LAYERS = 16
COGVIDEOX_WIDTH = {"num_attention_heads": 16, "attention_head_dim": 64}


def cogvideox_base(work: Path) -> Path:
    """The tiny CogVideoX pipeline folder, its transformer widened (made once)."""
    base = work / "cogvideox-base"
    if (base / "complete").exists():
        return base
    shutil.rmtree(base, ignore_errors=True)
    subprocess.run([sys.executable, str(SCRIPTS / "make_tiny_cogvideox.py"), str(base), "--variant", "t2v"],
                   check=True, stdout=subprocess.DEVNULL)
    import torch
    from diffusers import CogVideoXTransformer3DModel

    from cogvideox_tiny_configs import tiny_transformer_config
    from tiny_models import randomize_

    torch.manual_seed(0)
    config = {**tiny_transformer_config("2b", COGVIDEOX_LAYERS), **COGVIDEOX_WIDTH}
    wide = randomize_(CogVideoXTransformer3DModel(**config), seed=0)
    shutil.rmtree(base / "transformer")
    wide.save_pretrained(base / "transformer")
    (base / "complete").write_text("")
    return base


def made_once(folder: Path, command: list[str]) -> Path:
    """Run a maker into FOLDER unless a finished one is there ('complete' is written last)."""
    if not (folder / "complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"making {folder.name} (minutes)...", err=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(SCRIPTS.parent)})
        (folder / "complete").write_text("")
    return folder


def autotp_run(work: Path) -> Path:
    folder = work / "autotp-tp2-zero3"
    return made_once(folder, [sys.executable, str(SCRIPTS / "make_autotp_checkpoint.py"), str(cogvideox_base(work)),
                              str(folder), "--tp", "2", "--world-size", "4", "--stage", "3", "--dtype", "fp32",
                              "--steps", "1"])


def trainer_run(work: Path) -> Path:
    folder = work / "trainer-zero2"
    return made_once(folder, [sys.executable, str(SCRIPTS / "make_trainer_checkpoint.py"), str(cogvideox_base(work)),
                              str(folder), "--stage", "2", "--world-size", "2", "--steps", "1", "--dtype", "bf16"])


def fastvideo_run(work: Path) -> Path:
    folder = work / "fastvideo-dmd2"
    made_once(folder, [sys.executable, str(SCRIPTS / "make_fastvideo_checkpoint.py"), str(folder),
                       "--world-size", "2", "--steps", "1", "--size", "bench"])
    fastvideo_base(folder)
    return folder


def fastvideo_base(run: Path) -> Path:
    """RUN/base: the folder a FastVideo run names as ``init_from`` (model_index.json, transformer/config.json of the
    trained transformer; no weights: both converters read only its configs) and RUN/run.yaml, the run's config
    (metadata.json's) naming it, for FastVideo's converter (``--config``)."""
    import json

    import torch
    import yaml
    from diffusers import WanTransformer3DModel

    base = run / "base"
    if (run / "run.yaml").exists():  # written last
        return base
    config = json.loads((run / "truth.json").read_text())["config"]
    with torch.device("meta"):
        WanTransformer3DModel.from_config(config).save_config(base / "transformer")  # the config alone
    (base / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline",
                                                       "transformer": ["diffusers", "WanTransformer3DModel"]}))
    step = json.loads((run / "run" / "checkpoint-1" / "metadata.json").read_text())["config"]
    for model in step["models"].values():
        model["init_from"] = str(base)
    (run / "run.yaml").write_text(yaml.safe_dump(step))
    return base


MAKERS = {"autotp": autotp_run, "trainer": trainer_run, "fastvideo": fastvideo_run}


@click.command()
@click.argument("work", type=click.Path(file_okay=False, path_type=Path))
@click.argument("stacks", nargs=-1, type=click.Choice(sorted(MAKERS)))
def main(work: Path, stacks: tuple[str, ...]) -> None:
    """Make the named stacks' benchmark checkpoints in WORK (each once)."""
    work.mkdir(parents=True, exist_ok=True)
    for stack in stacks:
        click.echo(MAKERS[stack](work))


if __name__ == "__main__":
    main()
