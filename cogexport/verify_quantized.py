"""``cogexport verify`` of quantized files (what the GGUF and ComfyUI formats share) against the checkpoint each was
made from.

The checkpoint is read into the family's original names (its table, then the original table run backwards, as the
export did); every tensor of the file is compared, by the format's own check (quantize/check.py), with what the
reference makes of the source tensor, byte for byte: the `gguf` package's quantizers (llama.cpp's algorithm, in
cogexport's port, for the K types); for ComfyUI's formats, each format's quantizer (quantize/comfy_quant.py). The error
of each tensor against the unquantized source (largest absolute difference, RMS relative to the tensor's own RMS) is
reported too: what the quantization cost.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Mapping

from .checkpoint import LazyCheckpoint, open_checkpoint
from .errors import CogExportError
from .keymap.plan import plan_translation
from .keymap.table import load_table
from .lazy import LazyTensor
from .models.family import families
from .models.recognize import choose_table, expert_folders, lora_key
from .quantize.check import TensorCheck
from .verify import VerifyReport, VerifyRequest


def original_names(source: LazyCheckpoint, where: str) -> dict[str, LazyTensor]:
    """The checkpoint's transformer in its family's original names, as --to original / gguf name them."""
    family, table = choose_table(source, "transformer", "transformer", where)
    layout = family.transformer.original
    written = _quantized_layout(family) or (layout.table if layout else None)
    if written is None:
        raise CogExportError(f"{family.name} has no original layout: {where} cannot be the source of a quantized file")
    diffusers = plan_translation(table, source, None, {}, what=where).tensors
    return plan_translation(load_table(written).inverted(), diffusers, None, {}, what=where).tensors


def _way_back_names(file: Path, output: Path, request: VerifyRequest, stack: ExitStack) -> dict[str, LazyTensor]:
    """The model as the export's way back planned it, in original names (a LoRA run fused, with --base's weights when
    the run saved none; the tensors a layout keeps beside its Diffusers folder or computes from the config added): the
    part of the expert whose folder holds ``file``."""
    from .exporter.original_parts import release_folder
    from .verify_original import planned_way_back

    parts = planned_way_back(request, stack, refuse_original=False, layout_of=_quantized_layout)
    folder = file.parent.relative_to(output).as_posix()
    for part in parts:
        if release_folder(part, len(parts)) == ("" if folder == "." else folder):
            return part.read_as
    raise CogExportError(f"{file} sits where no expert of {', '.join(map(str, request.against))} is written")


def _quantized_layout(family) -> str | None:
    from .exporter.way_back import quantized_layout
    from .quantize import quantizable_families

    return quantized_layout(family) if family.key in quantizable_families() else None


def _adds_tensors_beside(source: LazyCheckpoint, where: str) -> bool:
    """Whether the family's way back adds tensors its Diffusers class has no place for (kept beside the Diffusers
    folder, or computed from the config: Cosmos's RoPE tables and training counters), which only the way back's own
    plan holds."""
    family, _ = choose_table(source, "transformer", "transformer", where)
    layout = family.transformer.original
    return layout is not None and any(drop.keep for drop in load_table(layout.table).drops)


def source_of(file: Path, output: Path, against: list[Path]) -> list[Path]:
    """Which checkpoint a file was made from: when the file sits in an expert's folder of the output (a release's
    high_noise_model/), that expert of ``against`` (the release's same folder, or a pipeline's component), else
    ``against`` itself."""
    folder = file.parent.relative_to(output).parts[:1]
    if not folder:
        return against
    experts = expert_folders(against)
    matching = [path for path in experts.values() if path.name == folder[0]]
    if not experts and len(against) == 1 and (against[0] / "model_index.json").is_file():
        matching = [against[0] / component for component in _components_of_expert_folder(folder[0])]
    if not matching:
        raise CogExportError(f"{file} sits in {folder[0]}/, which is no expert of {against[0]}")
    return matching[:1]


def _components_of_expert_folder(name: str) -> list[str]:
    """The pipeline component a release's expert folder (high_noise_model) becomes, in any family."""
    return [component for family in families() for variant in family.variants
            for component, folder in variant.experts.items() if folder == name]


# A format's check of one file: every tensor's verdict, or the names the file holds that the source lacks (then no
# verdicts: the file was not made from this source).
FileCheck = tuple[list[TensorCheck], list[str]]


def verify_quantized_files(files: list[Path], output: Path, request: VerifyRequest,
                           check: Callable[[LazyCheckpoint, Mapping[str, LazyTensor]], FileCheck],
                           kind: Callable[[LazyCheckpoint], str]) -> list[VerifyReport]:
    """Each quantized file of ``output`` against its source: ``check`` compares the opened file with the source in
    original names (the format's own check), ``kind`` names what the file holds."""
    request.refuse_vae_against(output, "holds quantized files")
    return [_verify_file(file, output, request, check, kind) for file in files]


def _verify_file(file: Path, output: Path, request: VerifyRequest, check, kind) -> VerifyReport:
    sources = source_of(file, output, request.against)
    where = ", ".join(map(str, sources))
    with request.choice.open(sources) as source, ExitStack() as stack:
        if lora_key(list(source)) is not None or _adds_tensors_beside(source, where):
            original = _way_back_names(file, output, request, stack)
        else:
            original = original_names(source, where)
        with open_checkpoint(file) as written:
            what, (checks, missing), stored = kind(written), check(written, original), len(written)
    # counted as the export counts them: the tensors the file stores (a quantized layer's scales too), each exact
    # when the layer it belongs to is; the format's markers (ComfyUI's L.comfy_quant, scaled_fp8) are what the check
    # read each layer's format from, exact when every layer is
    markers = stored - sum(each.stored for each in checks)
    exact = sum(each.stored for each in checks if each.exact)
    report = VerifyReport(str(file), what, kind="quantized file", tensors=stored,
                          exact=exact + (markers if not missing and all(each.exact for each in checks) else 0),
                          reference=", ".join(sorted({each.judge for each in checks})) or "none")
    report.mismatches = [f"{name} is in the file but not in {where}" for name in missing[:20]]
    report.mismatches += [f"{each.name} ({each.type}) is not what {each.judge} makes of the source"
                          for each in checks if not each.exact]
    report.errors = [{"name": c.name, "type": c.type, "max_error": c.max_error, "rms_relative": c.rms_relative}
                     for c in checks]
    return report
