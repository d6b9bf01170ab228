"""The files people run on one consumer GPU, straight from any input cogexport reads (a LoRA run fused first):

- ``--to gguf --quant Q4_K_M``: one GGUF file of the transformer (one per expert, in the release's expert folders), in
  the original names and conventions ComfyUI-GGUF reads and Diffusers' GGUF loader converts;
- ``--to original --dtype fp8``: ComfyUI's scaled-fp8 safetensors of the transformer in its original names.

The parts are the way back's (original_parts.py): each tensor in original names as read, so quantization starts from
the training precision; what each family keeps in high precision is its data (key_maps/<family>/quantized.toml).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch

from ..precision import describe_written
from ..quantize import plan_gguf, quantization_policy
from ..write.folder_plan import FolderPlan, TensorFile, TextFile
from ..write.fp8_file import LEGACY_MARKER, plan_fp8
from ..write.gguf_file import GgufFile
from ..write.io_engine import default_workers
from .cards import quantized_card
from .inputs import ExportInputs
from .options import ExportOptions, check_options
from .original_parts import open_way_back, plan_way_back, release_folder
from .original_writers import OriginalPart
from .publish import publish
from .result import ExportResult
from .to_original import way_back_result

FP8_TYPES = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
_FP8_PARTS = ("weight", "weight_scale", "scale_weight", "comfy_quant")  # what a quantized layer writes


def _file_stem(part: OriginalPart) -> str:
    return part.variant.name if part.variant else part.family.name


def _in(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def export_gguf(checkpoint, output, options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer of ``checkpoint`` as a GGUF file of ``options.quant`` into the folder ``output``."""
    options = replace(options or ExportOptions(), **overrides)
    check_options(options, "gguf")
    with ExitStack() as stack:
        inputs = open_way_back(checkpoint, options, "transformer", stack)
        parts = plan_way_back(inputs, "transformer", options, refuse_original=False)
        folder, notes, counts = FolderPlan(), [], {}
        for part in parts:
            plan = plan_gguf(part.read_as, quantization_policy(part.family.key), options.quant)
            name = f"{_file_stem(part)}-{plan.preset.name}.gguf"
            folder.add(GgufFile(_in(release_folder(part, len(parts)), name), plan))
            notes += plan.notes
            counts = {t: counts.get(t, 0) + n for t, n in plan.type_counts().items()}
        precision = f"GGUF {options.quant.upper()}: " + ", ".join(f"{n} {t}" for t, n in counts.items())
        folder.add(TextFile("README.md", quantized_card(parts, folder, "GGUF", precision, notes, options,
                                                        inputs.source)))
        folder.check()
        if options.workers is None:  # quantizing is compute: a thread per core, the writer's share is small
            options = replace(options, workers=default_workers(writer_core=False))
        return _publish(folder, parts, "GGUF transformer", precision, notes, inputs, output, options)


def fp8_files(parts: list[OriginalPart], options: ExportOptions) -> tuple[FolderPlan, str]:
    """ComfyUI's scaled-fp8 file of each part: the family's fp8 layers quantized from the weights as read, the other
    tensors as the family's dtype policy casts them (the parts were planned in bf16)."""
    fp8_dtype = FP8_TYPES[options.dtype]
    folder, written, layers = FolderPlan(), {}, 0
    for part in parts:
        policy = quantization_policy(part.family.key)
        mixed = {name: part.read_as[name] if name.endswith(".weight") and policy.fp8_quantizes(name, tuple(t.shape))
                 else t for name, t in part.tensors.items()}
        plan = plan_fp8(mixed, policy, fp8_dtype=fp8_dtype, layout=options.fp8_layout)
        name = f"{_file_stem(part)}_{str(fp8_dtype).removeprefix('torch.float8_')}_scaled.safetensors"
        folder.add(TensorFile(_in(release_folder(part, len(parts)), name), plan.tensors, metadata=plan.metadata))
        quantized = {f"{layer}.{suffix}" for layer in plan.layers for suffix in _FP8_PARTS}
        written.update({n: t for n, t in plan.tensors.items()
                        if n not in quantized and n != LEGACY_MARKER and t.dtype != torch.uint8})
        layers += len(plan.layers)
    kind = str(fp8_dtype).removeprefix("torch.float8_")
    return folder, f"{layers} linear weights in fp8 {kind} with a per-tensor scale; the rest {describe_written(written)}"


def export_fp8(inputs: ExportInputs, output: Path, options: ExportOptions) -> ExportResult:
    """``--to original --dtype fp8``: the transformer as ComfyUI's scaled-fp8 safetensors."""
    parts = plan_way_back(inputs, "transformer", replace(options, dtype="bf16"), refuse_original=False)
    folder, precision = fp8_files(parts, options)
    folder.add(TextFile("README.md", quantized_card(parts, folder, "ComfyUI scaled fp8", precision, [], options,
                                                    inputs.source)))
    folder.check()
    return _publish(folder, parts, "scaled-fp8 transformer", precision, [], inputs, output, options)


def _publish(folder: FolderPlan, parts: list[OriginalPart], what: str, precision: str, notes: list[str],
             inputs: ExportInputs, output, options: ExportOptions) -> ExportResult:
    result = way_back_result(parts, folder, what, inputs, str(output), precision)
    result.notes += notes
    return publish(folder, result, Path(output), inputs, options)
