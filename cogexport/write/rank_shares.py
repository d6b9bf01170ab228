"""Which data files of a plan, and which runs of their tensors, each rank of a torchrun job writes.

With at least as many data files as ranks, each file is written whole by one rank: file i by rank i mod the world
size (PyTorch's ``consolidate_safetensors_files_on_every_rank`` shares its files the same way). With fewer, a rank
would sit idle, and a single file (a GGUF or fp8 file, an original release's one safetensors file) would be written
by one rank alone: there every file whose layout is planned up front (file_parts.py) is cut into one run of tensors
per rank, of nearly equal bytes, and each rank loads (reads, casts, quantizes) and writes its run into the shared
file. Quantizing to GGUF is compute: the ranks share it as they share the writes. A file whose end depends on all
of its data (a torch.save archive's directory holds every record's CRC-32) stays whole, one rank's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..lazy import LazyTensor
from .file_parts import FileLayout, balanced_runs, write_run
from .io_engine import Payload


@dataclass
class FilePart:
    """The tensors ``run`` (in write order) of the file ``planned``, laid out as ``layout``: one rank's share of a
    file that other ranks write the rest of. Rank 0's share (``header``) writes the file's header."""

    planned: Any
    run: range
    layout: FileLayout
    header: bool

    @property
    def path(self) -> str:
        return self.planned.path

    @property
    def nbytes(self) -> int:
        return self.layout.run_bytes(self.run)

    @property
    def tensor_count(self) -> int:
        return len(self.run)

    def write_order(self) -> list[LazyTensor]:
        order = self.planned.write_order()
        return [order[index] for index in self.run]

    def write_names(self) -> list[str]:
        names = self.planned.write_names()
        return [names[index] for index in self.run]

    def write(self, root: Path, on_tensor: Callable[[str, int], None] | None, payloads: Iterator[Payload]) -> None:
        target = root / self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        write_run(target, self.layout, self.run, payloads, whole=False, header=self.header,
                  on_tensor=on_tensor)


def rank_share(files: list[Any], rank: int, world: int) -> list[Any]:
    """The data files (whole) and file parts (``FilePart``) that rank ``rank`` of ``world`` writes."""
    if len(files) >= world:
        return [planned for index, planned in enumerate(files) if index % world == rank]
    share = []
    for index, planned in enumerate(files):
        layout = planned.layout() if hasattr(planned, "layout") else None
        if layout is None:
            if index % world == rank:
                share.append(planned)
            continue
        run = balanced_runs(layout, world)[rank]
        if run or rank == 0:  # rank 0's share writes the header, even where it holds no tensor
            share.append(FilePart(planned, run, layout, header=rank == 0))
    return share
