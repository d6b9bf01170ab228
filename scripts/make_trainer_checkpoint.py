"""Train a tiny CogVideoX transformer with the Hugging Face ``transformers.Trainer`` under real DeepSpeed on CPU, and
leave the run folder the Trainer leaves, with the ground truth of every save taken inside the training process.

    python scripts/make_trainer_checkpoint.py BASE OUT --stage 3 --no-gather --world-size 2 --steps 2

BASE is a pipeline folder from make_tiny_cogvideox.py; only BASE/transformer and BASE/scheduler are read. The
Trainer gets the Diffusers transformer itself as its model (so the saved names are the Diffusers names) and a
``compute_loss`` of its own: finetune_tiny_cogvideox.py's v-prediction loss on made-up data seeded by the sample's
index. DeepSpeed gets its config through ``TrainingArguments(deepspeed=...)``, as a Trainer run passes its
ds_config.json; ``use_cpu=True`` is what lets the Trainer take bf16 on a machine without a GPU, and DeepSpeed still
drives the training (its CPU accelerator, gloo). The Trainer saves after every step; on disk, as transformers 5.24
and DeepSpeed 0.19 leave it:

    OUT/run/checkpoint-K/global_stepK/    DeepSpeed's tag folder (ZeRO-2 or ZeRO-3 rank files)
    OUT/run/checkpoint-K/latest           "global_stepK"; zero_to_fp32.py, zero_to_torch.py beside it
    OUT/run/checkpoint-K/model.safetensors
        the Trainer's copy of the weights in the training dtype (ZeRO-2; ZeRO-3 with
        stage3_gather_16bit_weights_on_model_save). ZeRO-3 without the gather: none (the Trainer writes an empty
        dummy file and deletes it). No config.json: the model is not a transformers PreTrainedModel.
    OUT/run/checkpoint-K/trainer_state.json, training_args.bin, rng_state_R.pth (one per rank); no scheduler.pt
    OUT/truth.safetensors, OUT/truth.json            the last save's ground truth: every trainable parameter's fp32
    OUT/truth-step1.safetensors, OUT/truth-step1.json  master, from the live engine right after each save

``--copy diffusers`` runs a Trainer subclass whose ``_save`` calls the transformer's ``save_pretrained`` instead, as
Diffusers-based trainers do: ``diffusion_pytorch_model.safetensors`` and ``config.json``, the module's own tensors,
which under ZeRO-3 are DeepSpeed's empty placeholders (shape [0]) for every parameter it partitioned (all of them
with ``--persistence-threshold 0``, the ones above that many elements otherwise: DeepSpeed keeps smaller ones whole).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import deepspeed_config, import_deepspeed  # noqa: E402
from finetune_tiny_cogvideox import diffusion_loss  # noqa: E402
from make_deepspeed_checkpoint import collect_truth  # noqa: E402
from tiny_training import TRAIN_DTYPES, launch, pick  # noqa: E402

RUN_DIR = "run"  # the Trainer's output_dir, under OUT


class SampleIndices(torch.utils.data.Dataset):
    """Each sample is its index: the loss makes its data from it (seeded), so every rank and step sees other data."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict:
        return {"index": torch.tensor(index)}


def trainer_config(spec: dict) -> dict:
    """The DeepSpeed config a Trainer run passes (its own numbers where a ds_config.json would say "auto")."""
    config = deepspeed_config(spec["stage"], spec["dtype"], lr=spec["lr"])
    config["gradient_clipping"] = 1.0
    if spec["stage"] == 3:
        zero = config["zero_optimization"]
        zero["stage3_param_persistence_threshold"] = spec["persistence_threshold"]
        zero["stage3_gather_16bit_weights_on_model_save"] = spec["gather"]
    return config


def truth_callback(deepspeed, spec: dict, rank: int):
    """A TrainerCallback writing the ground truth right after each save (on every rank: a collective at stage 3)."""
    from transformers import TrainerCallback

    class TruthAfterSave(TrainerCallback):
        trainer = None

        def on_save(self, args, state, control, **kwargs):
            truth = collect_truth(deepspeed, self.trainer.model_wrapped, spec["stage"])
            if rank == 0:
                last = state.global_step == spec["steps"]
                write_truth_files(truth, spec, state.global_step, "truth" if last else f"truth-step{state.global_step}")
            deepspeed.comm.barrier()

    return TruthAfterSave()


def trainer_class(scheduler, dtype: torch.dtype, rank: int, copy: str):
    """A Trainer computing the diffusion loss (and, for ``copy="diffusers"``, saving through save_pretrained)."""
    from transformers import Trainer

    class DiffusionTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            index = int(inputs["index"][0])
            return diffusion_loss(model, self.model.config, scheduler, index, rank, dtype)

        def _save(self, output_dir=None, state_dict=None):
            if copy == "trainer":
                return super()._save(output_dir, state_dict)
            if self.args.should_save:  # the module's own tensors: under ZeRO-3, its empty placeholders
                self.model.save_pretrained(output_dir)
                torch.save(self.args, Path(output_dir) / "training_args.bin")

    return DiffusionTrainer


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    deepspeed = import_deepspeed()
    from diffusers import CogVideoXDDIMScheduler, CogVideoXTransformer3DModel
    from transformers import TrainingArguments

    base, dtype = Path(spec["base"]), TRAIN_DTYPES[spec["dtype"]]
    transformer = CogVideoXTransformer3DModel.from_pretrained(base / "transformer").requires_grad_(True).train()
    scheduler = CogVideoXDDIMScheduler.from_pretrained(base / "scheduler")
    args = TrainingArguments(
        output_dir=str(Path(spec["out"]) / RUN_DIR), max_steps=spec["steps"], save_steps=1,
        per_device_train_batch_size=1, learning_rate=spec["lr"], lr_scheduler_type="constant",
        bf16=spec["dtype"] == "bf16", use_cpu=True, deepspeed=trainer_config(spec), ddp_backend="gloo",
        report_to=[], logging_steps=1, dataloader_num_workers=0, remove_unused_columns=False, seed=0)
    callback = truth_callback(deepspeed, spec, rank)
    trainer = trainer_class(scheduler, dtype, rank, spec["copy"])(model=transformer, args=args,
                                                                   train_dataset=SampleIndices(), callbacks=[callback])
    callback.trainer = trainer
    trainer.train()


def write_truth_files(truth: dict, spec: dict, step: int, name: str) -> None:
    from safetensors.torch import save_file

    out = Path(spec["out"])
    save_file({key: tensor.contiguous() for key, tensor in truth.pop("tensors").items()}, out / f"{name}.safetensors")
    settings = {**pick(spec, "base", "stage", "gather", "persistence_threshold", "dtype", "world_size", "steps", "lr",
                       "copy"), "checkpoint": f"{RUN_DIR}/checkpoint-{step}", "driver": "transformers.Trainer"}
    (out / f"{name}.json").write_text(json.dumps({**truth, "settings": settings}, indent=1))


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--stage", type=click.Choice(["2", "3"]), default="2", show_default=True)
@click.option("--gather/--no-gather", default=True, show_default=True,
              help="ZeRO-3: stage3_gather_16bit_weights_on_model_save (the Trainer's model.safetensors).")
@click.option("--persistence-threshold", type=click.IntRange(0), default=0, show_default=True,
              help="ZeRO-3: stage3_param_persistence_threshold (0: every parameter partitioned).")
@click.option("--copy", type=click.Choice(["trainer", "diffusers"]), default="trainer", show_default=True,
              help="The Trainer's own _save, or save_pretrained of the transformer (a Diffusers-based trainer).")
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(TRAIN_DTYPES)), default="bf16", show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
def main(base: Path, out: Path, stage: str, **options) -> None:
    """Train BASE's CogVideoX transformer with transformers.Trainer under DeepSpeed on CPU ranks."""
    launch(train_and_save, out, base, stage=int(stage), **options)
    click.echo(f"wrote {Path(out) / RUN_DIR} and {Path(out) / 'truth.safetensors'}", err=True)


if __name__ == "__main__":
    main()
