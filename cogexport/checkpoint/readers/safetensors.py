"""The safetensors reader: a folder's weights (a Diffusers model folder's by the names from_pretrained reads,
model_folder.py; a folder's plain weights and their index, another index and its files, or a folder's only file),
other loose files each on its own, a file given alone, and one model's parts in
separate files given together. Reading is safetensors_files.py's."""

from __future__ import annotations

from pathlib import Path

from ...errors import CogExportError
from ..base import HeaderFacts
from ..model_folder import ModelFolderWeights, model_folder_weights
from ..safetensors_files import PLAIN_STEMS, SafetensorsCheckpoint, indexed_files, refuse_distributed_piece
from .reader import Claim, FolderScan, OpenOptions, Reader


def _plain_weights(folder: Path, files: list[Path], covered: set[Path]) -> list[Path]:
    """The files ``from_pretrained`` would read (the plain stem's index and its files, or the plain stem's file) and
    the same weights in other forms, which belong to them (variants such as ``stem.fp16.safetensors``)."""
    for stem in PLAIN_STEMS:
        index = folder / f"{stem}.safetensors.index.json"
        if index.is_file() and index not in covered:
            named = _index_names(index)
            return [index, *(p for p in files if p.name in named or p.name.startswith(f"{stem}."))]
        if folder / f"{stem}.safetensors" in files:
            return [p for p in files if p.name.startswith(f"{stem}.")]
    return []


def _folder_weights(scan: FolderScan, files: list[Path], alone: bool) -> list[Path]:
    """The safetensors files read as the folder's one model, and what belongs to them: the plain weights, else
    another index's files, else the folder's only file (``alone``: nothing else of safetensors in the folder)."""
    covered = scan.covered()
    plain = _plain_weights(scan.folder, files, covered)
    if plain:
        return plain
    indexes = [p for p in scan.entries if p.name.endswith(".json") and ".safetensors.index" in p.name
               and p not in covered]
    if indexes:  # a trainer's own index name: its files and no others
        named = {name for index in indexes for name in _index_names(index)}
        return [*indexes, *(p for p in files if p.name in named)]
    return files if alone and len(files) == 1 else []  # a folder of one file reads as that file


def safetensors_claims(scan: FolderScan) -> list[Claim]:
    model = None if scan.earlier else model_folder_weights(scan.folder, scan.entries, scan.is_not_weights)
    if model is not None:
        return _model_folder_claims(model)
    folder, covered = scan.folder, scan.covered()
    everything = scan.files(".safetensors")
    files = [p for p in everything if p not in covered and not scan.is_not_weights(p.name)]
    weights = _folder_weights(scan, files, alone=everything == files)
    claims = []
    if weights:  # a folder of weights (an index, plain weights) is named by the folder; one file's folder by the file
        shown = weights[0] if len(weights) == 1 and weights[0].stem not in PLAIN_STEMS else folder
        claims.append(Claim(SAFETENSORS, shown, lambda options: SafetensorsCheckpoint(folder), covers=set(weights)))
    others = [file for file in files if file not in weights]
    claims += [Claim(SAFETENSORS, file, lambda options, file=file: SafetensorsCheckpoint(file), covers={file})
               for file in others]
    return claims


def _model_folder_claims(model: ModelFolderWeights) -> list[Claim]:
    """A Diffusers model folder (model_folder.py): its weights by from_pretrained's names, every other weight file
    beside them left alone (named in a note); several variants and no plain weights, or none of them but other weight
    files: a claim that refuses, naming them."""
    folder, beside = model.folder, {*model.forms, *model.strays}
    if model.kind == "bin":
        return []  # torch.save weights: the torch.save reader claims them and what lies beside them
    if model.chosen:
        note = model.stray_note()
        return [Claim(SAFETENSORS, folder, lambda options: SafetensorsCheckpoint(folder),
                      covers={*model.chosen, *beside}, notes=[note] if note else [])]
    if model.strays or model.choices:
        def refuse(options: OpenOptions) -> SafetensorsCheckpoint:
            raise model.refusal()

        variants = {path for files in model.choices.values() for path in files}
        detail = "several variants, no plain weights" if model.choices else "no weight file from_pretrained reads"
        return [Claim(SAFETENSORS, folder, refuse, covers={*beside, *variants}, detail=detail)]
    return []


def _index_names(index: Path) -> set[str]:
    try:
        return {file.name for file in indexed_files(index)}
    except CogExportError:
        return set()  # a damaged index: the reader says so when it is opened


def _open_files(paths: list[Path], options: OpenOptions) -> SafetensorsCheckpoint:
    """Files given by path: one file, or one model's parts in separate files; never one rank's piece of a save."""
    for path in paths:
        refuse_distributed_piece(path, {})
    return SafetensorsCheckpoint(paths if len(paths) > 1 else paths[0])


SAFETENSORS = Reader(
    name="safetensors", format="safetensors", what="safetensors weights",
    looks_for="safetensors weights (*.safetensors)",
    claims=safetensors_claims, describe=lambda facts: "safetensors", facts=HeaderFacts,
    reads_file=lambda path: path.suffix == ".safetensors", open_file=lambda path, options: _open_files([path], options),
    open_several=_open_files, may_be_a_copy=True,
    data_check="the header's offsets and dtypes only: safetensors keeps no checksum, so a changed value that is still "
               "finite cannot be told from the saved one")
