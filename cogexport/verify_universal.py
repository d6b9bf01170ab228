"""``verify`` of a DeepSpeed universal checkpoint (``cogexport universal``'s output) against the ZeRO checkpoint it was
made from.

The universal folder is planned again from the ZeRO checkpoint (universal.py's plan: each parameter's fp32 master and
optimizer states gathered from the rank partitions, each group's step, frozen parameters and buffers) and every file
of the folder is read back with cogexport's own torch.save reader and compared, tensor by tensor: the same dtype and
bit for bit. The model-states files must be the source's rank-0 file byte for byte (each model-parallel rank's, under
AutoTP), and zero/optimizer_state.pt must
carry the source's param_groups. A parameter folder the plan does not make, or a planned file the folder lacks, is a
mismatch.

No second opinion: DeepSpeed's own converters (ds_to_universal, zero_to_fp32) unpickle the checkpoint
(``torch.load(weights_only=False)``), which cogexport never does with a user's files. cogexport's test suite checks
``universal`` against ds_to_universal's output and resumes its output under real DeepSpeed.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import torch

from .checkpoint.deepspeed_zero import DeepSpeedCheckpoint
from .checkpoint.torch_archive import StoredTensor, load_torch_file
from .lazy import LazyTensor
from .verify import VerifyReport, VerifyRequest, same
from .write.folder_plan import TensorFile

NO_JUDGE = ("DeepSpeed's own converters (ds_to_universal, zero_to_fp32) unpickle the checkpoint, which cogexport never "
            "does with your files; cogexport's tests check `universal` against ds_to_universal and resume its output "
            "under real DeepSpeed")


def is_universal_folder(output: Path) -> bool:
    return (output / "zero" / "optimizer_state.pt").is_file()


def verify_universal(output: Path, request: VerifyRequest) -> list[VerifyReport] | None:
    """The report of a universal checkpoint folder, or None for any other folder."""
    if not is_universal_folder(output):
        return None
    request.refuse_vae_against(output, "is a DeepSpeed universal checkpoint")
    from .universal import model_states_copies, optimizer_state, planned_files

    with DeepSpeedCheckpoint(request.against, request.choice.tag) as source:
        facts = source.facts
        report = VerifyReport(str(output), f"DeepSpeed universal checkpoint of ZeRO-{facts.stage} tag "
                                           f"{source.info.tag}", kind="universal checkpoint", judge_note=NO_JUDGE)
        files, _, step = planned_files(source)
        _compare_files(output, files, report)
        for copy in model_states_copies(source):  # one per model-parallel rank (several under AutoTP)
            for name in (copy.path, *copy.links):
                if not (output / name).is_file() or not filecmp.cmp(output / name, copy.source, shallow=False):
                    report.mismatches.append(f"{name} is not {copy.source} byte for byte")
        archive, saved = load_torch_file(output / "zero" / "optimizer_state.pt")
        archive.close()
        if not isinstance(saved, dict) or saved.get("param_groups") != optimizer_state(source, step)["param_groups"]:
            report.mismatches.append("zero/optimizer_state.pt does not carry the checkpoint's param_groups")
    return [report]


def _compare_files(output: Path, files: list[TensorFile], report: VerifyReport) -> None:
    """Every planned file read back and compared; parameter folders the plan does not make named."""
    planned_folders = {Path(file.path).parent.name for file in files}
    for folder in sorted(path.name for path in (output / "zero").iterdir() if path.is_dir()):
        if folder not in planned_folders:
            report.mismatches.append(f"zero/{folder} is in the folder but not in the checkpoint")
    for file in files:
        path = output / file.path
        if not path.is_file():
            report.mismatches.append(f"{file.path} is missing from the folder")
            continue
        archive, tree = load_torch_file(path)
        try:
            for key, want in file.tensors.items():
                stored = tree if file.single else tree.get(key) if isinstance(tree, dict) else None
                report.tensors += 1
                verdict = _same_stored(stored, want.load())
                if verdict is None:
                    report.mismatches.append(f"{file.path}: {key} differs from the checkpoint's")
                else:
                    setattr(report, verdict, getattr(report, verdict) + 1)
        finally:
            archive.close()


def _same_stored(stored, want: torch.Tensor) -> str | None:
    """"exact" when the stored tensor is the planned one with its dtype, bit for bit (the plan has cast it already)."""
    if not isinstance(stored, StoredTensor) or stored.dtype != want.dtype:
        return None
    verdict = same(LazyTensor(torch.Size(stored.shape), stored.dtype, stored.read, "stored"), want)
    return verdict if verdict == "exact" else None
