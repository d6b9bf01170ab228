"""What each reader claims in a folder: the checkpoints a path holds, found without reading any tensor.

Every reader says, from names alone, which parts of one folder are its checkpoint: a whole-folder checkpoint
(a DeepSpeed save or tag dir, a DeepSpeed universal checkpoint, a DCP save or accelerate's step holding one, a
Hugging Face writer save: per rank, or consolidated with its ``sharded/``), or loose weights (a folder's safetensors
weights, another safetensors file, a torch.save weights file). ``gather`` collects the claims on a folder and,
unless that folder is a checkpoint itself, on the folders up to three levels below it (a run's steps, torchtitan's
``checkpoint/step-N``, a folder of runs); a folder a reader claims whole is not searched further. Deciding between
the claims is the dispatcher's job (dispatch.py).
"""

from __future__ import annotations

import json

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import CogExportError
from .base import LazyCheckpoint
from .dcp import DcpCheckpoint
from .dcp_locate import accelerate_models, is_dcp_save, locate_dcp
from .deepspeed_universal import UniversalCheckpoint
from .deepspeed_zero import DeepSpeedCheckpoint
from .hf_storage import INDEX, SHARDED_FOLDER, HfConsolidatedCheckpoint, HfShardedCheckpoint, consolidated_leftover, \
    rank_files
from .locate import MODEL_STATES, OPTIM_STATES, PIPELINE_LAYER, ZERO3_MODEL_STATES, is_universal_folder, list_tags
from .safetensors_files import PLAIN_STEMS, RANK_FILE, SafetensorsCheckpoint, indexed_files
from .torch_state_dict import TorchStateDictCheckpoint

# CogVideo finetune/'s save hook writes the adapter, in the training dtype, into every DeepSpeed checkpoint-N.
DEEPSPEED_COMPANION = "pytorch_lora_weights.safetensors"
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
# Training state trainers save beside the weights (accelerate, HF Trainer, diffusers scripts): never weights.
TRAINING_STATE = re.compile(r"^(optimizer|scheduler|lr_scheduler|sampler|scaler|random_states|rng_state|"
                            r"custom_checkpoint|training_args|trainer_state)")
SEARCH_DEPTH = 3  # torchtitan: DUMP/checkpoint/step-N; a folder of runs one level further up

# What each reader looks for, for the line that says a folder holds nothing any of them reads.
LOOKS_FOR = {
    "DeepSpeed": "a DeepSpeed or SAT save dir ('latest', tag folders of *_model_states.pt files), a tag folder such "
                 "as global_step100, or a checkpoint-N folder holding one",
    "DeepSpeed universal": "a DeepSpeed universal checkpoint (zero/optimizer_state.pt)",
    "DCP": "a DCP save (.metadata beside __0_0.distcp files) or accelerate's checkpoint-N/pytorch_model_fsdp_0",
    "Hugging Face writer": "a Hugging Face writer save (shard-*-model-*-of-*.safetensors, or "
                           f"{INDEX} with {SHARDED_FOLDER}/)",
    "safetensors": "safetensors weights (*.safetensors)",
    "torch.save": f"torch.save weights ({', '.join('*' + s for s in TORCH_SUFFIXES)})",
    "GGUF": "a GGUF file (*.gguf)",
}


@dataclass(frozen=True)
class OpenOptions:
    tag: str | None = None
    strict: bool = True
    entry: str | None = None


@dataclass(eq=False)  # each claim is itself (hashed by identity)
class Claim:
    """One reader's claim: ``path`` (a folder or a file) holds one checkpoint it can open."""

    reader: str  # a key of LOOKS_FOR
    path: Path
    what: str  # how a listing names it: "the DeepSpeed checkpoint", "safetensors weights", ...
    opener: Callable[[OpenOptions], LazyCheckpoint]
    whole_folder: bool = False  # the folder is this checkpoint: nothing below it is another candidate
    covers: set[Path] = field(default_factory=set)  # the folder's entries that belong to it
    companion: bool = False  # read only through its owner (DeepSpeed's adapter copy), never a candidate itself
    detail: str = ""  # what a listing adds in brackets
    notes: list[str] = field(default_factory=list)  # what the dispatcher found out about it, for info.notes

    def open(self, options: OpenOptions) -> LazyCheckpoint:
        return self.opener(options)

    def main_file(self) -> Path:
        """The file that stands for the claim: an index, else its weights file, else the claimed path itself."""
        files = sorted(self.covers, key=lambda p: (p.suffix != ".json", p.name))
        return next((p for p in files if p.suffix in (".json", ".safetensors")), self.path)

    def label(self, root: Path) -> str:
        """The claim's path as the user would type it from ``root`` (the file when it is root's own weights)."""
        path = self.main_file() if self.path == root else self.path
        return str(path.relative_to(root)) if path != root and path.is_relative_to(root) else str(path.name)


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def is_deepspeed_folder(folder: Path) -> bool:
    return (folder / "latest").is_file() or bool(list_tags(folder)) or any(
        MODEL_STATES.match(p.name) or ZERO3_MODEL_STATES.match(p.name) for p in _entries(folder))


def _is_deepspeed_file(name: str) -> bool:
    return any(pattern.match(name) for pattern in (MODEL_STATES, ZERO3_MODEL_STATES, OPTIM_STATES, PIPELINE_LAYER))


# -- whole-folder readers -------------------------------------------------------------------------------------
def universal_claims(folder: Path) -> list[Claim]:
    if not is_universal_folder(folder):
        return []
    return [Claim("DeepSpeed universal", folder, "the DeepSpeed universal checkpoint",
                  lambda options: UniversalCheckpoint(folder), whole_folder=True)]


def _open_deepspeed(folder: Path, options: OpenOptions) -> LazyCheckpoint:
    if options.tag is not None and is_universal_folder(folder / options.tag):  # --tag global_step9_universal
        return UniversalCheckpoint(folder / options.tag)
    checkpoint = DeepSpeedCheckpoint([folder], options.tag, strict=options.strict, entry=options.entry or "module")
    if (folder / DEEPSPEED_COMPANION).is_file():
        checkpoint.info.notes.append(f"read the DeepSpeed state (fp32 masters); {folder / DEEPSPEED_COMPANION} beside "
                                     "it is the run's adapter copy in the training dtype: point at that file to "
                                     "export it instead")
    return checkpoint


def deepspeed_claims(folder: Path) -> list[Claim]:
    if is_universal_folder(folder) or not is_deepspeed_folder(folder):
        return []
    covers = {p for p in _entries(folder) if _is_deepspeed_file(p.name) or p.name == "latest"}
    covers |= {folder / tag for tag in list_tags(folder)}
    claims = [Claim("DeepSpeed", folder, "the DeepSpeed checkpoint", lambda options: _open_deepspeed(folder, options),
                    whole_folder=True, covers=covers)]
    if (folder / DEEPSPEED_COMPANION).is_file():
        claims.append(Claim("safetensors", folder / DEEPSPEED_COMPANION, "the adapter copy",
                            lambda options: SafetensorsCheckpoint(folder / DEEPSPEED_COMPANION), companion=True,
                            covers={folder / DEEPSPEED_COMPANION}))
    return claims


def _open_dcp(folder: Path, options: OpenOptions) -> LazyCheckpoint:
    return DcpCheckpoint(locate_dcp(folder, options.tag))


def dcp_claims(folder: Path) -> list[Claim]:
    models = accelerate_models(folder)
    if not is_dcp_save(folder) and not models:
        return []
    covers = {p for p in _entries(folder) if p.suffix == ".distcp" or p.name == ".metadata"} | set(models)
    covers |= {p for p in _entries(folder) if p.name.startswith("optimizer_") and p.is_dir()}
    detail = f"point at {models[0]}" if len(models) == 1 else f"models {', '.join(m.name for m in models)}" \
        if models else ""
    return [Claim("DCP", folder, "the DCP checkpoint", lambda options: _open_dcp(folder, options), whole_folder=True,
                  covers=covers, detail=detail)]


def hf_storage_claims(folder: Path) -> list[Claim]:
    leftover = consolidated_leftover(folder)
    if leftover is not None:
        covers = {folder / INDEX, leftover, *(p for p in folder.glob("model-*-of-*.safetensors"))}
        return [Claim("Hugging Face writer", folder, "the consolidated Hugging Face writer save",
                      lambda options: HfConsolidatedCheckpoint(folder), whole_folder=True, covers=covers)]
    files = rank_files(folder)
    if not files:
        return []
    return [Claim("Hugging Face writer", folder, "the per-rank Hugging Face writer save",
                  lambda options: HfShardedCheckpoint(folder), whole_folder=True, covers=set(files))]


# -- loose weights ---------------------------------------------------------------------------------------------
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


def _folder_weights(folder: Path, files: list[Path], covered: set[Path], alone: bool) -> list[Path]:
    """The safetensors files read as the folder's one model, and what belongs to them: the plain weights, else
    another index's files, else the folder's only file (``alone``: nothing else of safetensors in the folder)."""
    plain = _plain_weights(folder, files, covered)
    if plain:
        return plain
    indexes = [p for p in _entries(folder) if p.name.endswith(".json") and ".safetensors.index" in p.name
               and p not in covered]
    if indexes:  # a trainer's own index name: its files and no others
        named = {name for index in indexes for name in _index_names(index)}
        return [*indexes, *(p for p in files if p.name in named)]
    return files if alone and len(files) == 1 else []  # a folder of one file reads as that file


def safetensors_claims(folder: Path, covered: set[Path]) -> list[Claim]:
    everything = [p for p in _entries(folder) if p.suffix == ".safetensors" and p.is_file()]
    files = [p for p in everything if p not in covered and not RANK_FILE.match(p.name)]
    weights = _folder_weights(folder, files, covered, alone=everything == files)
    claims = []
    if weights:  # a model folder (plain weights, an index) is named by the folder; a folder of one file by the file
        shown = weights[0] if len(weights) == 1 and weights[0].stem not in PLAIN_STEMS else folder
        claims.append(Claim("safetensors", shown, "safetensors weights", lambda options: SafetensorsCheckpoint(folder),
                            covers=set(weights)))
    others = [file for file in files if file not in weights]
    if weights and others and _is_model_folder(folder):
        # a save_pretrained model folder is its plain weights (what from_pretrained reads); other files beside them
        # are side files (cogexport keeps a release's tensors the Diffusers class has no place for there)
        claims[0].covers |= set(others)
        return claims
    claims += [Claim("safetensors", file, "safetensors weights", lambda options, file=file: SafetensorsCheckpoint(file),
                     covers={file}) for file in others]
    return claims


def _is_model_folder(folder: Path) -> bool:
    """A Diffusers model folder: its config.json names the model's class."""
    try:
        return isinstance(json.loads((folder / "config.json").read_text()).get("_class_name"), str)
    except (OSError, ValueError, AttributeError):
        return False


def _index_names(index: Path) -> set[str]:
    try:
        return {file.name for file in indexed_files(index)}
    except CogExportError:
        return set()  # a damaged index: the reader says so when it is opened


def torch_file_claims(folder: Path, covered: set[Path], has_safetensors: bool) -> list[Claim]:
    """torch.save weights lying loose: not a DeepSpeed rank file, not training state, not the older ``.bin`` copy of
    safetensors weights beside it (pytorch_model.bin beside model.safetensors)."""
    claims = []
    for file in _entries(folder):
        if file.suffix not in TORCH_SUFFIXES or file in covered or not file.is_file() or _is_deepspeed_file(file.name) \
                or TRAINING_STATE.match(file.name):
            continue
        if has_safetensors and file.suffix == ".bin" and "pytorch_model" in file.name:
            continue
        claims.append(Claim("torch.save", file, "torch.save weights",
                            lambda options, file=file: TorchStateDictCheckpoint(file, options.entry), covers={file}))
    return claims


def gguf_claims(folder: Path) -> list[Claim]:
    """GGUF files (a quantized transformer: cogexport's --to gguf output, a ComfyUI-GGUF file)."""
    from .gguf_file import GgufCheckpoint

    return [Claim("GGUF", file, "a GGUF file", lambda options, file=file: GgufCheckpoint(file), covers={file})
            for file in _entries(folder) if file.suffix == ".gguf" and file.is_file()]


WHOLE_FOLDER_READERS = (universal_claims, deepspeed_claims, dcp_claims, hf_storage_claims)


def folder_claims(folder: Path) -> list[Claim]:
    """Every reader's claims on ``folder`` itself (not on its subfolders)."""
    claims = [claim for reader in WHOLE_FOLDER_READERS for claim in reader(folder)]
    covered = {path for claim in claims for path in claim.covers}
    weights = safetensors_claims(folder, covered)
    covered |= {path for claim in weights for path in claim.covers}
    return claims + weights + torch_file_claims(folder, covered, has_safetensors=bool(weights)) + gguf_claims(folder)


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
