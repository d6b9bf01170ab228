"""``verify`` of an original layout (``--to original``'s output): each written file against the model it was made from.

1. Consistency: the export is planned again from ``--against`` (and ``--base``, for a LoRA run's fused model) as
   ``--to original`` planned it, and every tensor of the written file is compared with its source in original names,
   bit-exact where the dtype was kept, equal to the same cast otherwise.
2. A second opinion where Diffusers ships a single-file converter for the layout (the table's ``judge``): the
   converter turns the written file back into Diffusers names, and every tensor it makes must be the Diffusers model
   the file was made from. A wrong rule in cogexport's table writes a name the converter reads as another weight, so
   this check is independent of the table (the consistency check, which runs the same table, would pass).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Mapping

from .checkpoint import LazyCheckpoint, open_checkpoint
from .errors import CogExportError
from .keymap.table import KeyMapTable, load_table
from .lazy import LazyTensor
from .models.family import families
from .models.recognize import lora_key, preferred_tables
from .models.release_root import ReleaseRoot, release_root
from .verify import VerifyReport, VerifyRequest, compare, same
from .verify_fused import refuse_adapter_alone


def verify_original_output(output: Path, request: VerifyRequest) -> list[VerifyReport] | None:
    """The reports of an original layout's files (one per expert), or None when ``output`` holds none."""
    root = release_root([output])
    if root is not None:
        return _verify_release_folder(root, request)
    folders = _written_folders(output)
    if not folders:
        return None
    request.refuse_vae_against(output, "holds an original layout")
    from .exporter.original_parts import release_folder

    with ExitStack() as stack:
        parts = planned_way_back(request, stack, beside=True)
        reports = []
        for part in parts:
            folder = output / release_folder(part, len(parts))
            if folder not in folders:
                raise CogExportError(f"{folder} holds no {part.family.name} original layout, which "
                                     f"{', '.join(map(str, request.against))} makes: verify the output made from it")
            reports.append(_verify_part(folder, part, request))
    return reports


def _verify_release_folder(root: ReleaseRoot, request: VerifyRequest) -> list[VerifyReport]:
    """A release folder of partitions written whole (--to original of a pipeline folder): each model's files, in each
    partition holding them, against the model planned again from the pipeline folder as --to original planned it."""
    from .exporter.options import ExportOptions
    from .exporter.original_parts import destinations, open_way_back, plan_way_back

    request.refuse_vae_against(root.path, "holds an original layout")
    options = ExportOptions(base=request.base, dtype="fp32", tag=request.choice.tag, ema=request.choice.ema,
                            role=request.choice.role)
    with ExitStack() as stack:
        inputs = open_way_back(request.against, options, "transformer", stack, whole_release=True)
        if inputs.release_family is None:
            raise CogExportError(f"{root.path} is a {root.family.name} release folder: give --against the pipeline "
                                 "folder it was written from")
        parts = plan_way_back(inputs, "transformer", options)
        reports = []
        for part in parts:
            for where, written, _ in destinations(part, inputs, len(parts), options.max_shard_size):
                if not (root.path / where).is_dir():
                    raise CogExportError(f"{root.path / where} is missing: {', '.join(map(str, request.against))} "
                                         "makes it; verify the release folder written from it")
                reports.append(_verify_part(root.path / where, written, request))
    return reports


def planned_way_back(request: VerifyRequest, stack: ExitStack, beside: bool = False,
                     refuse_original: bool = True, layout_of=None) -> list:
    """The transformer's parts (one per expert) as --to original plans them from the request's source (a LoRA run
    fused, with --base's weights when it saved none), opened on ``stack``; with ``beside``, the pipeline's other
    models a release file holds too. Read at fp32: a widening cast keeps every source value, so each written dtype
    is judged as a cast of it. ``refuse_original``: a source already in the original layout is refused (as --to
    original refuses it; the quantized formats take it); ``layout_of``: the format's choice of the table written
    (original_parts.LayoutChoice)."""
    from .exporter.options import ExportOptions
    from .exporter.original_parts import add_components_beside, open_way_back, plan_way_back
    from .exporter.original_writers import WRITES_BESIDE

    options = ExportOptions(base=request.base, dtype="fp32", tag=request.choice.tag, ema=request.choice.ema,
                            role=request.choice.role)
    inputs = open_way_back(request.against, options, "transformer", stack)
    for name, source in inputs.sources.items():
        if lora_key(list(source)) is not None:
            refuse_adapter_alone(source, inputs.where_of(name), request)
    parts = plan_way_back(inputs, "transformer", options, refuse_original=refuse_original, layout_of=layout_of)
    if beside and parts[0].layout.writer in WRITES_BESIDE:  # the release's file holds the pipeline's other models
        add_components_beside(parts[0], options, inputs)
    return parts


def _written_folders(output: Path) -> list[Path]:
    """The output's folders (itself, or each expert's subfolder) whose weights carry a transformer's original names."""
    if not output.is_dir() or (output / "model_index.json").is_file():
        return []
    candidates = [output, *sorted(path for path in output.iterdir() if path.is_dir())]
    return [folder for folder in candidates if _holds_original_names(folder)]


def _original_tables() -> list:
    return [(family, layout.table) for family in families() for layout in family.transformer.originals]


def _holds_original_names(folder: Path) -> bool:
    """Unquantized weights in a transformer's original names (GGUF and ComfyUI's quantized files have such names too:
    their own formats check them)."""
    from .checkpoint.comfy_quant import is_comfy_quantized

    if any(folder.glob("*.gguf")):
        return False
    try:
        with open_checkpoint(folder) as written:
            names = list(written)  # a LoRA in original module names (ComfyUI's, kohya's) is an adapter's output
            return bool(preferred_tables(names, _original_tables())) and lora_key(names) is None and \
                not is_comfy_quantized(written, written.info.header_metadata)
    except CogExportError:  # nothing there any reader reads: not this format's output
        return False


def _verify_part(folder: Path, part, request: VerifyRequest) -> VerifyReport:
    """One written file (or a SAT / sharded folder) against the part planned again from the source."""
    expected = {**{part.layout.prefix + name: tensor for name, tensor in part.read_as.items()}, **part.beside}
    report = VerifyReport(str(folder), f"{part.family.name} original layout ({part.layout.table})",
                          kind="original layout")
    with open_checkpoint(folder) as written:
        compare(written, expected, report)
        _ask_converter(load_table(part.layout.table), written, part.diffusers, report, request.judge_limit,
                       part.config)
    return report


def _ask_converter(table: KeyMapTable, written: LazyCheckpoint, came_from: Mapping[str, LazyTensor],
                   report: VerifyReport, judge_limit: int, config: Mapping | None = None) -> None:
    """Diffusers' converter of this layout, given the written file: it must make the Diffusers model it came from."""
    from .verify_models import judge_converts, why_no_judge

    reason = why_no_judge(table, written, judge_limit)
    if reason:
        report.judge_note = reason
        return
    selected, _ = table.select(written)
    try:
        converted = judge_converts(table, {n: written[o].load() for n, o in selected.items()}, config)
    except Exception as error:  # the judge's own failure is a finding, not a crash of ours
        report.judge_mismatches.append(f"Diffusers' {table.judge} fails on the written file: {type(error).__name__}: "
                                       f"{error}")
        return
    report.judge = table.judge
    for name in sorted(set(came_from) ^ set(converted)):
        where = "makes" if name in converted else "does not make"
        report.judge_mismatches.append(f"Diffusers' {table.judge} {where} {name} from the written file")
    for name in sorted(set(came_from) & set(converted)):
        have = converted[name]
        if same(LazyTensor(have.shape, have.dtype, lambda t=have: t, name), came_from[name].load()) is None:
            report.judge_mismatches.append(f"{name}: Diffusers' {table.judge} reads the written file as another "
                                           "value than the model it came from")
        else:
            report.judged += 1
