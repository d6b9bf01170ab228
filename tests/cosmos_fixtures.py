"""Cosmos inputs for tests: a tiny imaginaire run (scripts/train_tiny_cosmos_imaginaire.py: 2 gloo ranks under FSDP2,
two iterations of imaginaire's four DCP folders, the model state dict gathered in training beside it), made once and
cached."""

from __future__ import annotations

from pathlib import Path

import torch
from fixtures import SCRIPTS, cached_fixture
from safetensors.torch import load_file

RUN_SCRIPTS = ("train_tiny_cosmos_imaginaire.py", "make_tiny_cosmos.py", "tiny_training.py", "tiny_models.py",
               "deepspeed_cpu.py", "make_deepspeed_checkpoint.py")


def imaginaire_run() -> Path:
    """OUT with run/checkpoints/ (iter_000000001, iter_000000002, latest_checkpoint.txt), truth/ and base/."""
    return cached_fixture("cosmos-imaginaire", RUN_SCRIPTS, [str(SCRIPTS / "train_tiny_cosmos_imaginaire.py")])


def truth(iteration: int, weight_set: str) -> dict[str, torch.Tensor]:
    """The ``weight_set`` (net or net_ema) of the model gathered in training at ``iteration``, under net. as
    convert_distcp_to_pt.py names either."""
    gathered = load_file(imaginaire_run() / "truth" / f"iter_{iteration:09}.safetensors")
    prefix = weight_set + "."
    return {"net." + name[len(prefix):]: t for name, t in gathered.items() if name.startswith(prefix)}
