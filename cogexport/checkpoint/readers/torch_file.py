"""The torch.save reader: weights saved loose with ``torch.save`` (a state dict at the top level or under an entry such
as ``state_dict``, ``module`` or ``ema``), in a folder or given alone under any name. Reading is
torch_state_dict.py's."""

from __future__ import annotations

import re

from ..model_folder import ModelFolderWeights, model_folder_weights
from ..torch_state_dict import TorchStateDictCheckpoint
from .reader import Claim, FolderScan, Reader

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
# Training state trainers save beside the weights (accelerate, HF Trainer, diffusers scripts): never weights.
TRAINING_STATE = re.compile(r"^(optimizer|scheduler|lr_scheduler|sampler|scaler|random_states|rng_state|"
                            r"custom_checkpoint|training_args|trainer_state).*(\.pt|\.pth|\.bin|\.ckpt)$")


def torch_file_claims(scan: FolderScan) -> list[Claim]:
    """torch.save weights lying loose: not another reader's file, not training state, not the older ``.bin`` copy of
    weights claimed beside it (pytorch_model.bin beside model.safetensors)."""
    model = model_folder_weights(scan.folder, scan.entries, scan.is_not_weights)
    if model is not None and model.kind == "bin" and len(model.chosen) == 1 and \
            not any(claim.whole_folder for claim in scan.earlier):
        return [_model_folder_claim(model)]
    covered = scan.covered()
    beside_weights = any(not claim.whole_folder and not claim.companion for claim in scan.earlier)
    claims = []
    for file in scan.files(*TORCH_SUFFIXES):
        if file in covered or scan.is_not_weights(file.name):
            continue
        if beside_weights and file.suffix == ".bin" and "pytorch_model" in file.name:
            continue
        claims.append(Claim(TORCH_FILE, file, lambda options, file=file: TorchStateDictCheckpoint(file, options.entry),
                            covers={file}))
    return claims


def _model_folder_claim(model: ModelFolderWeights) -> Claim:
    """A Diffusers model folder whose weights are diffusion_pytorch_model.bin (model_folder.py): that file, and every
    other weight file beside it left alone, named in a note."""
    file, note = model.chosen[0], model.stray_note()
    return Claim(TORCH_FILE, file, lambda options: TorchStateDictCheckpoint(file, options.entry),
                 covers={file, *model.forms, *model.strays}, notes=[note] if note else [])


TORCH_FILE = Reader(
    name="torch.save", format="torch", what="torch.save weights",
    looks_for=f"torch.save weights ({', '.join('*' + s for s in TORCH_SUFFIXES)})",
    claims=torch_file_claims, describe=lambda facts: "torch.save state dict", not_weights=(TRAINING_STATE,),
    open_file=lambda path, options: TorchStateDictCheckpoint(path, options.entry), any_file=True, takes_entry=True,
    data_check="every record's CRC-32")
