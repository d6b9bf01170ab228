"""Real checkpoints for tests, made once by the scripts in scripts/ and cached in tests/.fixtures.

The cache key covers the generating scripts and the torch/deepspeed versions, so a change to either makes
fresh fixtures. A file lock per fixture lets parallel test workers share them: the first one to ask makes
it, the others wait.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import version
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
# resolved: scripts/test.sh links tests/.fixtures to the user's cache, shared by clones, and a fixture may record
# paths (its base pipeline's), which must name the cache, not a clone that may be gone
CACHE = (ROOT / "tests" / ".fixtures").resolve()


def _cache_key(*scripts: str) -> str:
    digest = hashlib.sha256()
    for script in scripts:
        digest.update((SCRIPTS / script).read_bytes())
    for package in ("torch", "deepspeed", "diffusers", "transformers"):
        digest.update(version(package).encode())
    return digest.hexdigest()[:12]


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_rank_script(command: list[str], output: Path, env: dict) -> subprocess.CompletedProcess:
    """Run a script that trains or resumes on CPU gloo ranks, writing ``output``; once more, from an empty
    ``output``, if a rank was aborted. gloo now and then aborts a CPU rank as it shuts down ("terminate called
    without an active exception": about 1 run in 15 on a loaded 2-core machine); these scripts are not under test,
    and the second run remakes the checkpoint and its ground truth together."""
    for _ in range(2):
        shutil.rmtree(output, ignore_errors=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode == 0 or "terminated with signal SIGABRT" not in done.stderr:
            break
    return done


def cached_fixture(name: str, scripts: tuple[str, ...], command: list[str]) -> Path:
    """Run ``command`` (with OUT appended) once per cache key; return the finished folder."""
    folder = CACHE / _cache_key(*scripts) / name
    with locked(folder.with_name(name + ".lock")):
        if not (folder / ".complete").exists():
            partial = folder.with_name(name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(folder, ignore_errors=True)
            env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
            started = time.monotonic()
            done = run_rank_script([sys.executable, *command, str(partial)], partial, env)
            if done.returncode != 0:
                raise RuntimeError(f"making fixture {name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
            # what each fixture costs a cold CI run (scripts/fixture_costs.py sums them)
            (partial / ".seconds").write_text(f"{time.monotonic() - started:.1f}\n")
            (partial / ".complete").touch()
            os.rename(partial, folder)
    return folder


@dataclass(frozen=True)
class DeepSpeedVariant:
    """One kind of DeepSpeed checkpoint the reader must handle."""

    stage: int
    dtype: str
    world_size: int
    sub_group_size: int | None = None
    parameter_alignment: bool = False
    bf16_optimizer: bool = False
    model: str = "toy"
    steps: int = 2
    optimizer: str = "adam"

    @property
    def id(self) -> str:
        extra = ("-subgroups" if self.sub_group_size else "") + ("-aligned" if self.parameter_alignment else "") \
            + ("-bf16optimizer" if self.bf16_optimizer else "") + (f"-steps{self.steps}" if self.steps != 2 else "") \
            + (f"-{self.optimizer}" if self.optimizer != "adam" else "")
        return f"{self.model}-zero{self.stage}-{self.dtype}-ws{self.world_size}{extra}"

    def arguments(self) -> list[str]:
        args = [str(SCRIPTS / "make_deepspeed_checkpoint.py"), "--model", self.model, "--stage", str(self.stage),
                "--dtype", self.dtype, "--world-size", str(self.world_size), "--steps", str(self.steps),
                "--optimizer", self.optimizer]
        if self.sub_group_size:
            args += ["--sub-group-size", str(self.sub_group_size)]
        if self.parameter_alignment:
            args.append("--parameter-alignment")
        if self.bf16_optimizer:
            args.append("--bf16-optimizer")
        return args


class GroundTruth:
    """A fixture folder with NAME.json and NAME.safetensors, written inside the training process."""

    def __init__(self, root: Path, name: str = "truth") -> None:
        self.root, self.name = root, name

    @cached_property
    def truth(self) -> dict:
        return json.loads((self.root / f"{self.name}.json").read_text())

    @cached_property
    def tensors(self) -> dict[str, torch.Tensor]:
        return load_file(self.root / f"{self.name}.safetensors")


class DeepSpeedFixture(GroundTruth):
    """A cached real DeepSpeed checkpoint (the folder ``checkpoint`` names) and the ground truth taken inside its
    training process; a fine-tune's also knows the ``base`` pipeline folder it started from."""

    def __init__(self, root: Path, base: Path | None = None, checkpoint: str = "checkpoint") -> None:
        super().__init__(root)
        self.base, self.checkpoint = base, root / checkpoint

    def expected_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state_dict as a consolidation must give it, in its order (aliases = their source)."""
        tied = self.truth["tied"]
        return {name: self.tensors[tied.get(name, name)] for name in self.truth["order"]}


def deepspeed_checkpoint(variant: DeepSpeedVariant) -> DeepSpeedFixture:
    scripts = ("make_deepspeed_checkpoint.py", "deepspeed_cpu.py")
    return DeepSpeedFixture(cached_fixture(variant.id, scripts, variant.arguments()))


ALL_VARIANTS = [
    *(DeepSpeedVariant(stage, dtype, ws) for stage in (0, 1, 2, 3) for dtype in ("fp32", "bf16", "fp16")
      for ws in (1, 2, 3)),
    DeepSpeedVariant(3, "bf16", 2, sub_group_size=300),
    DeepSpeedVariant(2, "bf16", 3, parameter_alignment=True),
    DeepSpeedVariant(1, "bf16", 2, parameter_alignment=True),
    DeepSpeedVariant(1, "bf16", 2, bf16_optimizer=True),
    DeepSpeedVariant(1, "bf16", 3, bf16_optimizer=True),
    DeepSpeedVariant(2, "bf16", 11),  # ranks 10 and 11 sort after 9; parameters straddle several ranks
    # stage 0 names no masters: a frozen norm with the same bits as a trained one must not take its master
    DeepSpeedVariant(0, "bf16", 1, model="frozen-norm"),
    DeepSpeedVariant(0, "fp16", 2, model="frozen-norm"),
]
