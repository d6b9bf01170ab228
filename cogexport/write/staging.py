"""Write an output folder under a hidden name next to its destination, and move it into place only when done.

An interrupted or failed run leaves nothing under the final name (the hidden staging folder is removed on
any error, Ctrl-C included; in a torchrun job, by every rank, when any rank fails). An existing non-empty destination is refused unless overwriting was asked for,
and a destination that overlaps the input is always refused, so the input can never be touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..errors import CogExportError
from ..pending_checks import run_pending_checks
from ..sizes import human_bytes
from .ranks import ALONE, Ranks, describe


def check_destination(destination: Path, checkpoint_folders: Iterable[Path], inputs: Iterable[Path],
                      overwrite: bool) -> None:
    """Refuse a destination that is a file, is non-empty (without ``overwrite``) or overlaps the input.

    The destination may not be or lie inside ``checkpoint_folders`` (the folders holding the checkpoint's files)
    or any folder among the user's ``inputs``; no input may lie inside it (so --overwrite can never delete one).
    """
    destination = Path(destination)
    target = destination.resolve()
    inputs = [Path(p) for p in inputs]
    input_folders = [*checkpoint_folders, *(p for p in inputs if p.is_dir())]
    for folder in map(lambda p: Path(p).resolve(), input_folders):
        if target == folder or target.is_relative_to(folder):
            raise CogExportError(f"output {destination} is inside the input folder {folder}; write it elsewhere")
    for source in map(lambda p: Path(p).resolve(), [*input_folders, *inputs]):
        if source.is_relative_to(target):
            raise CogExportError(f"output {destination} contains the input {source}; choose another output folder")
    if destination.is_file():
        raise CogExportError(f"output {destination} is a file; give a folder path")
    blocking = next((p for p in destination.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise CogExportError(f"output {destination} cannot be created: {blocking} is a file; give a folder path")
    if destination.is_dir() and any(destination.iterdir()) and not overwrite:
        raise CogExportError(f"output {destination} exists and is not empty; pass --overwrite to replace it")


@contextmanager
def staged_folder(destination: Path, needed_bytes: int = 0, ranks: Ranks = ALONE,
                  finish: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Yield an empty folder to write into; on success it becomes ``destination`` (replacing it if present).

    ``needed_bytes`` (what the plan will write) must fit in the free space of the destination's disk: a disk that
    fills up mid-way would cost the whole run's time before failing. With ``ranks`` of a torchrun job, rank 0 makes
    the folder and every rank writes into it; once every rank has written its part and passed its pending checks,
    rank 0 calls ``finish(folder)`` (the small files) and moves it into place. Any rank failing fails them all, and
    each removes the folder."""
    destination = Path(destination)
    if destination.is_symlink():  # replace what the link points at, and keep the link
        destination = destination.resolve()
    created_parents = [p for p in reversed(destination.parents) if not p.exists()]
    made: list[Path] = []  # the staging folder once made (rank 0) or known (the others): removed on any failure
    try:
        staging = ranks.from_leader(lambda: _make_staging(destination, needed_bytes, created_parents, made))
        made.append(staging)
        ranks.together(lambda: _check_shared(staging, ranks))
        failure = own_error = None
        try:
            yield staging
            run_pending_checks()  # e.g. every input byte the output was made of passes its CRC-32 check first
        except Exception as error:
            failure, own_error = describe(error), error
        ranks.agree(failure, own_error)
        ranks.from_leader(lambda: _finish_and_move(staging, destination, finish))
    except BaseException:
        _remove_staging(made, created_parents)
        raise


def _remove_staging(made: list[Path], created_parents: list[Path]) -> None:
    """Remove what a failed run made. A kill signal meanwhile (torchrun stops every rank once one fails, often just
    as this rank's own error brings it here) must not stop the removal half-way: the signals are held while it runs,
    and one that came before they were held (its exit raised from the first lines here) makes it start again under
    the hold; the exit it asked for is then raised in place of the failure."""
    asked_to_exit: BaseException | None = None
    for _attempt in range(3):
        try:
            with _signals_held():
                for folder in dict.fromkeys(made):
                    shutil.rmtree(folder, ignore_errors=True)
                _remove_created(created_parents)
            break
        except (SystemExit, KeyboardInterrupt) as exit_asked:
            asked_to_exit = exit_asked
    if asked_to_exit is not None:
        raise asked_to_exit


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold back the signals that end a run (the command line turns SIGTERM and SIGHUP into an exit, Ctrl-C into
    KeyboardInterrupt) until the block is done, then deliver them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    numbers = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    previous = {number: signal.signal(number, lambda received, _frame: held.append(received)) for number in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in held[:1]:
            signal.raise_signal(number)


def _make_staging(destination: Path, needed_bytes: int, created_parents: list[Path], made: list[Path]) -> Path:
    check_free_space(destination, needed_bytes)
    staging = destination.parent / f".{destination.name}.cogexport-{uuid.uuid4().hex[:8]}.partial"
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as error:
        _remove_created(created_parents)
        raise CogExportError(f"cannot create output {destination}: {error.strerror} in {destination.parent}; choose "
                             "an output folder you can write to") from None
    made.append(staging)
    return staging


def _check_shared(staging: Path, ranks: Ranks) -> None:
    if not staging.is_dir():
        raise CogExportError(f"rank {ranks.rank} does not see the folder {staging} that rank 0 made: a torchrun job "
                             "writes its output on a file system every node shares; choose an output there")


def _finish_and_move(staging: Path, destination: Path, finish: Callable[[Path], None] | None) -> None:
    if finish is not None:
        finish(staging)
    _move_into_place(staging, destination)


def free_bytes(path: Path) -> int:
    """The space free to us on the disk that holds ``path`` (or would, once made)."""
    existing = next(p for p in [path, *path.parents] if p.exists())
    return shutil.disk_usage(existing).free


def check_free_space(destination: Path, needed_bytes: int) -> None:
    free = free_bytes(destination)
    if needed_bytes > free:
        raise CogExportError(f"output {destination} needs {human_bytes(needed_bytes)} but its disk has only "
                             f"{human_bytes(free)} free; free some space or write it to another disk")


def _remove_created(created_parents: list[Path]) -> None:
    """Remove the (empty) parent folders this run created for its output, deepest first."""
    for parent in reversed(created_parents):
        try:
            parent.rmdir()
        except OSError:
            break


def _move_into_place(staging: Path, destination: Path) -> None:
    if destination.is_dir() and any(destination.iterdir()):
        retired = destination.parent / f".{destination.name}.cogexport-{uuid.uuid4().hex[:8]}.old"
        os.rename(destination, retired)
        os.rename(staging, destination)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.rename(staging, destination)  # replaces an empty folder in one step
