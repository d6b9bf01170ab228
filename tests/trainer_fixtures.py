"""Hugging Face Trainer runs for tests: a tiny CogVideoX transformer trained by ``transformers.Trainer`` under real
DeepSpeed on CPU ranks (scripts/make_trainer_checkpoint.py), the run folder it leaves and the ground truth of each
save, made once and cached like the other DeepSpeed fixtures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from cogvideox_fixtures import tiny_pipeline
from fixtures import SCRIPTS, DeepSpeedFixture, GroundTruth, cached_fixture

STEPS = 2  # the Trainer saves after each: run/checkpoint-1 and run/checkpoint-2


@dataclass(frozen=True)
class TrainerRun:
    """One kind of Trainer run: the ZeRO stage, the 16-bit gather at save (ZeRO-3), and who writes the copy of the
    weights beside DeepSpeed's save (``trainer``: the Trainer's model.safetensors; ``diffusers``: save_pretrained's
    diffusion_pytorch_model.safetensors and config.json)."""

    stage: int
    gather: bool = True
    copy: str = "trainer"
    persistence_threshold: int = 0

    @property
    def id(self) -> str:
        return f"trainer-zero{self.stage}" + ("" if self.gather else "-nogather") + \
            (f"-{self.copy}" if self.copy != "trainer" else "") + \
            (f"-persist{self.persistence_threshold}" if self.persistence_threshold else "")


ZERO2 = TrainerRun(2)
ZERO3 = TrainerRun(3)
ZERO3_NO_GATHER = TrainerRun(3, gather=False)
# save_pretrained under ZeRO-3: DeepSpeed keeps tensors of up to 100 elements whole, the rest are placeholders
ZERO3_DIFFUSERS_PLACEHOLDERS = TrainerRun(3, gather=False, copy="diffusers", persistence_threshold=100)
RUNS = (ZERO2, ZERO3, ZERO3_NO_GATHER, ZERO3_DIFFUSERS_PLACEHOLDERS)


class TrainerFixture(DeepSpeedFixture):
    """The run folder (``run``), its last step (``checkpoint``), the base pipeline, and each save's ground truth."""

    def __init__(self, root: Path, base: Path) -> None:
        super().__init__(root, base, f"run/checkpoint-{STEPS}")
        self.run = root / "run"

    def step(self, number: int) -> Path:
        return self.run / f"checkpoint-{number}"

    def masters(self, step: int = STEPS) -> dict[str, torch.Tensor]:
        """Every tensor as consolidating that step must give it: the fp32 masters (every parameter trains)."""
        truth = self if step == STEPS else GroundTruth(self.root, f"truth-step{step}")
        return {name: truth.tensors[name] for name in truth.truth["order"]}


def trainer_checkpoint(run: TrainerRun) -> TrainerFixture:
    base = tiny_pipeline("t2v")
    scripts = ("make_trainer_checkpoint.py", "finetune_tiny_cogvideox.py", "make_tiny_cogvideox.py",
               "cogvideox_tiny_configs.py", "tiny_models.py", "deepspeed_cpu.py", "make_deepspeed_checkpoint.py",
               "tiny_training.py")
    command = [str(SCRIPTS / "make_trainer_checkpoint.py"), str(base), "--stage", str(run.stage),
               "--gather" if run.gather else "--no-gather", "--copy", run.copy, "--persistence-threshold",
               str(run.persistence_threshold), "--steps", str(STEPS), "--world-size", "2", "--dtype", "bf16"]
    return TrainerFixture(cached_fixture(run.id, scripts, command), base)
