"""FastVideo runs for tests: made by scripts/make_fastvideo_checkpoint.py on CPU gloo ranks (FSDP2, AdamW, saved as
FastVideo's CheckpointManager saves), cached like the other training fixtures, with every role's weights taken inside
training; and small FastVideo-layout saves made in the test's own process (one rank, plain dcp.save), for the shapes
of a save no real run makes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from fixtures import SCRIPTS, GroundTruth, cached_fixture

SCRIPTS_USED = ("make_fastvideo_checkpoint.py", "tiny_training.py", "wan_tiny_configs.py", "tiny_models.py",
                "deepspeed_cpu.py", "make_deepspeed_checkpoint.py")


class FastVideoFixture(GroundTruth):
    """OUT/run (a DMD2 run: student, critic, an ema role, the EMA callback), OUT/finetune (the student and the EMA
    callback alone) and the truth: each role's full fp32 weights in Diffusers names."""

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def finetune(self) -> Path:
        return self.root / "finetune"

    @property
    def names(self) -> dict[str, str]:
        """Diffusers name -> FastVideo name, in the state dict's order (written by the fixture's own mapping)."""
        return self.truth["names"]

    def diffusers_weights(self, role: str) -> dict[str, torch.Tensor]:
        """``role``'s weights (student, critic, ema, callback_ema) in Diffusers names."""
        return {name: self.tensors[f"{role}.{name}"] for name in self.names}

    def fastvideo_weights(self, role: str) -> dict[str, torch.Tensor]:
        return {fastvideo: self.tensors[f"{role}.{name}"] for name, fastvideo in self.names.items()}

    def base(self, folder: Path) -> Path:
        """A --base folder with the trained transformer's config."""
        from diffusers import WanTransformer3DModel

        if not (folder / "config.json").is_file():
            WanTransformer3DModel.from_config(self.truth["config"]).save_config(folder)
        return folder


def fastvideo_run(world_size: int = 2) -> FastVideoFixture:
    command = [str(SCRIPTS / "make_fastvideo_checkpoint.py"), "--world-size", str(world_size)]
    return FastVideoFixture(cached_fixture(f"fastvideo-ws{world_size}", SCRIPTS_USED, command))


def save_in_one_process(state: dict, folder: Path) -> None:
    """torch's dcp.save of ``state`` by this process alone (no process group: it says so in a warning)."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)


def write_fastvideo_step(folder: Path, state: dict, step: int = 2, config: dict | None = None) -> Path:
    """``folder/checkpoint-{step}`` as CheckpointManager lays it out, ``state`` saved by one process's dcp.save."""
    step_folder = folder / f"checkpoint-{step}"
    (step_folder / "dcp").mkdir(parents=True)
    (step_folder / "metadata.json").write_text(json.dumps({"step": step, "config": config or {}}))
    save_in_one_process(state, step_folder / "dcp")
    return step_folder


def small_role(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"blocks.0.to_q.weight": torch.randn(4, 4, generator=generator),
            "blocks.0.to_q.bias": torch.randn(4, generator=generator)}


def optimizer_of(role: dict[str, torch.Tensor]) -> dict:
    """torch's flattened optimizer state dict of a container whose child ``transformer`` holds ``role``."""
    state = {}
    for name, tensor in role.items():
        state[f"state.transformer.{name}.exp_avg"] = torch.zeros_like(tensor)
        state[f"state.transformer.{name}.step"] = torch.tensor(2.0)
        state[f"param_groups.transformer.{name}.lr"] = 0.01
    return state
