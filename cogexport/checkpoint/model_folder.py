"""The weights of a Diffusers model folder, by the file names ``from_pretrained`` reads, and nothing else.

A model folder is one whose ``config.json`` names a class (``_class_name``), as ``save_pretrained`` writes it. Its
weights are ``diffusion_pytorch_model.safetensors``, or the shards its index
``diffusion_pytorch_model.safetensors.index.json`` names; with a variant V, ``diffusion_pytorch_model.V.safetensors``
or the index ``diffusion_pytorch_model.safetensors.index.V.json`` (older saves: ``...safetensors.V.index.json``);
and the same names ending in ``.bin`` for torch.save weights. The plain (variant-less) weights are read when present,
else the folder's one variant. Any other weight file beside them (a ``ground_truth.safetensors`` left there, an
``ema.pt``) is no part of the model for ``from_pretrained``: it is left alone and named in a note (the files cogexport
itself keeps beside a model, kept_beside.py, silently), and a folder with no such weights but other weight files is
refused, naming them, rather than read from a file it may not mean.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import CogExportError
from ..kept_beside import KEPT_BESIDE_MODELS
from .safetensors_files import indexed_files

CONFIG = "config.json"
STEM = "diffusion_pytorch_model"
# diffusion_pytorch_model[.V][-0000k-of-0000n].(safetensors|bin), and the indexes in today's and the older spelling.
_WEIGHTS = re.compile(rf"{STEM}(?:\.(?P<variant>[^-]+?))?(?P<shard>-\d+-of-\d+)?\.(?P<kind>safetensors|bin)")
_INDEX = re.compile(rf"{STEM}\.(?P<kind>safetensors|bin)(?:\.index(?:\.(?P<variant>.+))?|\.(?P<old>.+)\.index)\.json")
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


@dataclass
class ModelFolderWeights:
    """What a model folder's weight files are: ``chosen`` (the files read, an index first), the model's weights in
    other forms (``forms``: variants, .bin beside safetensors), ``choices`` (each variant's files, when there are
    several and no plain weights: the user picks) and ``strays`` (weight files from_pretrained never reads)."""

    folder: Path
    class_name: str
    chosen: list[Path] = field(default_factory=list)
    forms: list[Path] = field(default_factory=list)
    choices: dict[str, list[Path]] = field(default_factory=dict)
    strays: list[Path] = field(default_factory=list)

    @property
    def kind(self) -> str | None:
        """"safetensors" or "bin": the kind of the files read (None when there is nothing to read)."""
        files = [p for p in self.chosen if p.suffix != ".json"]
        return None if not files else "bin" if files[0].suffix == ".bin" else "safetensors"

    def stray_note(self) -> str | None:
        if not self.strays:
            return None
        names = ", ".join(p.name for p in self.strays)
        return (f"{self.folder} is a Diffusers model folder ({self.class_name}): read its weights "
                f"{_shown(self.chosen)}; not read as its weights: {names} beside them, which from_pretrained does not "
                "read")

    def refusal(self) -> CogExportError:
        """The line refusing a folder whose weights are not named as from_pretrained names them, or that holds several
        variants of them and no plain weights (from_pretrained would need to be told which)."""
        if self.choices:
            listing = "; ".join(f"{variant}: {files[0].name}" for variant, files in self.choices.items())
            return CogExportError(f"{self.folder} is a Diffusers model folder ({self.class_name}) holding several "
                                  f"variants of its weights and no plain ones ({listing}); point at the variant's "
                                  "file (or a folder holding one variant); cogexport will not guess which one you mean")
        missing = (f"{self.folder} is a Diffusers model folder ({self.class_name}) with no weight file from_pretrained "
                   f"reads ({STEM}.safetensors, or its shards and index)")
        if not self.strays:
            return CogExportError(f"{missing}; give the folder its weights")
        names = ", ".join(p.name for p in self.strays)
        which = self.strays[0].name if len(self.strays) == 1 else "one of them"
        return CogExportError(f"{missing}; it holds {names}, which cogexport will not take as the model's weights "
                              f"unasked: point at {which} to read it, or name it {STEM}.safetensors")


def _shown(files: list[Path]) -> str:
    index = next((p for p in files if p.suffix == ".json"), None)
    return f"{index.name} and its {len(files) - 1} files" if index else files[0].name


def model_class(folder: Path) -> str | None:
    """The class a Diffusers model folder's config.json names, or None when the folder is no such folder."""
    try:
        name = json.loads((folder / CONFIG).read_text(encoding="utf-8")).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _index_variant(name: str) -> tuple[str, str | None] | None:
    found = _INDEX.fullmatch(name)
    return None if found is None else (found.group("kind"), found.group("variant") or found.group("old"))


def _groups(entries: list[Path]) -> dict[tuple[str, str | None], list[Path]]:
    """Every Diffusers-named set of weights in the folder, by (kind, variant): an index and the files it names, or
    one file."""
    groups: dict[tuple[str, str | None], list[Path]] = {}
    indexed: set[Path] = set()
    for path in entries:
        key = _index_variant(path.name)
        if key is not None and path.is_file():
            try:
                named = indexed_files(path)
            except CogExportError:
                named = []  # a damaged index: the reader says so when it is opened
            groups[key] = [path, *named]
            indexed.update(named)
    for path in entries:
        found = _WEIGHTS.fullmatch(path.name)
        # a shard is weights only through its index: one left without it is no model's weights
        if found and not found.group("shard") and path not in indexed and path.is_file():
            groups.setdefault((found.group("kind"), found.group("variant")), [path])
    return groups


def model_folder_weights(folder: Path, entries: list[Path],
                         not_weights: Callable[[str], bool]) -> ModelFolderWeights | None:
    """A model folder's weight files (None for a folder that is no Diffusers model folder). ``entries``: the folder's
    entries; ``not_weights(name)``: whether a file is training state or a piece of a save, never weights."""
    class_name = model_class(folder)
    if class_name is None:
        return None
    found = ModelFolderWeights(folder, class_name)
    groups = _groups(entries)
    for kind in ("safetensors", "bin"):
        variants = {variant: files for (k, variant), files in groups.items() if k == kind}
        if None in variants or len(variants) == 1:
            found.chosen = variants.get(None) or next(iter(variants.values()))
        elif variants:
            found.choices = {variant: files for variant, files in sorted(variants.items())}
        if found.chosen or found.choices:
            break
    named = {path for files in groups.values() for path in files}
    found.forms = sorted(named - set(found.chosen) - {p for files in found.choices.values() for p in files})
    # cogexport's own side files (the tensors the class has no place for) belong to the folder as it writes them
    found.forms += [path for path in entries if path.name in KEPT_BESIDE_MODELS and path not in named]
    found.strays = [path for path in entries if path.suffix in WEIGHT_SUFFIXES and path not in named
                    and path.name not in KEPT_BESIDE_MODELS and path.is_file() and not not_weights(path.name)]
    return found
