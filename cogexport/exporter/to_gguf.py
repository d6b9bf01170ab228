"""``--to gguf --quant Q4_K_M``: one GGUF file of the transformer (one per expert, in the release's expert folders),
straight from any input cogexport reads (a LoRA run fused first), in the original names and conventions ComfyUI-GGUF
reads and Diffusers' GGUF loader converts.

The parts are the way back's (original_parts.py): each tensor in original names as read, so quantization starts from
the training precision; what each family keeps in high precision is its data (key_maps/<family>/quantized.toml).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from ..quantize import PRESETS, plan_gguf, quantization_policy
from ..quantize.policy import PolicyError
from ..write.folder_plan import FolderPlan, TextFile
from ..write.gguf_file import GgufFile
from ..write.io_engine import default_workers
from ..write.read_ahead import DEFAULT_AHEAD, ReadAhead
from .cards import QuantizedCard, quantized_card
from .options import ExportOptions, checked_format
from .original_parts import open_way_back, plan_way_back, release_folder
from .original_writers import OriginalPart
from .output_formats import OutputFormat
from .result import ExportResult
from .way_back import file_stem, in_folder, publish_way_back, quantized_family_check, quantized_layout

CONFIG_FOLDER = "config"  # beside a custom size's file: the Diffusers config its loader builds the model from


def export_gguf(checkpoint, output, options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer of ``checkpoint`` as a GGUF file of ``options.quant`` into the folder ``output``."""
    _, options = checked_format(replace(options or ExportOptions(), **overrides), "gguf")
    if options.workers is None:  # quantizing is compute: a worker per core, the writer's share is small
        options = replace(options, workers=default_workers(writer_core=False))
    from ..quantize.threads import quantizing_pool  # GGUF jobs only: no other start's cost

    with ExitStack() as stack:
        processes = stack.enter_context(quantizing_pool(options.workers))
        # with workers, the next tensors are read while these are quantized (--workers 1: one thread, in turn)
        reading = stack.enter_context(ReadAhead(DEFAULT_AHEAD if options.workers > 1 else 0))
        inputs = open_way_back(checkpoint, options, "transformer", stack)
        parts = plan_way_back(inputs, "transformer", options, refuse_original=False,
                              family_check=quantized_family_check("GGUF files"), layout_of=quantized_layout)
        folder, notes, counts, files = FolderPlan(), [], {}, {}
        for part in parts:
            policy = quantization_policy(part.family.key)
            plan = plan_gguf(part.read_as, policy, options.quant, _release_strings(part, policy))
            name = f"{file_stem(part)}-{plan.preset.name}.gguf"
            files[part.component] = in_folder(release_folder(part, len(parts)), name)
            folder.add(GgufFile(files[part.component], plan, processes, reading))
            if not part.published:  # no published model has its shapes: its loader's config goes beside the file
                folder.add(TextFile(in_folder(release_folder(part, len(parts)), f"{CONFIG_FOLDER}/config.json"),
                                    part.config_json))
            notes += plan.notes + _fallback_note(plan, notes)
            counts = {t: counts.get(t, 0) + n for t, n in plan.type_counts().items()}
        precision = f"GGUF {options.quant.upper()}: " + ", ".join(f"{n} {t}" for t, n in counts.items())
        card = QuantizedCard("GGUF", "gguf", precision, notes, _usage(parts, files, options))
        folder.add(TextFile("README.md", quantized_card(parts, card, options, inputs.source,
                                                        trained=any(part.fused for part in parts))))
        return publish_way_back(folder, parts, "GGUF transformer", precision, notes + _no_loader_note(parts), inputs,
                                output, options)


def _fallback_note(plan, notes: list[str]) -> tuple[str, ...]:
    """Once a job: the K types quantized without the compiled quantizer (an install without a C compiler)."""
    from ..quantize import kernel

    uses_k_types = any(tensor.type.name in kernel.K_TYPES for tensor in plan.tensors)
    return (kernel.MISSING_NOTE,) if uses_k_types and not kernel.available() and kernel.MISSING_NOTE not in notes \
        else ()


def _no_loader_note(parts: list[OriginalPart]) -> list[str]:
    """A family no GGUF loader reads (its quantized.toml's loaders empty) gets its file all the same, in the
    conventions of the others, for the tools that read any GGUF file: the run says so (the card's usage does too)."""
    family = parts[0].family
    policy = quantization_policy(family.key)
    if policy.gguf_loaders:
        return []
    return [f"no GGUF loader (ComfyUI-GGUF, Diffusers) reads {family.name} GGUF files today: this file (architecture "
            f"{policy.architecture!r}, cogexport's own name) is for tools that read GGUF generically (the gguf "
            "package, third-party nodes)"]


def _release_strings(part: OriginalPart, policy) -> dict[str, str]:
    """The keys of the original release's header metadata the family's GGUF files hold (LTX-2's config, which
    ComfyUI's model detection reads), made as ``--to original`` makes them."""
    if not policy.release_metadata:
        return {}
    metadata = part.family.shapes.original_metadata(part.config, part.task, part.beside_configs)
    missing = [key for key in policy.release_metadata if key not in metadata]
    if missing:
        raise PolicyError(f"{policy.family}/quantized.toml: [gguf] release_metadata names {missing[0]!r}, which the "
                          f"{part.family.name} release's metadata does not hold")
    return {key: metadata[key] for key in policy.release_metadata}


def _usage(parts: list[OriginalPart], files: dict[str, str], options: ExportOptions) -> str:
    """How the family's loaders (Diffusers, ComfyUI-GGUF) load each file: Diffusers with the config of the model the
    file holds, the published model's on the Hub, else the one written beside the file."""
    where = options.push_to_hub or "path/to/this/folder"
    model = parts[0].family.transformer.class_name
    loaders = quantization_policy(parts[0].family.key).gguf_loaders
    usage = []
    if "Diffusers" in loaders:
        usage.append(f"import torch\nfrom diffusers import GGUFQuantizationConfig, {model}\n")
        for part in parts:
            config, subfolder = (part.variant.hub_id, part.component) if part.published else \
                (where, in_folder(release_folder(part, len(parts)), CONFIG_FOLDER))
            usage.append(f"{part.component} = {model}.from_single_file(\n"
                         f"    \"{where}/{files[part.component]}\", config=\"{config}\", subfolder=\"{subfolder}\",\n"
                         "    quantization_config=GGUFQuantizationConfig(compute_dtype=torch.bfloat16), "
                         "dtype=torch.bfloat16)")
    if "ComfyUI-GGUF" in loaders:
        usage.append("# in ComfyUI: put the file in models/unet and load it with ComfyUI-GGUF's Unet Loader (GGUF)")
    if not loaders:  # no loader of its own: the tensors in the original names, as any GGUF reader gives them
        usage.append("# no GGUF loader reads this family's files: the gguf package reads their tensors (original "
                     "names)\nimport gguf\nimport torch\n")
        for part in parts:
            usage.append(f"reader = gguf.GGUFReader(\"{where}/{files[part.component]}\")\n"
                         "weights = {t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type))"
                         ".reshape(tuple(reversed(t.shape.tolist()))) for t in reader.tensors}")
    return "\n".join(usage)


def _verify(output: Path, request):
    """Every GGUF file of the output, against the reference quantizers applied to its source."""
    from ..verify_quantized import verify_quantized_files

    files = sorted(output.rglob("*.gguf")) if output.is_dir() else []
    return verify_quantized_files(files, output, request, _check_file, _kind) if files else None


def _check_file(written, source):
    from ..quantize.check import check_gguf

    missing = [name for name in written if name not in source]
    return ([] if missing else check_gguf(written, source)), missing


def _kind(written) -> str:
    return "GGUF (" + ", ".join(f"{count} {kind}" for kind, count in written.type_counts().items()) + ")"


FORMAT = OutputFormat(
    name="gguf",
    title="a GGUF file of the transformer (--quant) for ComfyUI-GGUF and Diffusers (or generic GGUF readers)",
    writes="transformer",
    export=export_gguf,
    takes=frozenset({"quant"}),
    quantizations=tuple(PRESETS),
    verify=_verify,
)
