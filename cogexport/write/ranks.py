"""The processes of one ``torchrun`` job writing one output together, and the few things they must agree on.

Launched as ``torchrun --nproc-per-node N [--nnodes M ...] -m cogexport ...``, every process (rank) runs the same
command: it opens the same input and makes the same plan from its headers. Then the ranks agree, through
torch.distributed (gloo: CPU and TCP, whatever the cluster's GPUs), that their plans are the same (rank 0's digest
against each one's); each writes its share of the data files (file i: rank i mod the world size; with fewer files
than ranks, a run of each file's tensors: rank_shares.py) into one staging folder; they agree that every rank
succeeded; and rank 0 writes the small files and moves the folder into place. A rank that fails, or dies, makes
every rank fail, and nothing is published.

A process not launched by torchrun (no WORLD_SIZE above 1 in its environment) is a job of one: every agreement is
its own answer. Only the command line joins a torchrun job: a library caller decides for itself (``join_job``).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator

from ..errors import CogExportError

# A rank waits for the others while they write their files: hours for a large model on a slow file system.
_WAIT = timedelta(hours=12)


class Ranks:
    """This process's place in its job (``rank`` of ``world``), and the job's collectives (a job of one by
    default, where they are local)."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        values: list[Any] = [None] * self.world
        self._collective(lambda: dist.all_gather_object(values, value))
        return values

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value if self.leader else None]
        self._collective(lambda: dist.broadcast_object_list(box, src=0))
        return box[0]

    def agree(self, failure: str | None, own_error: BaseException | None = None) -> None:
        """Every rank says whether its part went well (``failure``: None, or what went wrong); if any did not,
        every rank raises (this rank its ``own_error`` if it has one, the others one line naming the rank)."""
        failures = [(rank, message) for rank, message in enumerate(self.gather(failure)) if message]
        if not failures:
            return
        if own_error is not None:
            raise own_error
        rank, message = failures[0]
        raise CogExportError(f"rank {rank} of {self.world} failed ({message}); nothing was published")

    def together(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` on every rank; if it fails on any, it fails on all."""
        try:
            result = step()
        except Exception as error:
            self.agree(describe(error), error)
            raise
        self.agree(None)
        return result

    def from_leader(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` on rank 0 only; its result on every rank, or its failure raised on every rank."""
        result = failure = own_error = None
        if self.leader:
            try:
                result = step()
            except Exception as error:
                failure, own_error = describe(error), error
        result, failure = self.broadcast((result, failure))
        if failure is not None:
            if own_error is not None:
                raise own_error
            raise CogExportError(f"rank 0 of {self.world} failed ({failure}); nothing was published")
        return result

    def _collective(self, call: Callable[[], None]) -> None:
        try:
            call()
        except RuntimeError as error:  # gloo: a peer closed its connections (it failed or was killed), or timed out
            raise CogExportError(f"rank {self.rank} of {self.world}: another process of the job stopped before it "
                                 f"finished ({_gloo_reason(error)}); nothing was published") from None


def _gloo_reason(error: RuntimeError) -> str:
    """gloo's first sentence, without its source position: "[.../pair.cc:537] Read error [...]: Connection reset by
    peer. This is typically..." -> "Read error [...]: Connection reset by peer"."""
    text = str(error).splitlines()[0] if str(error) else "no reason given"
    text = text.split("] ", 1)[1] if text.startswith("[") and "] " in text else text
    return text.split(". ", 1)[0][:160]


def describe(error: BaseException) -> str:
    """An error in one line, for the other ranks' messages."""
    text = str(error).splitlines()[0] if str(error) else ""
    return text if isinstance(error, CogExportError) else f"{type(error).__name__}: {text}"


ALONE = Ranks()
_current = ALONE


def current_ranks() -> Ranks:
    """The job this process writes in (``ALONE`` unless inside ``join_job``)."""
    return _current


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


@contextmanager
def join_job() -> Iterator[Ranks]:
    """Join the torchrun job this process was launched in (gloo over the launcher's rendezvous), for the writes made
    inside; a process launched alone stays alone."""
    global _current
    if not launched_by_torchrun():
        yield ALONE
        return
    import torch.distributed as dist

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", timeout=_WAIT)
    _current = Ranks(dist.get_rank(), dist.get_world_size())
    try:
        yield _current
    finally:
        _current = ALONE
        if started:
            dist.destroy_process_group()
