"""The FastVideo reader: one step of a FastVideo training run (``checkpoint-N/`` holding ``dcp/`` beside FastVideo's
``metadata.json``), or its ``dcp/`` folder, where it supersedes the DCP reader; a run folder of steps is a run of
steps (the newest is read). ``--role`` / ``--ema`` choose the role. Reading is fastvideo.py's."""

from __future__ import annotations

import re

from ..fastvideo import DCP_FOLDER, METADATA_JSON, RNG_FILE, FastVideoCheckpoint, FastVideoFacts, is_fastvideo_step
from .dcp import DCP
from .reader import Claim, FolderScan, Reader


def fastvideo_claims(scan: FolderScan) -> list[Claim]:
    """The step folder whole (its dcp/, metadata.json and RNG files); the dcp/ folder of one, for a user pointing
    there (the claim on the same folder as DCP's, which gives way)."""
    folder = scan.folder
    if is_fastvideo_step(folder):
        covers = {p for p in scan.entries if p.name in (DCP_FOLDER, METADATA_JSON) or RNG_FILE.match(p.name)}
        return [Claim(FASTVIDEO, folder, lambda options: FastVideoCheckpoint(folder, options.entry, options.strict),
                      whole_folder=True, covers=covers)]
    if folder.name == DCP_FOLDER and is_fastvideo_step(folder.parent):
        step = folder.parent
        return [Claim(FASTVIDEO, folder, lambda options: FastVideoCheckpoint(step, options.entry, options.strict),
                      whole_folder=True, covers=set(scan.entries), detail=f"a step of FastVideo: {step.name}")]
    return []


def describe(facts: FastVideoFacts) -> str:
    roles = f", roles {', '.join(facts.roles)}" if facts.roles else ""
    method = f", method {facts.method.rsplit('.', 1)[-1]}" if facts.method else ""
    return f"FastVideo training step (DCP save, world size {facts.world_size or '?'}{roles}{method})"


FASTVIDEO = Reader(
    name="FastVideo", format="fastvideo", what="the FastVideo checkpoint",
    looks_for="a FastVideo step (checkpoint-N holding dcp/ and metadata.json) or a run folder of them",
    claims=fastvideo_claims, describe=describe, facts=FastVideoFacts, whole_folders=True, supersedes=("DCP",),
    not_weights=(re.compile(r"^rng_state_rank\d+\.pt$"),), takes_entry=True,
    data_check=DCP.data_check)  # its dcp/ is a DCP save, read by the DCP reader's code
