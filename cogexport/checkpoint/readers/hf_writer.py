"""The reader of PyTorch's Hugging Face storage writer's saves: a folder of per-rank files
(``shard-R-model-K-of-N.safetensors``), or a consolidated save (``model.safetensors.index.json`` with ``sharded/``
beside it). Reading is hf_storage.py's."""

from __future__ import annotations

from ..hf_storage import INDEX, SHARDED_FOLDER, HfConsolidatedCheckpoint, HfShardedCheckpoint, HfWriterFacts, \
    consolidated_leftover, rank_files
from ..safetensors_files import RANK_FILE
from .reader import Claim, FolderScan, Reader


def hf_writer_claims(scan: FolderScan) -> list[Claim]:
    folder = scan.folder
    leftover = consolidated_leftover(folder)
    if leftover is not None:
        covers = {folder / INDEX, leftover, *(p for p in folder.glob("model-*-of-*.safetensors"))}
        return [Claim(HF_WRITER, folder, lambda options: HfConsolidatedCheckpoint(folder),
                      what="the consolidated Hugging Face writer save", whole_folder=True, covers=covers)]
    files = rank_files(folder)
    if not files:
        return []
    return [Claim(HF_WRITER, folder, lambda options: HfShardedCheckpoint(folder),
                  what="the per-rank Hugging Face writer save", whole_folder=True, covers=set(files))]


def describe(facts: HfWriterFacts) -> str:
    ranks = f", {facts.world_size} ranks" if facts.world_size else ""
    return f"PyTorch distributed checkpoint in safetensors, saved by {facts.writer}{ranks}"


HF_WRITER = Reader(
    name="Hugging Face writer", format="hf-storage", what="the Hugging Face writer save",
    looks_for=f"a Hugging Face writer save (shard-*-model-*-of-*.safetensors, or {INDEX} with {SHARDED_FOLDER}/)",
    claims=hf_writer_claims, describe=describe, facts=HfWriterFacts, whole_folders=True, not_weights=(RANK_FILE,),
    data_check="the headers' offsets and dtypes and where each piece lies only: safetensors keeps no checksum, so a "
               "changed value that is still finite cannot be told from the saved one")
