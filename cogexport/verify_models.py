"""``verify`` of Diffusers model and pipeline folders (the Diffusers format's check): each model folder against the
checkpoint it was exported from.

Three checks, reported separately:
1. Consistency: the translation is planned again from the checkpoint with cogexport's own key map (and the config the
   folder carries); every written tensor is read back and compared with its source, bit-exact where the dtype was
   kept, equal to the same cast of the source otherwise. This proves the folder holds what the plan says, cast as
   declared. It cannot catch a wrong rule in the key map: the plan uses the same table the export did.
2. A second opinion where one exists: when Diffusers ships its own converter for the source layout (its single-file
   converters), the source is converted by Diffusers' code and every written tensor is compared with that result.
   This is independent of cogexport's tables. It holds the converted model in memory, so it is skipped for sources
   larger than the request's ``judge_limit`` bytes, and for checkpoints of other sizes than the converter hard-codes
   (the table's ``judge_when``); the report says which.
3. Diffusers loads the folder (``from_pretrained``, strictly: no missing or unexpected keys).

A fused model (a LoRA run merged) is checked against W + (alpha / r) B A of the run's weights, or of --base's when
the run saved the adapter alone, and PEFT's own merge gives the second opinion (verify_fused.py).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Mapping

from .checkpoint.safetensors_files import SafetensorsCheckpoint
from .errors import CogExportError
from .keymap.plan import plan_translation
from .keymap.table import KeyMapTable
from .lazy import LazyTensor
from .lora import plan_fused
from .lora.formats import FORMATS
from .models.base_folder import read_json
from .models.family import (DEFAULT_TRANSFORMER_FOLDER, all_transformer_folders, family_of_class,
                             model_class)
from .models.recognize import choose_table, component_tables, expert_folders, fitting_tables, lora_key
from .models.release_root import release_root
from .models.target import build_target
from .verify import SourceChoice, VerifyReport, VerifyRequest, compare, is_pipeline, same
from .verify_fused import fused_inputs, judge_with_peft
from .write.diffusers_folders import variant_of

# verify's advice when the checkpoint's names are another model's than the folder's config.json describes
NOT_ITS_SOURCE = ("the folder's config.json describes another model: give --against the checkpoint this folder was "
                  "exported from")


def verify_model_folders(output: Path, request: VerifyRequest) -> list[VerifyReport] | None:
    """The reports of a Diffusers model folder or pipeline folder; None for any other folder."""
    if not is_pipeline(output) and (not (output / "config.json").is_file() or _foreign_config(output)):
        return None
    return [_verify_folder(folder, sources, request) for folder, sources in _model_checks(output, request)]


def _foreign_config(folder: Path) -> bool:
    """A config.json of no Diffusers model cogexport writes (an original layout's, WanModel's): another format's."""
    return family_of_class(read_json(folder / "config.json").get("_class_name")) is None


def _model_checks(output: Path, request: VerifyRequest) -> list[tuple[Path, list[Path]]]:
    """Each model folder of the output and the checkpoint it was exported from."""
    against = request.against
    if (output / "config.json").is_file():
        request.refuse_vae_against(output, "is a model folder")
        return [(output, against)]
    root = release_root(against)  # a release folder of partitions: each model against the file it was read from
    if root is not None:
        models = {folder: where for folder, (_, where) in root.transformers().items()}
        models.update(root.shared())
        return [(output / name, [where]) for name, where in models.items() if (output / name / "config.json").is_file()]
    experts = expert_folders(against)  # a release holding one model per expert: each against its own
    checks = [(output / component, [folder]) for component, folder in experts.items()] if experts else \
        [(output / _transformer_folder(output, against, request.choice), against),
         *_release_components(output, against, request.choice)]
    if request.vae_against is not None:
        checks.append((output / "vae", [request.vae_against]))
    return checks


def _transformer_folder(output: Path, sources: list[Path], choice: SourceChoice) -> str:
    """The pipeline folder the run's transformer went to: transformer/, or the task's own folder a Diffusers LoRA's
    keys name (MiniMax-H3's transformer_ref: a Ref2VA adapter is fused there)."""
    held = [folder for folder in all_transformer_folders() if (output / folder / "config.json").is_file()]
    if held == [DEFAULT_TRANSFORMER_FOLDER] or not held:  # nothing to choose: the source is not opened twice
        return DEFAULT_TRANSFORMER_FOLDER
    with choice.open(sources) as source:
        named = FORMATS["diffusers"].component_in(list(source), held, ", ".join(map(str, sources)))
    return named or DEFAULT_TRANSFORMER_FOLDER


def _verify_folder(folder: Path, sources: list[Path], request: VerifyRequest) -> VerifyReport:
    where = ", ".join(map(str, sources))
    config = read_json(folder / "config.json")
    class_name = config.get("_class_name")
    found = family_of_class(class_name)
    if found is None:
        raise CogExportError(f"{folder}/config.json describes {class_name!r}, not a model cogexport exports")
    family, component = found
    target = build_target(class_name, config)
    with request.choice.open(sources) as source, ExitStack() as stack:
        report = VerifyReport(str(folder), class_name)
        if component == "transformer" and lora_key(list(source)) is not None:
            report.kind = "fused model"
            # the folder's place in a pipeline (transformer_2: an expert) is where --base keeps its base weights
            part = folder.name if is_pipeline(folder.parent) else component
            adapter, base = fused_inputs(source, sources, part, family, target, request, stack)
            expected, table = plan_fused(adapter, base, where), None
        else:
            _, table = choose_table(source, component, class_name, where, family, remedy=NOT_ITS_SOURCE)
            expected = plan_translation(table, source, target.schema, target.counts, what=where).tensors
        with SafetensorsCheckpoint(folder) as written:
            compare(written, expected, report)
            if table is not None:
                _ask_judge(table, source, written, report, request.judge_limit, target.config)
            else:
                judge_with_peft(adapter, base, written, report)
    if request.load:
        _load(folder, class_name, report)
    return report


def _release_components(output: Path, sources: list[Path], choice: SourceChoice) -> list[tuple[Path, list[Path]]]:
    """The pipeline's other models that came from the same release file as its transformer (the family's
    from_checkpoint components whose layout the file holds: LTX-2's VAEs, connectors and vocoder), each checked
    against that file."""
    config = output / "transformer" / "config.json"
    found = family_of_class(read_json(config).get("_class_name")) if config.is_file() else None
    if found is None or not found[0].from_checkpoint:
        return []
    family = found[0]
    with choice.open(sources) as source:
        keys = list(source)
    return [(output / name, sources) for name in family.from_checkpoint
            if (output / name / "config.json").is_file() and fitting_tables(keys, component_tables(name, family))]


def judge_converts(table: KeyMapTable, state: dict, config: Mapping | None) -> dict:
    """What Diffusers' converter named by the table makes of ``state``, given the table's ``judge_args`` (the
    target model's config where they say ``config = "target"``)."""
    from diffusers.loaders import single_file_utils

    arguments = {name: dict(config or {}) if value == "target" else value for name, value in table.judge_args.items()}
    return getattr(single_file_utils, table.judge)(state, **arguments)


def _ask_judge(table: KeyMapTable, source: Mapping[str, LazyTensor], written: Mapping[str, LazyTensor],
               report: VerifyReport, judge_limit: int, config: Mapping | None = None) -> None:
    """Convert the source with Diffusers' own converter for this layout and compare every written tensor with it."""
    reason = why_no_judge(table, source, judge_limit)
    if reason:
        report.judge_note = reason
        return
    selected, _ = table.select(source)
    state = {name: source[original].load() for name, original in selected.items()}
    try:
        converted = judge_converts(table, state, config)
    except Exception as error:  # the judge's own failure is a finding, not a crash of ours
        report.judge_mismatches.append(f"Diffusers' {table.judge} fails on this checkpoint: {type(error).__name__}: "
                                       f"{error}")
        return
    report.judge = table.judge
    for name in sorted(set(written) - set(converted)):
        report.judge_mismatches.append(f"{name} is in the folder, but Diffusers' {table.judge} does not make it")
    for name in sorted(set(converted) - set(written)):
        report.judge_mismatches.append(f"Diffusers' {table.judge} makes {name}, which the folder lacks")
    for name in sorted(set(written) & set(converted)):
        if same(written[name], converted[name]) is None:
            report.judge_mismatches.append(f"{name} differs from what Diffusers' {table.judge} makes of it")
        else:
            report.judged += 1


def why_no_judge(table: KeyMapTable, source: Mapping[str, LazyTensor], judge_limit: int) -> str:
    """Why Diffusers' converter is not asked (no converter, sizes it does not fit, too big to hold), or ""."""
    if table.judge is None and table.renames_nothing:
        return (f"the checkpoint already has Diffusers' names ({table.name} only strips wrapper prefixes), so there "
                "is no translation to judge")
    if table.judge is None:
        return table.no_judge or (
            f"Diffusers' package has no converter for {table.name} ({table.source}); cogexport's test suite checks "
            "this table against real checkpoints and Diffusers' reference conversions")
    selected, _ = table.select(source)
    unmet = _judge_assumption_unmet(table, {name: source[original].shape for name, original in selected.items()})
    if unmet:
        return f"Diffusers' {table.judge} was not asked: {unmet}"
    size = sum(source[original].nbytes for original in selected.values())
    if size > judge_limit:
        return (f"Diffusers' {table.judge} was not asked: it needs the whole source in memory ({size / 1e9:.1f} GB, "
                f"over the {judge_limit / 1e9:.1f} GB limit; raise it with --judge-limit)")
    return ""


def _judge_assumption_unmet(table: KeyMapTable, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why the judge's hard-coded sizes do not fit this checkpoint (its answer would be wrong, not ours), or None. A
    key given as false must be absent: the judge's fixed renames know no such key (a later version's)."""
    for key, wanted in table.judge_when.items():
        shape = shapes.get(key)
        if wanted is False:
            if shape is not None:
                return (f"its renames are fixed for the layout without {key} (a later version's key, which this "
                        "checkpoint has), so it could not give a second opinion")
            continue
        fits = shape is not None and len(shape) == len(wanted) and all(
            want == "*" or want == have for want, have in zip(wanted, shape))
        if not fits:
            have = "has no such key" if shape is None else f"has {list(shape)}"
            return (f"its code assumes the release's size ({key} of shape {wanted}); this checkpoint {have}, so it "
                    "could not give a second opinion")
    return None


def _load(folder: Path, class_name: str, report: VerifyReport) -> None:
    try:
        model, info = model_class(class_name).from_pretrained(folder, variant=variant_of(folder),
                                                              output_loading_info=True)
        problems = [f"{k}: {v}" for k, v in info.items() if v]
        report.loads_with_diffusers = not problems
        report.load_error = "; ".join(problems) or None
        del model
    except Exception as error:  # any failure to load is the finding itself
        report.loads_with_diffusers = False
        report.load_error = f"{type(error).__name__}: {error}"
