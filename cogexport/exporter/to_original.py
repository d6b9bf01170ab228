"""The way back (``--to original``): Diffusers weights of a family's transformer (or another component) written in the
family's original layout, by running the same key-map table backwards: the files the family's own repository and
ComfyUI load (each family's layouts: key_maps/<family>/family.toml, ``original``). A LoRA run is fused first.

open (a save_pretrained folder, a pipeline's models, a training checkpoint in Diffusers names, a LoRA run with
--lora fuse) -> check it against the Diffusers model it claims to be -> cast (the family's dtype policy, decided on
the Diffusers names) -> the original table inverted (original_parts.py) -> plan the files (original_writers.py) ->
publish.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from ..checkpoint.readers import info_dict
from ..models.family import component_title
from ..precision import describe_written
from ..write.folder_plan import FolderPlan
from .inputs import ExportInputs
from .options import FP8_DTYPES, ExportOptions, check_options
from .original_parts import add_components_beside, open_way_back, plan_way_back, release_folder
from .original_writers import OriginalPart, original_files
from .publish import publish
from .result import ExportResult


def export_original(checkpoint, output, options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer (or with component="vae" ... another component) of ``checkpoint`` (Diffusers names)
    into ``output`` in its family's original layout."""
    options = replace(options or ExportOptions(), **overrides)
    check_options(options, "original")
    component, output = options.component or "transformer", Path(output)
    with ExitStack() as stack:
        inputs = open_way_back(checkpoint, options, component, stack)
        if options.dtype in FP8_DTYPES:
            from .to_quantized import export_fp8

            return export_fp8(inputs, output, options)
        parts = plan_way_back(inputs, component, options)
        if component == "transformer" and parts[0].layout.writer == "single_file":
            add_components_beside(parts[0], options, inputs)
        folder = FolderPlan()
        for part in parts:
            folder.add(*original_files(release_folder(part, len(parts)), part, options.max_shard_size))
        folder.check()
        return publish(folder, _result(parts, folder, component, inputs, str(output)), output, inputs, options)


def way_back_result(parts: list[OriginalPart], folder: FolderPlan, what: str, inputs: ExportInputs, output: str,
                    precision: str) -> ExportResult:
    source = next(iter(inputs.sources.values()))
    return ExportResult(output, what, parts[0].label, folder.written_paths, folder.tensors, folder.total_bytes,
                        precision, family=parts[0].family.name, source=info_dict(source.info),
                        notes=[*source.info.notes, *(note for part in parts for note in part.notes)])


def _result(parts: list[OriginalPart], folder: FolderPlan, component: str, inputs: ExportInputs,
            output: str) -> ExportResult:
    first = parts[0]
    what = component_title(component) if component != "transformer" else \
        " and ".join(component_title(name) for name in ("transformer", *first.beside_components))
    written = {name: tensor for part in parts for name, tensor in {**part.prefixed(), **part.beside}.items()}
    return way_back_result(parts, folder, f"original {what}", inputs, output, describe_written(written))
