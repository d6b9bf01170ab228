"""A checkpoint's copy inside its own folder, and DeepSpeed ZeRO-3's empty placeholders (dispatch.py states the rules).

Trainers leave the weights a second time inside a checkpoint's folder: ``accelerate merge-weights`` into checkpoint-N,
the Hugging Face Trainer's ``model.safetensors`` beside DeepSpeed's save (the step's weights in the training dtype), a
Diffusers-based trainer's ``save_pretrained`` copy. The only loose weights inside a checkpoint's folder are a possible
copy of that checkpoint (``possible_copies``), never a candidate of their own. Once the checkpoint is open,
``judge_copy`` says what the copy is: the same tensors (names and shapes, in any dtype; a tied alias may be left
out), or the same names with ZeRO-3's empty placeholders where DeepSpeed had partitioned the tensors (no weights at
all); anything else is a second set of weights.

ZeRO-3 keeps no data in a module's parameters between forward passes: each holds a 0-element tensor of shape [0].
Saving the module's own state dict without ``stage3_gather_16bit_weights_on_model_save`` writes these placeholders (for
every parameter, or for those above DeepSpeed's persistence threshold, which it keeps whole), and such a file is never
read as a model (``refuse_placeholders``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from ..errors import CogExportError, quoted
from ..lazy import LazyTensor
from .base import LazyCheckpoint
from .deepspeed_zero import DTYPE_NAMES
from .readers import Claim, OpenOptions

PLACEHOLDER_SHAPE = torch.Size([0])  # what ZeRO-3 leaves in a partitioned parameter, whatever its real shape
GATHER_OPTION = "stage3_gather_16bit_weights_on_model_save"


def placeholders(tensors: Mapping[str, LazyTensor]) -> list[str]:
    """The names whose tensor is an empty ZeRO-3 placeholder (floating point, shape [0])."""
    return [name for name, tensor in tensors.items()
            if tensor.shape == PLACEHOLDER_SHAPE and tensor.dtype.is_floating_point]


def refuse_placeholders(checkpoint: LazyCheckpoint, strict: bool) -> None:
    """Placeholders are no weights: reading them as a model would write empty tensors. Refused (``strict``), else a
    problem of the checkpoint (``inspect``)."""
    names = placeholders(checkpoint)
    if not names:
        return
    files = checkpoint.info.files
    where = files[0] if len(files) == 1 else ", ".join(checkpoint.info.paths)
    problem = (f"{where} holds DeepSpeed ZeRO-3's empty placeholders, not weights: {len(names)} of its "
               f"{len(checkpoint)} tensors have shape [0] ({quoted(names[0])} first), as a module saved under ZeRO-3 "
               f"without {GATHER_OPTION} holds them; read that step's DeepSpeed save instead (the checkpoint folder "
               "with its global_stepN)")
    if strict:
        raise CogExportError(problem)
    checkpoint.info.problems.append(problem)


def possible_copies(candidates: list[Claim]) -> dict[Claim, Claim]:
    """Each checkpoint claimed whole and the only loose weights inside its folder that may be its copy (of a reader
    whose loose weights may be one); where a folder holds several, none is (they stay candidates)."""
    found = {}
    for original in (claim for claim in candidates if claim.whole_folder):
        inside = [claim for claim in candidates if claim.reader.may_be_a_copy and not claim.whole_folder
                  and original.path in (claim.path, claim.path.parent)]
        if len(inside) == 1:
            found[original] = inside[0]
    return found


class NotACopy(CogExportError):
    """Loose weights inside a checkpoint's folder that are not its copy (two sets of weights): the message says why."""


def judge_copy(checkpoint: LazyCheckpoint, copy: Claim, shown: str) -> str:
    """The note saying what ``copy`` (``shown`` as the user would name it) is of the opened ``checkpoint``. NotACopy
    when it is not its copy (other names or shapes), or may not be (unreadable: nothing says it is one)."""
    try:
        with copy.open(OpenOptions(strict=False)) as opened:
            copied = {name: (tensor.shape, tensor.dtype) for name, tensor in opened.items()}
    except CogExportError as error:
        raise NotACopy(f"it cannot be read: {error}") from None
    if not len(checkpoint):
        return f"{shown} beside it was not compared with it (it cannot be read whole): not read"
    own = {name: (tensor.shape, tensor.dtype) for name, tensor in checkpoint.items()
           if name in copied or name not in checkpoint.info.tied}  # safetensors keeps a tied weight once
    _check_same_names(own, copied)
    holes = [name for name, (shape, _) in copied.items() if shape == PLACEHOLDER_SHAPE != own[name][0]]
    differing = [name for name, (shape, _) in copied.items() if shape != own[name][0] and name not in holes]
    if differing:
        name = differing[0]
        raise NotACopy(f"its {quoted(name)} has shape {list(copied[name][0])}, the checkpoint's {list(own[name][0])}")
    if holes:
        return (f"{shown} beside it holds the same names with ZeRO-3's empty placeholders for {len(holes)} of its "
                f"{len(copied)} tensors (shape [0]: saved without {GATHER_OPTION}): no weights, not read")
    return f"{shown} beside it holds the same tensors (names and shapes): {_kind_of_copy(own, copied)}, not read; " \
        "point at it to read it instead"


def _check_same_names(own: dict, copied: dict) -> None:
    if copied.keys() == own.keys():
        return
    missing, extra = [n for n in own if n not in copied], [n for n in copied if n not in own]
    first = f"it lacks {quoted(missing[0])}" if missing else \
        f"it holds {quoted(extra[0])}, which the checkpoint does not"
    raise NotACopy(f"other tensor names: {first} ({len(missing)} missing, {len(extra)} more)")


def _kind_of_copy(own: dict, copied: dict) -> str:
    """A copy in a narrower dtype (the Trainer's 16-bit copy of fp32 masters) is a lower-precision copy."""
    floating = [name for name, (_, dtype) in copied.items()
                if dtype.is_floating_point and own[name][1].is_floating_point]
    sizes = [(copied[name][1].itemsize, own[name][1].itemsize) for name in floating]  # (the copy's, the checkpoint's)
    if sizes and all(copy <= original for copy, original in sizes) and any(copy < original for copy, original in sizes):
        dtypes = sorted({DTYPE_NAMES.get(copied[name][1], str(copied[name][1])) for name in floating})
        return f"a lower-precision copy ({', '.join(dtypes)})"
    return "a consolidated copy"


def shown_copy(copy: Claim, root: Path) -> str:
    """The copy as the user would name it: its file, from the folder given when it lies below it."""
    file = copy.main_file()
    return str(file.relative_to(root)) if file.is_relative_to(root) else str(file)
