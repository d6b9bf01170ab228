"""``cogexport verify`` of a quantized output (a GGUF file, a scaled-fp8 file) against the checkpoint it was made from.

The checkpoint is read into the family's original names (its table, then the original table run backwards, as the
export did); every tensor of the file is compared with what the reference makes of the source tensor: the `gguf`
package's quantizers (llama.cpp's algorithm, in cogexport's port, for the K types), byte for byte; for fp8, the
reference cast times scale. The error of each tensor against the unquantized source (largest absolute difference,
RMS relative to the tensor's own RMS) is reported too: what the quantization cost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from .checkpoint import LazyCheckpoint, open_checkpoint
from .checkpoint.fp8_scaled import FP8_DTYPES, fp8_dequantized, is_scaled_fp8
from .errors import CogExportError
from .keymap.plan import plan_translation
from .keymap.table import load_table
from .lazy import LazyTensor
from .models.family import families
from .models.recognize import choose_table, expert_folders
from .quantize.check import TensorCheck, check_fp8, check_gguf


def quantized_files(output: Path) -> list[Path]:
    """The GGUF files of an output folder, else its scaled-fp8 safetensors files (empty for any other folder)."""
    if not output.is_dir():
        return []
    found = sorted(output.rglob("*.gguf"))
    if found:
        return found
    return [path for path in sorted(output.rglob("*.safetensors")) if _is_fp8_file(path)]


def _is_fp8_file(path: Path) -> bool:
    try:
        with open_checkpoint(path) as weights:
            return is_scaled_fp8(weights)
    except CogExportError:
        return False


def original_names(source: LazyCheckpoint, where: str) -> dict[str, LazyTensor]:
    """The checkpoint's transformer in its family's original names, as --to original / gguf name them."""
    family, table = choose_table(source, "transformer", "transformer", where)
    layout = family.transformer.original
    if layout is None:
        raise CogExportError(f"{family.name} has no original layout: {where} cannot be the source of a quantized file")
    diffusers = plan_translation(table, source, None, {}, what=where).tensors
    return plan_translation(load_table(layout.table).inverted(), diffusers, None, {}, what=where).tensors


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


def check_file(file: Path, source: Mapping[str, LazyTensor]) -> tuple[str, list[TensorCheck], list[str]]:
    """The file's kind and every tensor's check; names the file holds that the source lacks."""
    with open_checkpoint(file) as written:
        missing = [name for name in written if name not in source and not name.endswith(
            ("weight_scale", "scale_weight", "comfy_quant")) and name != "scaled_fp8"]
        if missing:
            return _kind(file, written), [], missing
        if file.suffix == ".gguf":
            return _kind(file, written), check_gguf(written, source), []
        fp8 = {name for name, tensor in written.items() if tensor.dtype in FP8_DTYPES}
        dtype = written[next(iter(fp8))].dtype
        return _kind(file, written), check_fp8(fp8_dequantized(written), fp8, source, dtype), []


def _kind(file: Path, written: LazyCheckpoint) -> str:
    if file.suffix == ".gguf":
        counts = ", ".join(f"{count} {kind}" for kind, count in written.type_counts().items())
        return f"GGUF ({counts})"
    return "scaled fp8"
