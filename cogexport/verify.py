"""``cogexport verify OUTPUT --against CHECKPOINT``: check an exported folder against its source, and say exactly what
that proves.

Three checks, reported separately:
1. Consistency: the translation is planned again from the checkpoint with cogexport's own key map (and the config the
   folder carries); every written tensor is read back and compared with its source, bit-exact where the dtype was
   kept, equal to the same cast of the source otherwise. This proves the folder holds what the plan says, cast as
   declared. It cannot catch a wrong rule in the key map: the plan uses the same table the export did.
2. A second opinion where one exists: when Diffusers ships its own converter for the source layout (its single-file
   converters), the source is converted by Diffusers' code and every written tensor is compared with that result.
   This is independent of cogexport's tables. It holds the converted model in memory, so it is skipped for sources
   larger than ``judge_limit`` bytes, and for checkpoints of other sizes than the converter hard-codes (the table's
   ``judge_when``); the report says which.
3. Diffusers loads the folder (``from_pretrained``, strictly: no missing or unexpected keys).

LoRA exports are checked too: an adapter folder against the run's A and B and its recorded alpha and ranks; a fused
model against W + (alpha / r) B A of the run's weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import torch

from .checkpoint import as_paths
from .checkpoint.safetensors_files import SafetensorsCheckpoint
from .errors import CogExportError
from .keymap.plan import plan_translation
from .keymap.table import KeyMapTable
from .lazy import LazyTensor
from .checkpoint import open_checkpoint, open_ema
from .lora import base_weights, plan_fused, read_adapter
from .models.base_folder import read_json
from .models.family import family_of_class, model_class
from .models.recognize import choose_table, component_tables, expert_folders, fitting_tables, lora_key
from .models.target import build_target
from .verify_quantized import check_file, original_names, quantized_files, source_of
from .write.diffusers_folders import variant_of

JUDGE_LIMIT = 8_000_000_000  # bytes of source tensors a second opinion may hold in memory


@dataclass(frozen=True)
class SourceChoice:
    """Which weights of the checkpoint the folder was exported from."""

    tag: str | None = None
    ema: bool = False

    def open(self, paths: list[Path]):
        return open_ema(paths, self.tag) if self.ema else open_checkpoint(paths, self.tag)


@dataclass
class VerifyReport:
    folder: str
    model_class: str
    kind: str = "model"  # model, fused model (LoRA merged) or LoRA adapter
    tensors: int = 0
    exact: int = 0
    cast_exact: int = 0
    mismatches: list[str] = field(default_factory=list)
    loads_with_diffusers: bool | None = None
    load_error: str | None = None
    judge: str | None = None  # the independent converter that was asked, if any
    judged: int = 0  # tensors it agreed on
    judge_mismatches: list[str] = field(default_factory=list)
    judge_note: str = ""  # why there was no second opinion, when there was none
    errors: list[dict] = field(default_factory=list)  # quantized files: each tensor's error against the source
    reference: str = ""  # quantized files: whose quantizer the bytes were compared with

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.judge_mismatches and self.loads_with_diffusers is not False

    @property
    def proves(self) -> list[str]:
        """What passing means, claim by claim (only the checks that ran)."""
        claims = []
        if self.kind == "LoRA adapter":
            claims.append("every adapter tensor equals the run's lora_A/lora_B (under cogexport's key map), and the "
                          "recorded rank and alpha are the run's")
        elif self.kind == "quantized file":
            claims.append(f"every tensor is what the reference quantizer makes of the checkpoint's tensor in the "
                          f"family's original names ({self.reference}); the error each costs is listed")
        elif self.kind == "fused model":
            claims.append("every tensor equals the run's weights with W + (alpha / r) B A merged in (computed again "
                          "from the run, cast as declared)")
        else:
            claims.append("the folder holds what cogexport's key map makes of the checkpoint, cast as declared "
                          "(consistency: the same table made the export, so a wrong rule would pass this check)")
        if self.judge:
            claims.append(f"Diffusers' own converter ({self.judge}) makes the same {self.judged} tensors of the "
                          "checkpoint (independent of cogexport's tables)")
        if self.loads_with_diffusers:
            claims.append("Diffusers loads it with no missing or unexpected keys")
        return claims

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "proves": self.proves}


def is_pipeline(output: Path) -> bool:
    return (output / "model_index.json").is_file()


def verify(output: str | Path, against: str | Path | Sequence[str | Path], *, tag: str | None = None,
           ema: bool = False, load: bool = True, vae_against: str | Path | None = None,
           judge_limit: int = JUDGE_LIMIT) -> list[VerifyReport]:
    """Verify OUTPUT (a model folder, a pipeline's transformer, or a LoRA adapter folder) against ``against``, and a
    pipeline's exported VAE against ``vae_against`` (its own source)."""
    output = Path(output)
    quantized = quantized_files(output)
    if quantized:
        if vae_against is not None:
            raise CogExportError(f"--vae-against applies to a pipeline folder; {output} holds quantized files")
        return [_verify_quantized(file, output, as_paths(against), SourceChoice(tag, ema)) for file in quantized]
    if not (output / "config.json").is_file() and not is_pipeline(output) and any(output.glob("*.safetensors")):
        if vae_against is not None:
            raise CogExportError(f"--vae-against applies to a pipeline folder; {output} is a LoRA adapter folder")
        return [_verify_adapter(output, as_paths(against), SourceChoice(tag, ema))]
    options = SourceChoice(tag, ema)
    return [_verify_folder(folder, sources, options, load, judge_limit)
            for folder, sources in _model_checks(output, as_paths(against), vae_against, options)]


def _model_checks(output: Path, against: list[Path], vae_against: str | Path | None,
                  options: SourceChoice) -> list[tuple[Path, list[Path]]]:
    """Each model folder of the output and the checkpoint it was exported from."""
    if (output / "config.json").is_file():
        checks = [(output, against)]
    elif is_pipeline(output):
        experts = expert_folders(against)  # a release holding one model per expert: each against its own
        checks = [(output / component, [folder]) for component, folder in experts.items()] if experts else \
            [(output / "transformer", against), *_release_components(output, against, options)]
        if vae_against is not None:
            checks.append((output / "vae", as_paths(vae_against)))
    else:
        raise CogExportError(f"{output} is not an exported folder (no config.json, model_index.json, adapter "
                             "weights or quantized files)")
    if vae_against is not None and not is_pipeline(output):
        raise CogExportError(f"--vae-against applies to a pipeline folder; {output} is a model folder")
    return checks


def _verify_folder(folder: Path, sources: list[Path], options: SourceChoice, load: bool,
                   judge_limit: int) -> VerifyReport:
    where = ", ".join(map(str, sources))
    config = read_json(folder / "config.json")
    class_name = config.get("_class_name")
    found = family_of_class(class_name)
    if found is None:
        raise CogExportError(f"{folder}/config.json describes {class_name!r}, not a model cogexport exports")
    family, component = found
    target = build_target(class_name, config)
    with options.open(sources) as source:
        report = VerifyReport(str(folder), class_name)
        if component == "transformer" and lora_key(list(source)) is not None:
            report.kind = "fused model"
            adapter = read_adapter(source, where, None, _folders(sources), source.info.header_metadata)
            if not adapter.has_base_weights:
                raise CogExportError(f"{where} holds only a LoRA adapter; verify the fused folder against the run "
                                     "that holds the base weights too, or verify the adapter folder")
            expected = plan_fused(adapter, base_weights(adapter, target.schema, target.counts, where), where)
            table = None
        else:
            _, table = choose_table(source, component, class_name, where, family)
            expected = plan_translation(table, source, target.schema, target.counts, what=where).tensors
        with SafetensorsCheckpoint(folder) as written:
            _compare(written, expected, report)
            if table is not None:
                _ask_judge(table, source, written, report, judge_limit)
    if load:
        _load(folder, class_name, report)
    return report


def _verify_quantized(file: Path, output: Path, against: list[Path], options: SourceChoice) -> VerifyReport:
    sources = source_of(file, output, against)
    where = ", ".join(map(str, sources))
    with options.open(sources) as source:
        if lora_key(list(source)) is not None:
            raise CogExportError(f"{where} is a LoRA run; verify its quantized file against the fused model (export it "
                                 "with --lora fuse first)")
        kind, checks, missing = check_file(file, original_names(source, where))
    report = VerifyReport(str(file), kind, kind="quantized file", tensors=len(checks),
                          exact=sum(check.exact for check in checks),
                          reference=", ".join(sorted({check.judge for check in checks})) or "none")
    report.mismatches = [f"{name} is in the file but not in {where}" for name in missing[:20]]
    report.mismatches += [f"{check.name} ({check.type}) is not what {check.judge} makes of the source"
                          for check in checks if not check.exact]
    report.errors = [{"name": c.name, "type": c.type, "max_error": c.max_error, "rms_relative": c.rms_relative}
                     for c in checks]
    return report


def _release_components(output: Path, sources: list[Path], options: SourceChoice) -> list[tuple[Path, list[Path]]]:
    """The pipeline's other models that came from the same release file as its transformer (the family's
    from_checkpoint components whose layout the file holds: LTX-2's VAEs, connectors and vocoder), each checked
    against that file."""
    config = output / "transformer" / "config.json"
    found = family_of_class(read_json(config).get("_class_name")) if config.is_file() else None
    if found is None or not found[0].from_checkpoint:
        return []
    family = found[0]
    with options.open(sources) as source:
        keys = list(source)
    return [(output / name, sources) for name in family.from_checkpoint
            if (output / name / "config.json").is_file() and fitting_tables(keys, component_tables(name, family))]


def _folders(sources: list[Path]) -> list[Path]:
    return [p if p.is_dir() else p.parent for p in sources]


def _verify_adapter(folder: Path, sources: list[Path], options: SourceChoice) -> VerifyReport:
    """The adapter written to ``folder`` (in whatever layout), read back, has the run's modules, A and B, ranks and
    alphas: the strength its loader will apply is the trained one."""
    where = ", ".join(map(str, sources))
    with options.open(sources) as source, open_checkpoint(folder) as written_file:
        trained = read_adapter(source, where, None, _folders(sources), source.info.header_metadata)
        # the folder's names may fit another family too (Diffusers names CogVideoX and LTX-Video share): it holds
        # the run's family's adapter
        written = read_adapter(written_file, str(folder), None, [folder], written_file.info.header_metadata,
                               trained.family)
        report = VerifyReport(str(folder), f"{written.table.format.title} LoRA adapter", kind="LoRA adapter")
        for name in sorted(set(trained.modules) - set(written.modules)):
            report.mismatches.append(f"{name}: the run adapts it, the folder does not")
        for name in sorted(set(written.modules) - set(trained.modules)):
            report.mismatches.append(f"{name}: the folder adapts it, the run does not")
        for name in sorted(set(trained.modules) & set(written.modules)):
            want, have = trained.modules[name], written.modules[name]
            if want.scale(trained.use_rslora) != have.scale(written.use_rslora):
                report.mismatches.append(f"{name}: applied at {have.scale(written.use_rslora):g}, the run's strength is "
                                         f"{want.scale(trained.use_rslora):g} (alpha {want.alpha:g}, rank {want.rank})")
            for part, tensor in want.parts.items():
                report.tensors += 1
                kind = _same(have.parts[part], tensor.load()) if part in have.parts else None
                if kind is None:
                    report.mismatches.append(f"{name}.{part}: differs from the run's")
                else:
                    setattr(report, kind, getattr(report, kind) + 1)
    report.judge_note = "LoRA adapters have no Diffusers converter to compare with here; load it with " \
                        "load_lora_weights to check it applies"
    return report


def _compare(written: Mapping[str, LazyTensor], expected: Mapping[str, LazyTensor], report: VerifyReport) -> None:
    for name in sorted(set(expected) - set(written)):
        report.mismatches.append(f"{name} is missing from the folder")
    for name in sorted(set(written) - set(expected)):
        report.mismatches.append(f"{name} is in the folder but not in the checkpoint's translation")
    for name in [n for n in expected if n in written]:
        report.tensors += 1
        kind = _same(written[name], expected[name].load())
        if kind is None:
            report.mismatches.append(f"{name}: values differ from the checkpoint's")
        else:
            setattr(report, kind, getattr(report, kind) + 1)


def _same(have: LazyTensor, want: torch.Tensor) -> str | None:
    """"exact" or "cast_exact" when the written tensor is the source (or its cast), else None."""
    if have.shape != want.shape:
        return None
    stored = have.load()
    if stored.dtype == want.dtype:
        return "exact" if torch.equal(stored, want) else None
    return "cast_exact" if torch.equal(stored, want.to(stored.dtype)) else None


def _ask_judge(table: KeyMapTable, source: Mapping[str, LazyTensor], written: Mapping[str, LazyTensor],
               report: VerifyReport, judge_limit: int) -> None:
    """Convert the source with Diffusers' own converter for this layout and compare every written tensor with it."""
    if table.judge is None and table.renames_nothing:
        report.judge_note = (f"the checkpoint already has Diffusers' names ({table.name} only strips wrapper prefixes), "
                             "so there is no translation to judge")
        return
    if table.judge is None:
        report.judge_note = table.no_judge or (
            f"Diffusers' package has no converter for {table.name} ({table.source}); cogexport's test suite checks "
            "this table against real checkpoints and Diffusers' reference conversions")
        return
    selected, _ = table.select(source)
    unmet = _judge_assumption_unmet(table, {name: source[original].shape for name, original in selected.items()})
    if unmet:
        report.judge_note = f"Diffusers' {table.judge} was not asked: {unmet}"
        return
    size = sum(source[original].nbytes for original in selected.values())
    if size > judge_limit:
        report.judge_note = (f"Diffusers' {table.judge} was not asked: it needs the whole source in memory "
                             f"({size / 1e9:.1f} GB, over the {judge_limit / 1e9:.1f} GB limit; raise it with "
                             "--judge-limit)")
        return
    from diffusers.loaders import single_file_utils

    converter = getattr(single_file_utils, table.judge)
    state = {name: source[original].load() for name, original in selected.items()}
    try:
        converted = converter(state)
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
        if _same(written[name], converted[name]) is None:
            report.judge_mismatches.append(f"{name} differs from what Diffusers' {table.judge} makes of it")
        else:
            report.judged += 1


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
