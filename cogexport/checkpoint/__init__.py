"""The source side: find a checkpoint's files, load them safely, and hand out tensors lazily."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import CogExportError
from .base import CheckpointInfo, LazyCheckpoint
from .dcp import DcpCheckpoint
from .dcp_locate import DcpLocation, locate_dcp
from .dcp_metadata import METADATA_FILE
from .deepspeed_universal import UniversalCheckpoint
from .deepspeed_zero import DeepSpeedCheckpoint
from .locate import MODEL_STATES, ZERO3_MODEL_STATES, ema_source, is_universal_folder, list_tags
from .safetensors_files import SafetensorsCheckpoint
from .torch_state_dict import TorchStateDictCheckpoint


def as_paths(checkpoint: str | Path | Sequence[str | Path]) -> list[Path]:
    """One path or several (rank files spread over several folders) as a list of paths."""
    if isinstance(checkpoint, (str, Path)):
        return [Path(checkpoint)]
    return [Path(p) for p in checkpoint]


def is_deepspeed_folder(folder: Path) -> bool:
    return (folder / "latest").is_file() or bool(list_tags(folder)) or any(
        MODEL_STATES.match(p.name) or ZERO3_MODEL_STATES.match(p.name) for p in folder.iterdir())


# Ready-to-load exports trainers write beside their checkpoints (finetrainers: model_weights/{step}/transformer/).
EXPORT_FOLDERS = ("model_weights", "lora_weights")
# CogVideo finetune/'s save hook writes the adapter, in the training dtype, into every DeepSpeed checkpoint-N.
DEEPSPEED_COMPANION = "pytorch_lora_weights.safetensors"


def open_checkpoint(checkpoint: str | Path | Sequence[str | Path], tag: str | None = None,
                    *, strict: bool = True, entry: str | None = None) -> LazyCheckpoint:
    """Open a checkpoint as a lazy mapping of names to ``LazyTensor`` (shape and dtype known, data read on load).

    DeepSpeed save dirs, tag dirs and model-states files (several paths for multi-node runs), DCP saves and the run
    folders holding them, safetensors files and folders (several files: one model's parts, their tensors named after
    each file), and plain torch.save state-dict files are recognised by what they are. A folder holding more than one
    of these is refused: the user says which.
    """
    paths = as_paths(checkpoint)
    if len(paths) > 1 and all(p.is_file() and p.suffix == ".safetensors" for p in paths):
        return SafetensorsCheckpoint(paths)  # one model's parts, one file each
    if len(paths) == 1 and paths[0].exists():
        path = paths[0]
        if path.is_file() and path.name == METADATA_FILE:
            path = path.parent
        if path.is_file() and path.suffix == ".safetensors":
            return SafetensorsCheckpoint(path)
        if path.is_file() and not (MODEL_STATES.match(path.name) or ZERO3_MODEL_STATES.match(path.name)):
            return TorchStateDictCheckpoint(path, entry)
        if path.is_dir() and is_universal_folder(path):
            return UniversalCheckpoint(path)
        if path.is_dir() and tag is not None and is_universal_folder(path / tag):  # --tag global_step9_universal
            return UniversalCheckpoint(path / tag)
        if path.is_dir():
            # --tag on a DeepSpeed folder names a DeepSpeed tag; anywhere else it may name a DCP step
            dcp = None if tag is not None and is_deepspeed_folder(path) else locate_dcp(path, tag)
            _refuse_several_candidates(path, dcp, tag)
            if dcp is not None:
                return DcpCheckpoint(dcp)
            if not is_deepspeed_folder(path) and any(path.glob("*.safetensors")):
                return SafetensorsCheckpoint(path)
    checkpoint = DeepSpeedCheckpoint(paths, tag, strict=strict, entry=entry or "module")
    companion = [p / DEEPSPEED_COMPANION for p in paths if p.is_dir() and (p / DEEPSPEED_COMPANION).is_file()]
    if companion:
        checkpoint.info.notes.append(f"read the DeepSpeed state (fp32 masters); {companion[0]} beside it is the "
                                     "run's adapter copy in the training dtype: point at that file to export it instead")
    return checkpoint


def open_ema(checkpoint: str | Path | Sequence[str | Path], tag: str | None = None) -> LazyCheckpoint:
    """A run's EMA weights: SAT's copy in the TAG-ema folder beside the checkpoint, else an ``ema`` state dict saved
    in the same file beside ``module`` (HunyuanVideo's releases and training runs)."""
    paths = as_paths(checkpoint)
    try:
        ema_paths, ema_tag = ema_source(paths, tag)
    except CogExportError as no_folder:
        try:
            return open_checkpoint(paths, tag, entry="ema")
        except CogExportError:
            raise CogExportError(f"{no_folder}, and the checkpoint file holds no 'ema' state dict") from None
    return open_checkpoint(ema_paths, ema_tag)


def _refuse_several_candidates(path: Path, dcp: DcpLocation | None, tag: str | None) -> None:
    """A folder holding two sets of weights (a DCP step and a stray .safetensors, a DeepSpeed tag and an exported
    model.safetensors, a run's checkpoints and its ready exports) names them all instead of picking one."""
    found = []
    if dcp is not None and dcp.steps:
        run = dcp.step_dir.parent.relative_to(path)
        found.append(f"DCP checkpoint steps {', '.join(dcp.steps)}{f' in {run}' if run.parts else ''} (pick one with "
                     f"--tag {dcp.step_dir.name})" if tag is None else f"the DCP checkpoint {dcp.step_dir}")
    elif dcp is not None:
        found.append(f"the DCP checkpoint {dcp.step_dir} (point at {dcp.model})")
    if is_deepspeed_folder(path):
        found.append(f"the DeepSpeed checkpoint {path.name} (pick with --tag or point at its tag folder)")
    if tag is None:
        stray = sorted(p.name for p in path.glob("*.safetensors")
                       if not (p.name == DEEPSPEED_COMPANION and is_deepspeed_folder(path)))
        if stray and (dcp is not None or is_deepspeed_folder(path)):
            found.append(f"safetensors weights {', '.join(stray)} (point at the file)")
        for name in EXPORT_FOLDERS:
            exported = sorted({p.parent for p in (path / name).rglob("*.safetensors")}) if (path / name).is_dir() \
                else []
            found += [f"the exported weights {folder.relative_to(path)} (point at that folder)" for folder in exported]
    if len(found) > 1:
        raise CogExportError(f"{path} holds more than one set of weights: {'; '.join(found)}; cogexport will not "
                             "guess which one you mean")


__all__ = ["CheckpointInfo", "DcpCheckpoint", "DeepSpeedCheckpoint", "LazyCheckpoint", "SafetensorsCheckpoint",
           "TorchStateDictCheckpoint", "UniversalCheckpoint", "as_paths", "is_deepspeed_folder", "open_checkpoint",
           "open_ema"]
