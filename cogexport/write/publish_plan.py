"""Write a planned folder and publish it: the one way every command writes its output.

The ranks of the job (one process, or a torchrun job: ranks.py) check they made the same plan; the data files are
written into a staging folder, each by the rank whose share it is (with fewer files than ranks, runs of each file's
tensors: rank_shares.py), their tensors loaded ahead by worker threads (io_engine.py) or copied file to file where
their bytes lie in an input as they are (byte_copy.py); once every rank has written its part, rank 0 writes the
configs, indexes and cards and moves the folder into place (staging.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import CogExportError
from ..progress import byte_progress
from .folder_plan import FolderPlan, plan_digest, write_data_files
from .io_engine import IOSettings
from .rank_shares import rank_share
from .ranks import Ranks, current_ranks
from .staging import staged_folder
from .value_watch import ValueWatch


def write_plan(plan: FolderPlan, destination: Path, settings: IOSettings, label: str, progress: bool | None = None,
               ranks: Ranks | None = None, needed_bytes: int | None = None,
               check: Callable[[], None] | None = None, allow_nonfinite: bool = False) -> list[str]:
    """Write ``plan`` as the folder ``destination``. ``check`` (the destination's checks) runs on every rank first;
    ``needed_bytes``: what the free-space check asks for (default: the plan's bytes). A tensor holding NaN or
    infinite values fails the write before anything is published, unless ``allow_nonfinite``: then the tensors
    written with them are returned, every rank's (value_watch.py). Only rank 0 draws a progress bar (of its share):
    the ranks of a torchrun job share one terminal, where several bars would redraw over each other."""
    ranks = ranks or current_ranks()
    check_same_plan(plan, ranks)
    if check is not None:
        ranks.together(check)
    share = rank_share(plan.data_files, ranks.rank, ranks.world)
    needed = plan.total_bytes if needed_bytes is None else needed_bytes
    watch = ValueWatch(allow_nonfinite)
    with staged_folder(destination, needed, ranks, finish=lambda staging: _write_others(staging, plan)) as staging, \
            byte_progress(sum(planned.nbytes for planned in share), label, progress if ranks.leader else False) as bar:
        write_data_files(staging, share, lambda _name, nbytes: bar.update(nbytes), settings, watch)
    return [tensor for passed_on in ranks.gather(watch.passed_on) for tensor in passed_on]


def check_same_plan(plan: FolderPlan, ranks: Ranks) -> None:
    """Every rank must be about to write the same files: rank 0's plan is the one, and any other fails them all."""
    digests = ranks.gather(plan_digest(plan))
    differing = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
    if differing:
        raise CogExportError(f"the ranks of this job planned different outputs (rank {differing[0]}'s plan differs "
                             "from rank 0's); every rank must read the same checkpoint with the same options")


def _write_others(staging: Path, plan: FolderPlan) -> None:
    for planned in plan.other_files:
        planned.write(staging, None)
