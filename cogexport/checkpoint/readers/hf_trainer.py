"""The Hugging Face Trainer reader: a ``transformers.Trainer`` step folder saved under DeepSpeed, ``checkpoint-N/``,
where DeepSpeed's save (``latest``, ``global_stepN/``, ``zero_to_fp32.py``) lies beside the Trainer's own files
(``trainer_state.json``, ``training_args.bin``, ``rng_state_R.pth``, ``scheduler.pt``) and its copy of the weights.

The weights read are DeepSpeed's: the fp32 masters of that step (deepspeed_zero.py reads them). The Trainer's copy
(``model.safetensors``: the step's weights in the training dtype, or for ZeRO-3 without the 16-bit gather, from some
versions, empty placeholders; a Diffusers-based trainer's ``save_pretrained`` copy) is the dispatcher's copy rule's to
judge (copies.py): it is loose weights inside this checkpoint's folder, set aside with a note, never read. The
checkpoint answers ``--tag`` by its folder's name (``checkpoint-2``) and by DeepSpeed's tag (``global_step2``), from
the run folder or from itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..deepspeed_zero import DeepSpeedCheckpoint, DeepSpeedFacts
from ..locate import list_tags
from .deepspeed import DEEPSPEED, deepspeed_claims
from .deepspeed import describe as describe_deepspeed
from .reader import Claim, FolderScan, OpenOptions, Reader

TRAINER_STATE = "trainer_state.json"  # the Trainer's mark on a step folder: its state at that step
# The Trainer's files beside the weights: its state, arguments, RNG states (one per rank), scheduler, scaler.
TRAINER_FILES = re.compile(r"^(trainer_state\.json|training_args\.bin|rng_state(_\d+)?\.pth|scheduler\.pt|"
                           r"scaler\.pt)$")


def trainer_step(folder: Path) -> tuple[int | None, str]:
    """trainer_state.json's global step, and a note when it cannot be read (it holds no weights: reading goes on)."""
    try:
        step = json.loads((folder / TRAINER_STATE).read_text()).get("global_step")
    except (OSError, ValueError, AttributeError) as error:
        return None, f"{folder / TRAINER_STATE} cannot be read ({error}); it holds the Trainer's state, not weights"
    return (step, "") if isinstance(step, int) and not isinstance(step, bool) else (None, "")


class TrainerCheckpoint(DeepSpeedCheckpoint):
    """DeepSpeed's save inside a Trainer's step folder (its facts are DeepSpeed's), with a note saying what was read
    and whether the Trainer's state agrees."""

    def __init__(self, folder: Path, options: OpenOptions) -> None:
        super().__init__([folder], options.tag, strict=options.strict, entry=options.entry or "module")
        step, unreadable = trainer_step(folder)
        self.info.format = HF_TRAINER.format
        read = f"read DeepSpeed's {self.info.weights_source or 'weights'} of {self.files.tag}, the weights of the " \
            f"Hugging Face Trainer's {folder.name}"
        self.info.notes.append(read + (f" ({TRAINER_STATE}: global step {step})" if step is not None else ""))
        if unreadable:
            self.info.notes.append(unreadable)
        if step is not None and self.files.tag != f"global_step{step}":
            self.info.notes.append(f"{TRAINER_STATE} records global step {step}, but DeepSpeed's tag read is "
                                   f"{self.files.tag}: the two were not saved together")


def trainer_claims(scan: FolderScan) -> list[Claim]:
    """A folder holding trainer_state.json and a DeepSpeed save is one Trainer checkpoint, claimed whole."""
    folder = scan.folder
    if not (folder / TRAINER_STATE).is_file():
        return []
    deepspeed = [claim for claim in deepspeed_claims(scan) if claim.whole_folder]
    if not deepspeed:
        return []
    covers = deepspeed[0].covers | {path for path in scan.entries if TRAINER_FILES.match(path.name)}
    return [Claim(HF_TRAINER, folder, lambda options: TrainerCheckpoint(folder, options), whole_folder=True,
                  covers=covers, also_named=tuple(list_tags(folder)))]


def describe(facts: DeepSpeedFacts) -> str:
    return f"Hugging Face Trainer checkpoint (DeepSpeed's save beside the Trainer's state): {describe_deepspeed(facts)}"


HF_TRAINER = Reader(
    name="Hugging Face Trainer", format="hf-trainer", what="the Hugging Face Trainer checkpoint",
    looks_for="a Hugging Face Trainer checkpoint-N folder (trainer_state.json beside DeepSpeed's 'latest' and "
              "global_stepN)",
    claims=trainer_claims, describe=describe, facts=DeepSpeedFacts, whole_folders=True, supersedes=("DeepSpeed",),
    not_weights=(TRAINER_FILES,), own_tags=True,
    data_check=DEEPSPEED.data_check)  # DeepSpeed's save inside, read by the DeepSpeed reader's code
