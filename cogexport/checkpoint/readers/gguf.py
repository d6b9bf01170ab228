"""The GGUF reader: a quantized transformer in one file (cogexport's --to gguf output, a ComfyUI-GGUF file). Reading
is gguf_file.py's, imported when a file is opened: the ``gguf`` package is left to the jobs that read one."""

from __future__ import annotations

from pathlib import Path

from ..base import HeaderFacts, LazyCheckpoint
from .reader import Claim, FolderScan, OpenOptions, Reader


def _open(path: Path, options: OpenOptions | None = None) -> LazyCheckpoint:
    from ..gguf_file import GgufCheckpoint

    return GgufCheckpoint(path)


def gguf_claims(scan: FolderScan) -> list[Claim]:
    covered = scan.covered()
    return [Claim(GGUF, file, lambda options, file=file: _open(file), covers={file})
            for file in scan.files(".gguf") if file not in covered]


def describe(facts: HeaderFacts) -> str:
    return f"GGUF, architecture {facts.metadata.get('general.architecture', '?')}"


GGUF = Reader(
    name="GGUF", format="gguf", what="a GGUF file", looks_for="a GGUF file (*.gguf)",
    claims=gguf_claims, describe=describe, facts=HeaderFacts,
    reads_file=lambda path: path.suffix == ".gguf", open_file=_open,
    data_check="the header's offsets and types only: GGUF keeps no checksum, so a changed value that is still finite "
               "cannot be told from the saved one")
