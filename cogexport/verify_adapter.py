"""``verify`` of a LoRA adapter folder (the adapter format's check): the adapter written there, in whatever layout,
read back, has the run's modules, A and B, ranks and alphas, so the strength its loader applies is the trained one."""

from __future__ import annotations

from pathlib import Path

from .checkpoint import open_checkpoint
from .lora import read_adapter
from .models.base_folder import open_base
from .verify import VerifyReport, VerifyRequest, is_pipeline, same, source_folders


def verify_adapter_folder(output: Path, request: VerifyRequest) -> list[VerifyReport] | None:
    """The report of an adapter folder (safetensors weights, no model config); None for any other folder."""
    if (output / "config.json").is_file() or is_pipeline(output) or not any(output.glob("*.safetensors")):
        return None
    request.refuse_vae_against(output, "is a LoRA adapter folder")
    return [_verify_adapter(output, request)]


def _verify_adapter(folder: Path, request: VerifyRequest) -> VerifyReport:
    sources = request.against
    where = ", ".join(map(str, sources))
    with request.choice.open(sources) as source, open_checkpoint(folder) as written_file:
        # names several families' models share say the family only with --base, as for the export
        base = open_base(request.base) if request.base is not None else None
        family, counts = (base.family, base.counts()) if base is not None else (None, None)
        trained = read_adapter(source, where, None, source_folders(sources), source.info.header_metadata, family,
                               counts)
        # the folder's names may fit another family too (Diffusers names CogVideoX and LTX-Video share): it holds
        # the run's family's adapter
        written = read_adapter(written_file, str(folder), None, [folder], written_file.info.header_metadata,
                               trained.family, counts)
        report = VerifyReport(str(folder), f"{written.table.format.title} LoRA adapter", kind="LoRA adapter")
        for name in sorted(set(trained.modules) - set(written.modules)):
            report.mismatches.append(f"{name}: the run adapts it, the folder does not")
        for name in sorted(set(written.modules) - set(trained.modules)):
            report.mismatches.append(f"{name}: the folder adapts it, the run does not")
        strengths_kept = True
        for name in sorted(set(trained.modules) & set(written.modules)):
            want, have = trained.modules[name], written.modules[name]
            if want.scale(trained.use_rslora) != have.scale(written.use_rslora):
                strengths_kept = False
                report.mismatches.append(f"{name}: applied at {have.scale(written.use_rslora):g}, the run's strength is "
                                         f"{want.scale(trained.use_rslora):g} (alpha {want.alpha:g}, rank {want.rank})")
            for part, tensor in want.parts.items():
                report.tensors += 1
                kind = same(have.parts[part], tensor.load()) if part in have.parts else None
                if kind is None:
                    report.mismatches.append(f"{name}.{part}: differs from the run's")
                else:
                    setattr(report, kind, getattr(report, kind) + 1)
        # counted as the export counts them: every tensor of the file; those beside the compared parts hold the
        # strength (.alpha), which is exact when every module's strength is the run's
        beside = max(len(written_file) - report.tensors, 0)
        report.tensors = len(written_file)
        report.exact += beside if strengths_kept and not report.mismatches else 0
    report.judge_note = "LoRA adapters have no Diffusers converter to compare with here; load it with " \
                        "load_lora_weights to check it applies"
    return report
