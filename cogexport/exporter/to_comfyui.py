"""``--to comfyui --quant fp8|fp8_e5m2|nvfp4|mxfp8|int8``: ComfyUI's quantized safetensors of the transformer in its
original names (one per expert, in the release's expert folders), straight from any input cogexport reads (a LoRA run
fused first): the family's quantized layers (key_maps/<family>/quantized.toml) quantized from the weights as read in
the chosen format (quantize/comfy_quant.py lists them), the other tensors cast by the family's dtype policy.
``--to original --dtype fp8`` is the scaled-fp8 file's older spelling.

``inspect`` reads such a file back as the weights it stands for (each quantized layer dequantized as ComfyUI does);
``verify`` compares every tensor the file stores with what the format's quantizer makes of its source.
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path


from ..errors import CogExportError
from ..precision import describe_written
from ..quantize import quantization_policy
from ..quantize.comfy_quant import ComfyQuantization, comfy_quantization, comfy_quantizations
from ..write.comfy_quant_file import check_layout, plan_comfy_quant
from ..write.folder_plan import FolderPlan, TensorFile, TextFile
from .cards import QuantizedCard, quantized_card
from .options import ExportOptions, checked_format
from .original_parts import open_way_back, plan_way_back, release_folder
from .original_writers import OriginalPart
from .output_formats import OutputFormat, ReadBack
from .result import ExportResult
from .way_back import file_stem, in_folder, publish_way_back, quantized_family_check, quantized_layout

FP8_SPELLINGS = ("fp8", "fp8_e5m2")  # the --dtype values --to original takes for this format's scaled fp8
_LAYOUT_DEFAULT = "comfy_quant"


def export_comfyui(checkpoint, output, options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer of ``checkpoint`` as ComfyUI's quantized safetensors of ``options.quant``."""
    _, options = checked_format(replace(options or ExportOptions(), **overrides), "comfyui")
    quantization = comfy_quantization(options.quant)
    with ExitStack() as stack:
        inputs = open_way_back(checkpoint, options, "transformer", stack)
        parts = plan_way_back(inputs, "transformer", options, refuse_original=False,
                              family_check=quantized_family_check("ComfyUI quantized files", _refusal),
                              layout_of=quantized_layout)
        folder, precision, notes = _files(parts, options, quantization)
        card = QuantizedCard(f"ComfyUI {quantization.format}", quantization.name, precision, notes, _usage(folder))
        folder.add(TextFile("README.md", quantized_card(parts, card, options, inputs.source,
                                                        trained=any(part.fused for part in parts))))
        return publish_way_back(folder, parts, f"ComfyUI {quantization.format} transformer", precision, notes,
                                inputs, output, options)


def _refusal(policy) -> str:
    """Why the family gets no ComfyUI quantized file (its quantized.toml's [fp8] refused): no ComfyUI model of it
    whose names are established, so none is written on a guess."""
    return policy.fp8_refused


def _files(parts: list[OriginalPart], options: ExportOptions,
           quantization: ComfyQuantization) -> tuple[FolderPlan, str, list[str]]:
    """The quantized file of each part: the family's quantized layers from the weights as read, the other tensors as
    the family's dtype policy casts them."""
    folder, written, layers, notes = FolderPlan(), {}, 0, []
    for part in parts:
        plan = plan_comfy_quant(part.tensors, quantization_policy(part.family.key), quantization,
                                layout=options.fp8_layout or _LAYOUT_DEFAULT, sources=part.read_as)
        name = f"{file_stem(part)}_{quantization.file_tag}.safetensors"
        folder.add(TensorFile(in_folder(release_folder(part, len(parts)), name), plan.tensors,
                              metadata=plan.metadata))
        quantized = {f"{layer}.weight" for layer in plan.layers}
        written.update({n: t for n, t in part.tensors.items() if n not in quantized})
        layers, notes = layers + len(plan.layers), notes + list(plan.notes)
    return folder, f"{layers} linear weights in {quantization.summary}; the rest {describe_written(written)}", notes


def _usage(folder: FolderPlan) -> str:
    files = [planned.path for planned in folder.files if not planned.path.endswith(".md")]
    return f"# ComfyUI: put {', '.join(files)} in models/diffusion_models and load it with Load Diffusion Model"


def _spelled_as(to: str, options: ExportOptions) -> ExportOptions | None:
    """``--to original --dtype fp8`` (or fp8_e5m2): this format, the rest of the file in the family's bf16."""
    if options.dtype not in FP8_SPELLINGS:
        return None
    if to != "original":
        raise CogExportError(f"--dtype {options.dtype} writes ComfyUI's scaled-fp8 file of the original layout; give "
                             f"--to original (or --to comfyui --quant {options.dtype})")
    if options.quant is not None:
        raise CogExportError(f"--dtype {options.dtype} is the quantization already; give --to comfyui --quant "
                             f"{options.dtype} instead of both")
    return replace(options, quant=options.dtype, dtype="bf16")


def _check(options: ExportOptions) -> None:
    if options.fp8_layout is not None:
        check_layout(comfy_quantization(options.quant), options.fp8_layout)


def _reads_back(checkpoint) -> ReadBack | None:
    """A ComfyUI quantized file stands for its weights dequantized as ComfyUI dequantizes them."""
    from ..checkpoint.comfy_quant import dequantized, quantized_layers

    layers = quantized_layers(checkpoint, checkpoint.info.header_metadata)
    if not layers:
        return None
    counts = Counter(quantization for quantization in layers.values())
    notes = [_read_back_note(quantization, count) for quantization, count in counts.items()]
    return ReadBack(notes, dequantized(checkpoint, checkpoint.info.header_metadata))


def _read_back_note(quantization: ComfyQuantization, count: int) -> str:
    if quantization.name in FP8_SPELLINGS:
        return (f"scaled fp8: {count} weights in {quantization.format} with a per-tensor scale (each dequantizes as "
                "weight x scale: about 2 significant decimal digits per value)")
    return f"ComfyUI {quantization.name}: {count} weights in {quantization.summary} (dequantized as ComfyUI does)"


def _verify(output: Path, request):
    """Every ComfyUI quantized file of the output, against its source quantized by the file's formats."""
    from ..verify_quantized import verify_quantized_files

    files = [path for path in sorted(output.rglob("*.safetensors")) if _is_quantized_file(path)] \
        if output.is_dir() else []
    return verify_quantized_files(files, output, request, _check_file, _kind) if files else None


def _is_quantized_file(path: Path) -> bool:
    from ..checkpoint import open_checkpoint
    from ..checkpoint.comfy_quant import is_comfy_quantized

    try:
        with open_checkpoint(path) as weights:
            return is_comfy_quantized(weights, weights.info.header_metadata)
    except CogExportError:
        return False


def _kind(written) -> str:
    from ..checkpoint.comfy_quant import quantized_layers

    formats = sorted({q.format for q in quantized_layers(written, written.info.header_metadata).values()})
    return "ComfyUI " + ", ".join(formats)


def _check_file(written, source):
    from ..checkpoint.comfy_quant import dequantized, quantized_layers
    from ..quantize.check import check_comfy_quant

    metadata = written.info.header_metadata
    weights = dequantized(written, metadata)
    missing = [name for name in weights if name not in source]
    if missing:
        return [], missing
    return check_comfy_quant(quantized_layers(written, metadata), written, weights, source), []


FORMAT = OutputFormat(
    name="comfyui",
    title="ComfyUI's quantized safetensors of the transformer (--quant: scaled fp8, nvfp4, mxfp8 or int8)",
    writes="transformer",
    export=export_comfyui,
    takes=frozenset({"quant", "fp8_layout"}),
    quantizations=tuple(quantization.name for quantization in comfy_quantizations()),
    check=_check,
    spelled_as=_spelled_as,
    verify=_verify,
    reads_back=_reads_back,
)
