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

from ..models.family import component_title
from ..precision import describe_written
from ..write.folder_plan import FolderPlan, TextFile
from .cards import original_card
from .options import ExportOptions, checked_format
from .original_parts import add_components_beside, destinations, open_way_back, plan_way_back
from .original_writers import WRITES_BESIDE, OriginalPart, original_files
from .output_formats import OutputFormat
from .result import ExportResult
from .way_back import publish_way_back


def export_original(checkpoint, output, options: ExportOptions | None = None, **overrides) -> ExportResult:
    """Write the transformer (or with component="vae" ... another component) of ``checkpoint`` (Diffusers names)
    into ``output`` in its family's original layout (or the format the options spell with it: dtype="fp8" is
    ComfyUI's scaled fp8)."""
    fmt, options = checked_format(replace(options or ExportOptions(), **overrides), "original")
    if fmt is not FORMAT:
        return fmt.export(checkpoint, output, options)
    component, output = options.component or "transformer", Path(output)
    with ExitStack() as stack:
        inputs = open_way_back(checkpoint, options, component, stack, whole_release=True)
        parts = plan_way_back(inputs, component, options)
        if component == "transformer" and parts[0].layout.writer in WRITES_BESIDE:
            add_components_beside(parts[0], options, inputs)
        folder = FolderPlan()
        for part in parts:
            for where, written, shard_size in destinations(part, inputs, len(parts), options.max_shard_size):
                folder.add(*original_files(where, written, shard_size))
        precision = _precision(parts)
        source = next(iter(inputs.sources.values()))  # the model's checkpoint (a VAE's, with --component vae)
        folder.add(TextFile("README.md", original_card(parts, folder.written_paths, precision, options, source)))
        what = f"original {_what(parts, component)}"
        if inputs.release_family is not None:  # the release folder of partitions, written whole
            partitions = sorted({path.split("/")[0] + "/" for path in folder.written_paths if "/" in path})
            what = f"release folder ({', '.join(partitions)})"
        return publish_way_back(folder, parts, what, precision, [], inputs, output, options)


def _what(parts: list[OriginalPart], component: str) -> str:
    if component != "transformer":
        return component_title(component)
    return " and ".join(component_title(name) for name in ("transformer", *parts[0].beside_components))


def _precision(parts: list[OriginalPart]) -> str:
    """The dtypes as written; the models a release keeps beside the transformer in its file (LTX's VAEs, under
    their prefixes) each said apart, so that a VAE in fp32 beside a bf16 transformer is one phrase, not a list of
    every one of its tensors as exceptions to the transformer's dtype."""
    written = {name: tensor for part in parts for name, tensor in part.prefixed().items()}
    beside: dict[str, dict] = {}
    for name, tensor in (item for part in parts for item in part.beside.items()):
        beside.setdefault(name.split(".")[0], {})[name] = tensor
    if not beside:
        return describe_written(written)
    return "; ".join([f"transformer: {describe_written(written)}",
                      *(f"{prefix}: {describe_written(tensors)}" for prefix, tensors in beside.items())])


def _verify(output: Path, request):
    """The output's files in the original layout, against the model planned again from the source."""
    from ..verify_original import verify_original_output

    return verify_original_output(output, request)


FORMAT = OutputFormat(
    name="original",
    title="the family's original layout (the files its own repository and ComfyUI load)",
    writes="model",
    export=export_original,
    verify=_verify,
)
