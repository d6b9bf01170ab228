"""What the exports into a family's original names share (--to original, gguf, comfyui): where an expert's file goes,
and the result they report."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint.readers import info_dict
from ..write.folder_plan import FolderPlan
from .inputs import ExportInputs
from .options import ExportOptions
from .original_writers import OriginalPart
from .publish import publish
from .result import ExportResult


def file_stem(part: OriginalPart) -> str:
    """What a quantized file of the part is named after: its published variant, else its family."""
    return part.variant.name if part.variant else part.family.name


def in_folder(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


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
