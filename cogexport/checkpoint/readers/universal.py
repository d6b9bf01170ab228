"""The DeepSpeed universal checkpoint reader (``cogexport universal``'s or ``ds_to_universal``'s output): a folder of
``zero/<name>/fp32.pt`` files beside its model-states file. Reading is deepspeed_universal.py's."""

from __future__ import annotations

from ..deepspeed_universal import UniversalCheckpoint, UniversalFacts
from ..locate import is_universal_folder
from .reader import Claim, FolderScan, Reader


def universal_claims(scan: FolderScan) -> list[Claim]:
    folder = scan.folder
    if not is_universal_folder(folder):
        return []
    return [Claim(UNIVERSAL, folder, lambda options: UniversalCheckpoint(folder), whole_folder=True)]


def describe(facts: UniversalFacts) -> str:
    return (f"DeepSpeed universal checkpoint (saved at world size {facts.world_size}; load with "
            "{\"checkpoint\": {\"load_universal\": true}})")


UNIVERSAL = Reader(
    name="DeepSpeed universal", format="deepspeed-universal", what="the DeepSpeed universal checkpoint",
    looks_for="a DeepSpeed universal checkpoint (zero/optimizer_state.pt)",
    claims=universal_claims, describe=describe, facts=UniversalFacts, whole_folders=True,
    data_check="every record's CRC-32")
