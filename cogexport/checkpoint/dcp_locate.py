"""Find the DCP save a user means: a save folder itself, accelerate's ``checkpoint-N/`` holding
``pytorch_model_fsdp_0/``, or a run folder of step folders (``checkpoint-N``, torchtitan's ``step-N`` under its
checkpoint folder, finetrainers' ``finetrainers_step_N``), where the newest step is taken unless ``--tag`` names one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CogExportError
from .dcp_metadata import METADATA_FILE
from .locate import natural_sorted

ACCELERATE_MODEL = re.compile(r"^pytorch_model_fsdp_(\d+)$")
STEP_NUMBER = re.compile(r"^(?:checkpoint[-_]|step-|finetrainers_step_|global_step)(\d+)$")


@dataclass
class DcpLocation:
    """The model save to read, the optimizer save beside it (accelerate keeps it in its own folder), and the step."""

    model: Path
    optimizer: Path | None
    step_dir: Path  # the folder that is one step of the run (the save itself, or accelerate's checkpoint-N)
    step: int | None
    steps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def is_dcp_save(folder: Path) -> bool:
    return (folder / METADATA_FILE).is_file()


def accelerate_models(folder: Path) -> list[Path]:
    """accelerate's per-model DCP folders inside one checkpoint-N (one per prepared model)."""
    try:
        return sorted((p for p in folder.iterdir() if ACCELERATE_MODEL.match(p.name) and is_dcp_save(p)),
                      key=lambda p: int(ACCELERATE_MODEL.match(p.name).group(1)))
    except OSError:
        return []


def is_dcp_step(folder: Path) -> bool:
    return folder.is_dir() and (is_dcp_save(folder) or bool(accelerate_models(folder)))


def dcp_steps(folder: Path, depth: int = 3) -> list[Path]:
    """Step folders up to ``depth`` levels below a folder (torchtitan keeps its steps in ``checkpoint/`` below the dump
    folder; a folder of runs holds each run's steps one level further down); a step's own subfolders are not searched."""
    steps, level = [], [folder]
    for _ in range(depth):
        children = [child for parent in level for child in _subfolders(parent)]
        steps += [child for child in children if is_dcp_step(child)]
        level = [child for child in children if not is_dcp_step(child)]
    return steps


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir()]
    except OSError:
        return []


def step_number(folder: Path) -> int | None:
    found = STEP_NUMBER.match(folder.name)
    return int(found.group(1)) if found else None


def locate_dcp(path: Path, tag: str | None = None) -> DcpLocation | None:
    """The DCP save ``path`` points at, or None when it holds none."""
    if not path.is_dir():
        return None
    if is_dcp_save(path):
        if tag is not None and tag != path.name:
            raise CogExportError(f"--tag {tag}: {path} is one DCP save already (step folder {path.name}); drop --tag "
                                 "or point at the run folder")
        if ACCELERATE_MODEL.match(path.name):
            return _accelerate_step(path.parent, path)
        return DcpLocation(path, path, path, step_number(path))
    if accelerate_models(path):
        if tag is not None and tag != path.name:
            raise CogExportError(f"--tag {tag}: {path} is one step already; drop --tag or point at the run folder")
        return _accelerate_step(path, None)
    steps = dcp_steps(path)
    if not steps:
        return None
    runs = sorted({step.parent for step in steps})
    if len(runs) > 1:
        listing = "; ".join(f"{run} ({', '.join(natural_sorted(s.name for s in steps if s.parent == run))})"
                            for run in runs)
        raise CogExportError(f"{path} holds the checkpoints of several runs: {listing}; point at one run's folder")
    names = natural_sorted(step.name for step in steps)
    if tag is not None:
        if tag not in names:
            raise CogExportError(f"--tag {tag} is not a step of {runs[0]} (steps there: {', '.join(names)})")
        chosen, note = tag, None
    else:
        chosen = names[-1]
        note = (f"took the newest step {chosen} of {runs[0]} (steps there: {', '.join(names)}); --tag picks another"
                if len(names) > 1 else None)
    location = locate_dcp(runs[0] / chosen)
    location.steps = names
    location.notes += [note] if note else []
    return location


def _accelerate_step(step_dir: Path, model: Path | None) -> DcpLocation:
    models = accelerate_models(step_dir)
    if model is None:
        if len(models) > 1:
            raise CogExportError(f"{step_dir} holds {len(models)} models saved by accelerate "
                                 f"({', '.join(m.name for m in models)}); point at the one to read")
        model = models[0]
    index = ACCELERATE_MODEL.match(model.name).group(1)
    optimizer = step_dir / f"optimizer_{index}"
    return DcpLocation(model, optimizer if is_dcp_save(optimizer) else None, step_dir, step_number(step_dir))
