"""The Megatron-Core reader: a run folder (``latest_checkpointed_iteration.txt`` beside ``iter_NNNNNNN/``), claimed
whole with its iterations as its own tags (``--tag iter_0000005``, or the tracker's iteration), or one iteration
folder (a ``torch_dist`` DCP save or a ``zarr`` save, with ``metadata.json``), where it supersedes the DCP reader.
Reading is megatron.py's, through dcp.py's ``DcpFiles`` or megatron_zarr.py's ``ZarrFiles``."""

from __future__ import annotations

import re

from ..dcp_metadata import METADATA_FILE
from ..megatron import (BACKEND_FILE, BRIDGE_STATE, COMMON_FILE, TRACKER, ZARR, MegatronFacts, is_iteration,
                        is_run, iterations, open_iteration, open_run)
from .dcp import DCP
from .reader import Claim, FolderScan, Reader


def megatron_claims(scan: FolderScan) -> list[Claim]:
    folder = scan.folder
    if is_run(folder):
        tags = set(iterations(folder))
        covers = {p for p in scan.entries if p.name in tags or p.name == TRACKER or BRIDGE_STATE.match(p.name)}
        return [Claim(MEGATRON, folder, lambda options: open_run(folder, options.tag), whole_folder=True,
                      covers=covers)]
    if is_iteration(folder):
        return [Claim(MEGATRON, folder, lambda options: open_iteration(folder, options.tag), whole_folder=True,
                      covers=set(scan.entries))]
    return []


def describe(facts: MegatronFacts) -> str:
    if (facts.sharded_backend or "").startswith(ZARR):  # a zarr save records no ranks
        return f"Megatron-Core distributed checkpoint ({facts.sharded_backend}, one zarr array per key)"
    return f"Megatron-Core distributed checkpoint ({facts.sharded_backend or '?'}, a DCP save), world size " \
           f"{facts.world_size or '?'}"


MEGATRON = Reader(
    name="Megatron-Core", format="megatron", what="the Megatron-Core checkpoint",
    looks_for=f"a Megatron-Core run ({TRACKER} beside iter_NNNNNNN/) or one iteration ({BACKEND_FILE} beside "
              f"{METADATA_FILE} or zarr arrays)",
    claims=megatron_claims, describe=describe, facts=MegatronFacts, whole_folders=True, supersedes=("DCP",),
    not_weights=(BRIDGE_STATE, re.compile(rf"^{re.escape(COMMON_FILE)}$")), own_tags=True,
    data_check=f"torch_dist: {DCP.data_check}; zarr: every chunk file against its array's .zarray (none missing or "
               "outside the grid, each its chunk's size; zarr keeps no checksum)")
