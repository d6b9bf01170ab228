"""Read NVIDIA imaginaire's training runs (the trainer of cosmos-predict2 / 2.5): the checkpoints folder
(``latest_checkpoint.txt`` naming the newest ``iter_NNNNNNNNN``), one iteration, or its ``model/`` folder.

Each iteration holds four plain DCP saves, each in a folder of its own::

    iter_000000200/model/       the model's state dict, flat: net.* (the trained weights) and net_ema.* (their EMA)
    iter_000000200/optim/       the optimizer's (flattened: state.net.<name>.exp_avg, param_groups.net.<name>.lr)
    iter_000000200/scheduler/   the LR scheduler's
    iter_000000200/trainer/     {"grad_scaler": ..., "iteration": N}

Only ``model/`` holds weights: the other three are training state (their names are training_state.py's), never
read as weights, and refused by name when pointed at. ``model/`` keeps both sets of weights: ``net`` is read unless
``--ema`` asks for the EMA (weight_sets.py), with a note naming the set left unread. Tensors are read through the DCP reader's code
(dcp.py), with every check it makes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CogExportError, RoleError
from .base import CheckpointInfo, LazyCheckpoint, ReaderFacts
from .dcp import DcpCheckpoint, dtype_name
from .dcp_locate import DcpLocation, is_dcp_save
from .training_state import is_training_state_group
from .weight_sets import choose_set

LATEST_FILE = "latest_checkpoint.txt"
ITERATION = re.compile(r"^iter_(\d{9})$")
MODEL_FOLDER = "model"
_DTYPE_NOTE = "the saved model weights are"  # the DCP reader's note on the dtype, begun so


@dataclass
class ImaginaireFacts(ReaderFacts):
    """What an imaginaire iteration says of itself: its folders, the iterations of its run and the one
    latest_checkpoint.txt names, the set of weights read, the number of ranks that saved it."""

    world_size: int | None = None
    contents: list[str] = field(default_factory=list)
    latest: str | None = None
    weight_set: str | None = None


def is_iteration(folder: Path) -> bool:
    return bool(ITERATION.match(folder.name)) and is_dcp_save(folder / MODEL_FOLDER)


def iterations(folder: Path) -> list[Path]:
    """The run's iteration folders, oldest first."""
    try:
        return sorted((p for p in folder.iterdir() if p.is_dir() and is_iteration(p)), key=lambda p: p.name)
    except OSError:
        return []


def is_checkpoints_folder(folder: Path) -> bool:
    return (folder / LATEST_FILE).is_file() or bool(iterations(folder))


def iteration_to_read(folder: Path, tag: str | None) -> tuple[Path, list[str]]:
    """The iteration of the checkpoints folder to read: ``--tag`` (iter_NNNNNNNNN, or its number), else the one
    latest_checkpoint.txt names, else the newest; and what a note should say of the choice."""
    found = iterations(folder)
    names = [p.name for p in found]
    if tag is not None:
        wanted = tag if ITERATION.match(tag) else f"iter_{int(tag):09}" if tag.isdigit() else tag
        if wanted not in names:
            raise CogExportError(f"{folder} has no iteration {tag} (it has {', '.join(names) or 'none'}); name one "
                                 "with --tag iter_NNNNNNNNN")
        return folder / wanted, []
    latest = (folder / LATEST_FILE).read_text().strip() if (folder / LATEST_FILE).is_file() else None
    if latest is not None:
        if latest not in names:
            raise CogExportError(f"{folder / LATEST_FILE} names {latest}, which {folder} does not hold (it has "
                                 f"{', '.join(names) or 'no iteration'}); name one with --tag iter_NNNNNNNNN")
        return folder / latest, [f"read {latest}, the iteration {LATEST_FILE} names (of {', '.join(names)})"]
    if not found:
        raise CogExportError(f"{folder} holds no imaginaire iteration (iter_NNNNNNNNN/model/)")
    return found[-1], [f"read {found[-1].name}, the newest iteration ({folder} has no {LATEST_FILE})"]


class ImaginaireCheckpoint(LazyCheckpoint):
    """One iteration's model weights: ``entry`` (``net``, ``ema`` or ``net_ema``) picks the set, under ``net.``."""

    def __init__(self, iteration: Path, entry: str | None, notes: list[str] | None = None) -> None:
        super().__init__()
        self.facts = ImaginaireFacts(contents=sorted(p.name for p in iteration.iterdir() if p.is_dir()))
        run = iteration.parent
        self.facts.latest = (run / LATEST_FILE).read_text().strip() if (run / LATEST_FILE).is_file() else None
        number = int(ITERATION.match(iteration.name).group(1))
        tags = [p.name for p in iterations(run)] or [iteration.name]
        self._dcp = DcpCheckpoint(DcpLocation(iteration / MODEL_FOLDER, None, iteration, number, tags))
        try:
            self._tensors, self.facts.weight_set, set_note = choose_set(self._dcp, entry, str(iteration / MODEL_FOLDER))
        except CogExportError as error:
            self._dcp.close()
            raise RoleError(str(error)) from None
        if self.facts.weight_set is None:  # a run trained without an EMA keeps net.* alone
            if entry not in (None, "net"):
                self._dcp.close()
                raise RoleError(f"{iteration / MODEL_FOLDER} holds no {entry!r} weights (no net_ema.*: the run kept "
                                "no EMA); export its net without --ema / --role")
            self.facts.weight_set = "net"
        self.facts.world_size = self._dcp.facts.world_size
        self.info = CheckpointInfo(format="imaginaire", paths=[str(iteration)], facts=self.facts,
                                   tag=iteration.name, tags=tags, step=number, files=self._dcp.info.files,
                                   notes=[*(notes or []), *([set_note] if set_note else []), *self._set_notes()])
        self.info.weights_source = f"the {self.facts.weight_set}.* set of {MODEL_FOLDER}/ (DCP shards)"
        self.info.trainable = list(self._tensors)

    def _set_notes(self) -> list[str]:
        """The DCP reader's notes but its word on the dtype, which is each set's own (net in bf16, net_ema in fp32)."""
        notes = [note for note in self._dcp.info.notes if not note.startswith(_DTYPE_NOTE)]
        low = sorted({dtype_name(t.dtype) for t in self._tensors.values() if t.dtype.is_floating_point} - {"fp32"})
        if low:
            notes.append(f"{_DTYPE_NOTE} {'/'.join(low)}, not fp32 (the run kept its {self.facts.weight_set} in "
                         f"{'/'.join(low)}); the export is exact to the {'/'.join(low)} values, no finer")
        return notes

    def bytes_read(self) -> dict[str, int]:
        return self._dcp.bytes_read()

    def own_folders(self) -> list[Path]:
        return self._dcp.own_folders()

    def check_stored_data(self) -> list[str]:
        return self._dcp.check_stored_data()

    def close(self) -> None:
        self._dcp.close()


def refuse_training_state_folder(folder: Path) -> LazyCheckpoint:
    """An iteration's optim/, scheduler/ or trainer/, pointed at: one line, never weights (whatever set is asked
    for: --ema passes a RoleError's reason on as it is)."""
    raise RoleError(f"{folder} is the {folder.name} state of imaginaire's {folder.parent.name}, never model "
                         f"weights; point at {folder.parent} (or its {MODEL_FOLDER}/)")


def is_state_folder(folder: Path) -> bool:
    """An iteration's folder other than model/: training state by its name (training_state.py's rule)."""
    return bool(ITERATION.match(folder.parent.name)) and is_training_state_group(folder.name) \
        and is_dcp_save(folder)
