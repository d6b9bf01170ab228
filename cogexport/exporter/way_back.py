"""What the exports into a family's original names share (--to original, gguf, comfyui): where an expert's file goes,
the refusal of a family a quantized format has no policy for, and the result they report."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..checkpoint.readers import info_dict
from ..errors import CogExportError
from ..models.family import ModelFamily, families
from ..quantize import QuantizationPolicy, quantizable_families, quantization_policy
from ..write.folder_plan import FolderPlan
from .inputs import ExportInputs
from .options import ExportOptions
from .original_writers import OriginalPart
from .publish import publish
from .result import ExportResult


def file_stem(part: OriginalPart) -> str:
    """What a quantized file of the part is named after: the published variant it is, else its family as a custom
    size (a custom size named after the variant whose layout it has would claim to be that published model)."""
    if part.variant is not None and part.published:
        return part.variant.name
    return f"{part.family.name.replace(' ', '-')}-custom-size"


def in_folder(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def quantized_family_check(files: str, refusal: Callable[[QuantizationPolicy], str] = lambda policy: ""):
    """The check (original_parts.FamilyCheck) that the family's quantized.toml says how to write ``files`` ("GGUF
    files"): a family without one, or whose file gives a ``refusal`` (why no such file is written), is refused as soon
    as its checkpoint is recognised, in words naming why, the families that have them and what the family's model
    can be exported to instead."""
    def writes(key: str) -> bool:
        return key in quantizable_families() and not refusal(quantization_policy(key))

    def check(family: ModelFamily, where: str) -> None:
        if writes(family.key):
            return
        why = refusal(quantization_policy(family.key)) if family.key in quantizable_families() else ""
        supported = ", ".join(other.name for other in families() if writes(other.key))
        instead = "a Diffusers folder (drop --to)" + (" or its original layout (--to original)"
                                                        if family.transformer.originals else "")
        raise CogExportError(f"{where} is a {family.name} model: cogexport writes no {files} of {family.name} models "
                             + (f"({why}; " if why else "(") + f"only of {supported}); export it to {instead}")
    return check


def quantized_layout(family: ModelFamily) -> str | None:
    """The table a family's quantized files hold its transformer in, where its quantized.toml names one (the
    original_parts.LayoutChoice of --to gguf and --to comfyui)."""
    return quantization_policy(family.key).layout or None


def way_back_result(parts: list[OriginalPart], folder: FolderPlan, what: str, inputs: ExportInputs, output: str,
                    precision: str, notes: list[str] = ()) -> ExportResult:
    source = next(iter(inputs.sources.values()))
    return ExportResult(output, what, parts[0].label, folder.written_paths, folder.tensors, folder.total_bytes,
                        precision, family=parts[0].family.name, source=info_dict(source.info),
                        notes=[*source.info.notes, *inputs.notes_of_others(),
                               *(note for part in parts for note in part.notes), *notes])


def publish_way_back(folder: FolderPlan, parts: list[OriginalPart], what: str, precision: str, notes: list[str],
                     inputs: ExportInputs, output, options: ExportOptions) -> ExportResult:
    """Check the planned folder, then write and publish it, reporting ``what`` was written."""
    folder.check()
    result = way_back_result(parts, folder, what, inputs, str(output), precision, notes)
    return publish(folder, result, Path(output), inputs, options)
