"""``cogexport universal``: DeepSpeed's universal checkpoint from a ZeRO-1/2/3 checkpoint, to resume a run on a
different number of GPUs (``{"checkpoint": {"load_universal": true}}``).

One layout that DeepSpeed loads at every ZeRO stage:

    SAVE_DIR/latest_universal                       the folder's name
    SAVE_DIR/<tag>_universal/mp_rank_00_model_states.pt               the source's rank-0 model states, verbatim
    SAVE_DIR/<tag>_universal/zero_pp_rank_0_mp_rank_00_model_states.pt   the same file (stage 3 reads this name)
    SAVE_DIR/<tag>_universal/zero/optimizer_state.pt  param_groups, step, ds_version, loss scaler, clip_grad
    SAVE_DIR/<tag>_universal/zero/<param>/fp32.pt     {"param": the fp32 master, full shape, "cat_dim": 0}
    SAVE_DIR/<tag>_universal/zero/<param>/<state>.pt  every per-element optimizer state (exp_avg, momentum_buffer...)
    SAVE_DIR/<tag>_universal/zero/<param>/step.pt     the group's step (a 0-d tensor), when the optimizer keeps one

Each parameter is gathered from the rank partitions that hold it and written before the next is read. Frozen
parameters and buffers are written too (``zero/<name>/fp32.pt``; integer buffers keep their dtype) so that
nothing of the run is lost, although DeepSpeed does not read them back.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .checkpoint import as_paths
from .checkpoint.deepspeed_universal import MODEL_STATES_NAMES, NOT_RESTORED, RESTORED
from .checkpoint.dcp_locate import locate_dcp
from .checkpoint.deepspeed_zero import DeepSpeedCheckpoint
from .checkpoint.readers import info_dict
from .checkpoint.torch_archive import StoredTensor
from .errors import CogExportError
from .lazy import LazyTensor
from .write.folder_plan import CopiedFile, FolderPlan, ObjectFile, TensorFile
from .write.io_engine import IOSettings
from .write.publish_plan import write_plan
from .write.ranks import current_ranks
from .write.staging import check_destination
from .write.value_watch import passed_on_note

UNIVERSAL_SUFFIX = "_universal"
LATEST_UNIVERSAL = "latest_universal"
# Keys of a ZeRO-1/2 optimizer file that the universal loader reads besides param_groups.
_GLOBAL_KEYS = ("loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad")


@dataclass
class UniversalResult:
    output: str
    latest_universal: str
    parameters: int
    optimizer_states: list[str]
    frozen: int
    buffers: int
    files: int
    total_bytes: int
    restored: str = RESTORED
    not_restored: str = NOT_RESTORED
    source: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _fp32(tensor: LazyTensor) -> LazyTensor:
    return tensor.to(torch.float32) if tensor.dtype.is_floating_point else tensor


def _param_file(path: str, tensor: LazyTensor, tensor_parallel: bool = False) -> TensorFile:
    """{"param": the tensor, "cat_dim": 0}, as DeepSpeed's ds_to_universal saves each parameter's state. A
    tensor-parallel (AutoTP) run's whole tensors go without cat_dim, as ds_to_universal writes them: the parameters'
    own AutoTP metadata says how a resumed run cuts them, and cat_dim 0 would misstate a row-parallel weight."""
    return TensorFile(path, {"param": tensor}, container="torch", extra={} if tensor_parallel else {"cat_dim": 0})


def _step_tensor(value: object) -> torch.Tensor | None:
    """The optimizer's step as DeepSpeed must get it back: a 0-d tensor (a Python number breaks torch's Adam)."""
    if isinstance(value, StoredTensor):
        return value.read()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value))
    return None


def planned_files(source: DeepSpeedCheckpoint) -> tuple[list[TensorFile], list[str], torch.Tensor | None]:
    """Every parameter's files of the universal folder (its master, optimizer states and step; frozen parameters and
    buffers too), the optimizer states' names and the step."""
    files: list[TensorFile] = []
    state_names: list[str] = []
    step = None
    tensor_parallel = bool(source.model_parallel)
    for group in source.groups:
        group_step = _step_tensor(group.scalars().get("step"))
        step = step if step is not None else group_step
        for name in group.layout.slots:
            files.append(_param_file(f"zero/{name}/fp32.pt", source[name], tensor_parallel))
            for state, tensor in source.optimizer_states(name).items():
                files.append(_param_file(f"zero/{name}/{state}.pt", _fp32(tensor), tensor_parallel))
                state_names += [state] if state not in state_names else []
            if group_step is not None:
                files.append(TensorFile(f"zero/{name}/step.pt", {"step": LazyTensor(
                    torch.Size([]), group_step.dtype, lambda value=group_step: value)}, container="torch", single=True))
    for name in [*source.info.frozen, *source.info.buffers]:
        files.append(_param_file(f"zero/{name}/fp32.pt", _fp32(source[name]), tensor_parallel))
    return files, state_names, step


def optimizer_state(source: DeepSpeedCheckpoint, step: torch.Tensor | None) -> dict:
    """zero/optimizer_state.pt with the keys every stage's loader reads, and nothing it does not."""
    saved = source.optimizer_state
    if source.facts.stage == 3:
        param_groups = saved["optimizer_state_dict"]["param_groups"]
    else:
        param_groups = saved["base_optimizer_state"]["param_groups"]
    state = {"param_groups": param_groups, "ds_version": source.facts.ds_version or saved.get("ds_version", "0.0.0"),
             "optimizer_state_dict": {"state": {0: {"step": step}} if step is not None else {0: {}},
                                      "param_groups": param_groups}}
    state.update({key: saved[key] for key in _GLOBAL_KEYS if key in saved})
    return state


def rank0_model_states(source: DeepSpeedCheckpoint) -> Path:
    """The model-states file the universal folder copies (ZeRO-3's rank 0 file when there is no shared one)."""
    return source.files.model_states or source.files.zero3_model_states[0]


def model_states_copies(source: DeepSpeedCheckpoint) -> list[CopiedFile]:
    """The model-states file of each model-parallel rank (one but under AutoTP) under both names DeepSpeed's loader
    reads, the second a hard link (a ZeRO-1/2 file holds the whole module)."""
    copies = []
    for mp_rank, part in enumerate([source, *source.model_parallel]):
        first, *others = [name.replace("mp_rank_00", f"mp_rank_{mp_rank:02d}") for name in MODEL_STATES_NAMES]
        copies.append(CopiedFile(first, rank0_model_states(part), tuple(others)))
    return copies


def _point_latest(folder: Path) -> Path:
    """Write SAVE_DIR/latest_universal = folder's name, replacing it in one step."""
    latest = folder.parent / LATEST_UNIVERSAL
    partial = folder.parent / f".{LATEST_UNIVERSAL}.cogexport-partial"
    partial.write_text(folder.name)
    os.replace(partial, latest)
    return latest


def universal(checkpoint: str | Path | Sequence[str | Path], output: str | Path | None = None, *,
              tag: str | None = None, overwrite: bool = False, progress: bool | None = None,
              workers: int | None = None, allow_nonfinite: bool = False) -> UniversalResult:
    """Write the universal checkpoint of ``checkpoint`` (default: next to its tag, as ``<tag>_universal``).
    ``workers``: threads loading tensors ahead of the writer (None: one per core); in a torchrun job
    (``write.ranks``) each rank writes its share of the files. A master or optimizer state holding NaN or infinite
    values is refused unless ``allow_nonfinite``."""
    paths = as_paths(checkpoint)
    if len(paths) == 1 and locate_dcp(paths[0], tag) is not None:
        raise CogExportError(f"{paths[0]} is a PyTorch distributed checkpoint (DCP), which loads at any world size "
                             "as it is; cogexport universal converts DeepSpeed ZeRO checkpoints")
    with DeepSpeedCheckpoint(paths, tag) as source:
        info, stage = source.info, source.facts.stage
        if stage not in (1, 2, 3) or not source.groups:
            raise CogExportError(f"{source.files.where} is not a ZeRO-1/2/3 checkpoint with optimizer files (stage "
                                 f"{stage}); a universal checkpoint is made from the optimizer's partitions, and "
                                 "DeepSpeed cannot resume stage 0 from one")
        model_states = rank0_model_states(source)
        destination = Path(output) if output else model_states.parent.parent / f"{info.tag}{UNIVERSAL_SUFFIX}"
        files, state_names, step = planned_files(source)
        copies = model_states_copies(source)
        folder = FolderPlan([*copies, ObjectFile("zero/optimizer_state.pt", optimizer_state(source, step)), *files])
        total = sum(_fp32_bytes(tensor) for planned in files for tensor in planned.tensors.values())
        # Only the rank files count as inputs here: the default output lies inside the save dir the user gave.
        passed_on = write_plan(folder, destination, IOSettings(workers=workers), "universal", progress,
                               needed_bytes=folder.total_bytes, allow_nonfinite=allow_nonfinite,
                               check=lambda: check_destination(destination, source.own_folders(), info.files,
                                                               overwrite))
        latest = current_ranks().from_leader(lambda: _point_latest(destination))
        return UniversalResult(str(destination), str(latest), len(info.trainable), state_names, len(info.frozen),
                               len(info.buffers), len(files) + 1 + 2 * len(copies), total, source=info_dict(info),
                               notes=list(filter(None, [passed_on_note(passed_on)])))


def _fp32_bytes(tensor: LazyTensor) -> int:
    """What the report counts for a tensor: its elements as fp32 (integer buffers in their own size)."""
    return tensor.numel * (4 if tensor.dtype.is_floating_point else tensor.dtype.itemsize)
