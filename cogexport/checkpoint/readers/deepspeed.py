"""The DeepSpeed reader (ZeRO stages 0-3, and SAT, which saves through DeepSpeed): a save dir with its ``latest``
pointer and tag folders, one tag folder, or a folder of rank files; a model-states file given alone; several folders
of one save (one per node). Reading is deepspeed_zero.py's."""

from __future__ import annotations

from pathlib import Path

from ..base import LazyCheckpoint
from ..deepspeed_universal import UniversalCheckpoint
from ..deepspeed_zero import DeepSpeedCheckpoint, DeepSpeedFacts
from ..locate import MODEL_STATES, OPTIM_STATES, PIPELINE_LAYER, ZERO3_MODEL_STATES, is_universal_folder, list_tags
from ..safetensors_files import SafetensorsCheckpoint
from .reader import Claim, FolderScan, OpenOptions, Reader
from .safetensors import SAFETENSORS

# CogVideo finetune/'s save hook writes the adapter, in the training dtype, into every DeepSpeed checkpoint-N.
DEEPSPEED_COMPANION = "pytorch_lora_weights.safetensors"
RANK_FILES = (MODEL_STATES, ZERO3_MODEL_STATES, OPTIM_STATES, PIPELINE_LAYER)


def is_deepspeed_folder(folder: Path) -> bool:
    try:
        names = [path.name for path in folder.iterdir()]
    except OSError:
        names = []
    return (folder / "latest").is_file() or bool(list_tags(folder)) or any(
        MODEL_STATES.match(name) or ZERO3_MODEL_STATES.match(name) for name in names)


def _is_rank_file(name: str) -> bool:
    return any(pattern.match(name) for pattern in RANK_FILES)


def _open_folder(folder: Path, options: OpenOptions) -> LazyCheckpoint:
    if options.tag is not None and is_universal_folder(folder / options.tag):  # --tag global_step9_universal
        return UniversalCheckpoint(folder / options.tag)
    checkpoint = _open_several([folder], options)
    if (folder / DEEPSPEED_COMPANION).is_file():
        checkpoint.info.notes.append(f"read the DeepSpeed state (fp32 masters); {folder / DEEPSPEED_COMPANION} beside "
                                     "it is the run's adapter copy in the training dtype: point at that file to "
                                     "export it instead")
    return checkpoint


def _open_several(paths: list[Path], options: OpenOptions) -> DeepSpeedCheckpoint:
    return DeepSpeedCheckpoint(paths, options.tag, strict=options.strict, entry=options.entry or "module")


def deepspeed_claims(scan: FolderScan) -> list[Claim]:
    folder = scan.folder
    if is_universal_folder(folder) or not is_deepspeed_folder(folder):
        return []
    covers = {p for p in scan.entries if _is_rank_file(p.name) or p.name == "latest"}
    covers |= {folder / tag for tag in list_tags(folder)}
    claims = [Claim(DEEPSPEED, folder, lambda options: _open_folder(folder, options), whole_folder=True,
                    covers=covers)]
    companion = folder / DEEPSPEED_COMPANION
    if companion.is_file():
        claims.append(Claim(SAFETENSORS, companion, lambda options: SafetensorsCheckpoint(companion),
                            what="the adapter copy", companion=True, covers={companion}))
    return claims


def describe(facts: DeepSpeedFacts) -> str:
    kind = {None: "model states only (as SAT saves them)", 0: "ZeRO stage 0 (no partitioning)"}.get(
        facts.stage, f"ZeRO-{facts.stage}")
    ranks = f"world size {facts.world_size}" if not facts.tensor_parallel else \
        f"{facts.tensor_parallel} tensor-parallel x {facts.world_size} data-parallel ranks"
    return (f"DeepSpeed {kind}{' + AutoTP' if facts.tensor_parallel else ''}, {facts.training_dtype or '?'} training, "
            f"{ranks}" + (f", saved by DeepSpeed {facts.ds_version}" if facts.ds_version else ""))


DEEPSPEED = Reader(
    name="DeepSpeed", format="deepspeed", what="the DeepSpeed checkpoint",
    looks_for="a DeepSpeed or SAT save dir ('latest', tag folders of *_model_states.pt files), a tag folder such as "
              "global_step100, or a checkpoint-N folder holding one",
    claims=deepspeed_claims, describe=describe, facts=DeepSpeedFacts, whole_folders=True, not_weights=RANK_FILES,
    reads_file=lambda path: bool(MODEL_STATES.match(path.name) or ZERO3_MODEL_STATES.match(path.name)),
    open_file=lambda path, options: _open_several([path], options), open_several=_open_several, spans_folders=True,
    own_tags=True, takes_entry=True,
    data_check="every record's CRC-32, and a few elements of each fp32 master against the module's 16-bit copy")
