"""The checkpoints a path holds, found without reading any tensor: every registered reader's claims on one folder
(readers/), gathered on a folder and below it.

Each reader says, from names alone, which parts of one folder are its checkpoint. The readers that claim folders
whole (a DeepSpeed save or tag dir, a DCP save, ...) are asked first; a reader may supersede another's whole-folder
claim on the same folder. The readers of loose files (safetensors, torch.save, GGUF files) are asked next, each
seeing the claims made before it, and leave alone what those cover and what any reader calls not weights (training
state, one rank's piece of a save). ``gather`` collects the claims on a folder and, unless that folder is a
checkpoint itself, on the folders up to three levels below it (a run's steps, torchtitan's ``checkpoint/step-N``, a
folder of runs); a folder a reader claims whole is not searched further. Deciding between the claims is the
dispatcher's job (dispatch.py).
"""

from __future__ import annotations

from pathlib import Path

from .readers import Claim, FolderScan, claiming_order

SEARCH_DEPTH = 3  # torchtitan: DUMP/checkpoint/step-N; a folder of runs one level further up


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def folder_claims(folder: Path) -> list[Claim]:
    """Every reader's claims on ``folder`` itself (not on its subfolders)."""
    order = claiming_order()
    scan = FolderScan(folder, _entries(folder), [], tuple(p for reader in order for p in reader.not_weights))
    for reader in (reader for reader in order if reader.whole_folders):
        scan.earlier += reader.claims(scan)
    scan.earlier = _without_superseded(scan.earlier)
    for reader in (reader for reader in order if not reader.whole_folders):
        scan.earlier += reader.claims(scan)
    return scan.earlier


def _without_superseded(claims: list[Claim]) -> list[Claim]:
    """The claims but the whole-folder claims that another reader's claim on the same folder supersedes."""
    giving_way = {(claim.path, name) for claim in claims if claim.whole_folder for name in claim.reader.supersedes}
    return [claim for claim in claims if not (claim.whole_folder and (claim.path, claim.reader.name) in giving_way)]


def _searchable(folder: Path) -> bool:
    return folder.is_dir() and not folder.name.startswith((".", "__")) and ".cogexport-" not in folder.name


def gather(root: Path) -> list[Claim]:
    """The claims on ``root`` and, unless a reader claims it whole, on its subfolders up to SEARCH_DEPTH down."""
    claims = folder_claims(root)
    level = [] if any(claim.whole_folder for claim in claims) else [root]
    for _ in range(SEARCH_DEPTH):
        below = []
        for folder in level:
            for child in filter(_searchable, _entries(folder)):
                found = folder_claims(child)
                claims += found
                if not any(claim.whole_folder for claim in found):
                    below.append(child)
        level = below
    return claims
