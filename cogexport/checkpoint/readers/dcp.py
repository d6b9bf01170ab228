"""The torch.distributed.checkpoint (DCP) reader: a save folder (``.metadata`` beside ``__R_K.distcp`` files), or
accelerate's ``checkpoint-N`` holding ``pytorch_model_fsdp_0/``; a run folder of them is a run of steps. Reading is
dcp.py's; finding the save and its optimizer, dcp_locate.py's."""

from __future__ import annotations

from ..dcp import DcpCheckpoint, DcpFacts
from ..dcp_locate import accelerate_models, is_dcp_save, locate_dcp
from ..dcp_metadata import METADATA_FILE
from .reader import Claim, FolderScan, Reader


def dcp_claims(scan: FolderScan) -> list[Claim]:
    folder = scan.folder
    models = accelerate_models(folder)
    if not is_dcp_save(folder) and not models:
        return []
    covers = {p for p in scan.entries if p.suffix == ".distcp" or p.name == METADATA_FILE} | set(models)
    covers |= {p for p in scan.entries if p.name.startswith("optimizer_") and p.is_dir()}
    detail = f"point at {models[0]}" if len(models) == 1 else f"models {', '.join(m.name for m in models)}" \
        if models else ""
    return [Claim(DCP, folder, lambda options: DcpCheckpoint(locate_dcp(folder, options.tag)), whole_folder=True,
                  covers=covers, detail=detail)]


def describe(facts: DcpFacts) -> str:
    return f"PyTorch distributed checkpoint (DCP), saved by {facts.writer}, world size {facts.world_size or '?'}"


DCP = Reader(
    name="DCP", format="dcp", what="the DCP checkpoint",
    looks_for="a DCP save (.metadata beside __0_0.distcp files) or accelerate's checkpoint-N/pytorch_model_fsdp_0",
    claims=dcp_claims, describe=describe, facts=DcpFacts, whole_folders=True,
    stands_for_folder=frozenset({METADATA_FILE}),
    data_check="each chunk's CRC-32s (its own small torch.save archive; DCP keeps no checksum of its own), the files "
               "against .metadata")
