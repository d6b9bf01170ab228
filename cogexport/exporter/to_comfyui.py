"""``--to comfyui --quant fp8``: ComfyUI's quantized safetensors of the transformer in its original names (one per
expert, in the release's expert folders), straight from any input cogexport reads (a LoRA run fused first): the
family's fp8 layers (key_maps/<family>/quantized.toml) quantized from the weights as read, with a per-tensor scale, the
other tensors cast by the family's dtype policy. ``--to original --dtype fp8`` is the same format's older spelling.

``inspect`` reads such a file back as the weights it stands for (each fp8 weight times its scale); ``verify`` compares
every tensor with the reference cast of its source.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch

from ..errors import CogExportError
from ..precision import describe_written
from ..quantize import quantization_policy
from ..write.folder_plan import FolderPlan, TensorFile, TextFile
from ..write.fp8_file import LAYOUTS, LEGACY_MARKER, plan_fp8
from .cards import QuantizedCard, quantized_card
from .options import ExportOptions, checked_format
from .original_parts import open_way_back, plan_way_back, release_folder
from .original_writers import OriginalPart
from .output_formats import OutputFormat, ReadBack
from .result import ExportResult
from .way_back import file_stem, in_folder, publish_way_back

FP8_TYPES = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}  # --quant -> the float8 type
_FP8_PARTS = ("weight", "weight_scale", "scale_weight", "comfy_quant")  # what a quantized layer writes
_LAYOUT_DEFAULT = "comfy_quant"


def export_comfyui(checkpoint, output, options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer of ``checkpoint`` as ComfyUI's quantized safetensors of ``options.quant``."""
    _, options = checked_format(replace(options or ExportOptions(), **overrides), "comfyui")
    with ExitStack() as stack:
        inputs = open_way_back(checkpoint, options, "transformer", stack)
        parts = plan_way_back(inputs, "transformer", options, refuse_original=False)
        folder, precision = _files(parts, options)
        card = QuantizedCard("ComfyUI scaled fp8", "fp8", precision, [], _usage(folder))
        folder.add(TextFile("README.md", quantized_card(parts, card, options, inputs.source)))
        return publish_way_back(folder, parts, "scaled-fp8 transformer", precision, [], inputs, output, options)


def _files(parts: list[OriginalPart], options: ExportOptions) -> tuple[FolderPlan, str]:
    """The scaled-fp8 file of each part: the family's fp8 layers quantized from the weights as read, the other
    tensors as the family's dtype policy casts them."""
    fp8_dtype = FP8_TYPES[options.quant.lower()]
    kind = str(fp8_dtype).removeprefix("torch.float8_")
    folder, written, layers = FolderPlan(), {}, 0
    for part in parts:
        policy = quantization_policy(part.family.key)
        mixed = {name: part.read_as[name] if name.endswith(".weight") and policy.fp8_quantizes(name, tuple(t.shape))
                 else t for name, t in part.tensors.items()}
        plan = plan_fp8(mixed, policy, fp8_dtype=fp8_dtype, layout=options.fp8_layout or _LAYOUT_DEFAULT)
        name = f"{file_stem(part)}_{kind}_scaled.safetensors"
        folder.add(TensorFile(in_folder(release_folder(part, len(parts)), name), plan.tensors,
                              metadata=plan.metadata))
        quantized = {f"{layer}.{suffix}" for layer in plan.layers for suffix in _FP8_PARTS}
        written.update({n: t for n, t in plan.tensors.items()
                        if n not in quantized and n != LEGACY_MARKER and t.dtype != torch.uint8})
        layers += len(plan.layers)
    return folder, f"{layers} linear weights in fp8 {kind} with a per-tensor scale; the rest {describe_written(written)}"


def _usage(folder: FolderPlan) -> str:
    files = [planned.path for planned in folder.files if not planned.path.endswith(".md")]
    return f"# ComfyUI: put {', '.join(files)} in models/diffusion_models and load it with Load Diffusion Model"


def _spelled_as(to: str, options: ExportOptions) -> ExportOptions | None:
    """``--to original --dtype fp8`` (or fp8_e5m2): this format, the rest of the file in the family's bf16."""
    if options.dtype not in FP8_TYPES:
        return None
    if to != "original":
        raise CogExportError(f"--dtype {options.dtype} writes ComfyUI's scaled-fp8 file of the original layout; give "
                             f"--to original (or --to comfyui --quant {options.dtype})")
    if options.quant is not None:
        raise CogExportError(f"--dtype {options.dtype} is the quantization already; give --to comfyui --quant "
                             f"{options.dtype} instead of both")
    return replace(options, quant=options.dtype, dtype="bf16")


def _check(options: ExportOptions) -> None:
    if options.fp8_layout is not None and options.fp8_layout not in LAYOUTS:
        raise CogExportError(f"--fp8-layout {options.fp8_layout!r} is not one of {', '.join(LAYOUTS)}")


def _reads_back(checkpoint) -> ReadBack | None:
    """A scaled-fp8 file stands for its weights dequantized (weight x scale)."""
    from ..checkpoint.fp8_scaled import FP8_DTYPES, fp8_dequantized, is_scaled_fp8

    if not is_scaled_fp8(checkpoint):
        return None
    fp8 = [name for name, tensor in checkpoint.items() if tensor.dtype in FP8_DTYPES]
    note = (f"scaled fp8: {len(fp8)} weights in {checkpoint[fp8[0]].dtype} with a per-tensor scale (each dequantizes "
            "as weight x scale: about 2 significant decimal digits per value)")
    return ReadBack([note], fp8_dequantized(checkpoint))


def _verify(output: Path, request):
    """Every scaled-fp8 file of the output, against the reference cast of its source."""
    from ..verify_quantized import is_fp8_file, verify_quantized_files

    files = [path for path in sorted(output.rglob("*.safetensors")) if is_fp8_file(path)] if output.is_dir() else []
    return verify_quantized_files(files, output, request, _check_file, lambda written: "scaled fp8") if files else None


def _check_file(written, source):
    from ..checkpoint.fp8_scaled import FP8_DTYPES, fp8_dequantized
    from ..quantize.check import check_fp8

    weights = fp8_dequantized(written)
    missing = [name for name in weights if name not in source]
    if missing:
        return [], missing
    fp8 = {name for name, tensor in written.items() if tensor.dtype in FP8_DTYPES}
    return check_fp8(weights, fp8, source, written[next(iter(fp8))].dtype), []


FORMAT = OutputFormat(
    name="comfyui",
    title="ComfyUI's quantized safetensors of the transformer (--quant fp8 or fp8_e5m2, scaled per tensor)",
    writes="transformer",
    export=export_comfyui,
    takes=frozenset({"quant", "fp8_layout"}),
    quantizations=tuple(FP8_TYPES),
    check=_check,
    spelled_as=_spelled_as,
    verify=_verify,
    reads_back=_reads_back,
)
