"""The imaginaire reader (NVIDIA's trainer of Cosmos Predict 2 / 2.5): the checkpoints folder of a run
(``latest_checkpoint.txt`` beside ``iter_NNNNNNNNN/``), one iteration, or its ``model/`` folder, where it supersedes
the DCP reader; an iteration's ``optim/``, ``scheduler/`` and ``trainer/`` are claimed too, to be refused as training
state. ``--tag`` names the iteration; ``--role net`` / ``--ema`` the set of weights. Reading is imaginaire.py's."""

from __future__ import annotations


from ..imaginaire import (LATEST_FILE, MODEL_FOLDER, ImaginaireCheckpoint, ImaginaireFacts, is_checkpoints_folder,
                          is_iteration, is_state_folder, iteration_to_read, iterations, refuse_training_state_folder)
from .dcp import DCP
from .reader import Claim, FolderScan, Reader


def imaginaire_claims(scan: FolderScan) -> list[Claim]:
    folder = scan.folder
    whole = set(scan.entries)
    if is_iteration(folder):
        return [Claim(IMAGINAIRE, folder, lambda options: ImaginaireCheckpoint(folder, options.entry),
                      whole_folder=True, covers=whole)]
    if folder.name == MODEL_FOLDER and is_iteration(folder.parent):
        iteration = folder.parent
        return [Claim(IMAGINAIRE, folder, lambda options: ImaginaireCheckpoint(iteration, options.entry),
                      whole_folder=True, covers=whole, detail=f"the model of imaginaire's {iteration.name}")]
    if is_state_folder(folder):
        return [Claim(IMAGINAIRE, folder, lambda options: refuse_training_state_folder(folder), whole_folder=True,
                      covers=whole, detail="training state")]
    if is_checkpoints_folder(folder):
        # --tag iter_NNNNNNNNN names an iteration from the run folder above too
        return [Claim(IMAGINAIRE, folder, lambda options: _open_run(folder, options), whole_folder=True,
                      covers=whole, also_named=tuple(p.name for p in iterations(folder)))]
    return []


def _open_run(folder, options) -> ImaginaireCheckpoint:
    iteration, notes = iteration_to_read(folder, options.tag)
    return ImaginaireCheckpoint(iteration, options.entry, notes)


def describe(facts: ImaginaireFacts) -> str:
    weights = f", read: {facts.weight_set}.*" if facts.weight_set else ""
    return (f"imaginaire training iteration (NVIDIA's trainer; DCP saves {', '.join(facts.contents)}, world size "
            f"{facts.world_size or '?'}{weights})")


IMAGINAIRE = Reader(
    name="imaginaire", format="imaginaire", what="the imaginaire checkpoint",
    looks_for=f"an imaginaire run's checkpoints folder ({LATEST_FILE} beside iter_NNNNNNNNN/) or one iteration",
    claims=imaginaire_claims, describe=describe, facts=ImaginaireFacts, whole_folders=True, supersedes=("DCP",),
    own_tags=True, takes_entry=True,
    data_check=DCP.data_check)  # its model/ is a DCP save, read by the DCP reader's code

