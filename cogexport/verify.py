"""``cogexport verify OUTPUT --against CHECKPOINT``: check an exported folder against its source.

The translation is planned again from the checkpoint, with the config the folder itself carries; then every
written tensor is read back and compared with its source: bit-exact where the dtype was kept, equal to the
same cast of the source otherwise. Finally the model is loaded with Diffusers' own ``from_pretrained``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .checkpoint import as_paths
from .checkpoint.safetensors_files import SafetensorsCheckpoint
from .errors import CogExportError
from .to_diffusers import ExportOptions, open_source
from .keymap.plan import plan_translation
from .models.base_folder import read_json
from .models.family import family_of_class
from .models.recognize import choose_table
from .models.target import build_target
from .write.diffusers_folders import variant_of


@dataclass
class VerifyReport:
    folder: str
    model_class: str
    tensors: int = 0
    exact: int = 0
    cast_exact: int = 0
    mismatches: list[str] = field(default_factory=list)
    loads_with_diffusers: bool | None = None
    load_error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.loads_with_diffusers is not False

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def is_pipeline(output: Path) -> bool:
    return (output / "model_index.json").is_file()


def verify(output: str | Path, against: str | Path | Sequence[str | Path], *, tag: str | None = None,
           ema: bool = False, load: bool = True, vae_against: str | Path | None = None) -> list[VerifyReport]:
    """Verify OUTPUT (a model folder, or a pipeline's transformer) against ``against``, and a pipeline's exported
    VAE against ``vae_against`` (its own source)."""
    output = Path(output)
    if (output / "config.json").is_file():
        checks = [(output, as_paths(against))]
    elif is_pipeline(output):
        checks = [(output / "transformer", as_paths(against))]
        if vae_against is not None:
            checks.append((output / "vae", as_paths(vae_against)))
    else:
        raise CogExportError(f"{output} is not an exported folder (no config.json or model_index.json)")
    if vae_against is not None and len(checks) == 1:
        raise CogExportError(f"--vae-against applies to a pipeline folder; {output} is a model folder")
    options = ExportOptions(tag=tag, ema=ema)
    return [_verify_folder(folder, sources, options, load) for folder, sources in checks]


def _verify_folder(folder: Path, sources: list[Path], options: ExportOptions, load: bool) -> VerifyReport:
    where = ", ".join(map(str, sources))
    config = read_json(folder / "config.json")
    class_name = config.get("_class_name")
    found = family_of_class(class_name)
    if found is None:
        raise CogExportError(f"{folder}/config.json describes {class_name!r}, not a model cogexport exports")
    family, component = found
    with open_source(sources, options) as source:
        _, table = choose_table(source, component, class_name, where, family)
        target = build_target(class_name, config)
        expected = plan_translation(table, source, target.schema, target.counts, what=where).tensors
        report = VerifyReport(str(folder), class_name)
        with SafetensorsCheckpoint(folder) as written:
            _compare(written, expected, report)
    if load:
        _load(folder, class_name, report)
    return report


def _compare(written, expected, report: VerifyReport) -> None:
    for name in sorted(set(expected) - set(written)):
        report.mismatches.append(f"{name} is missing from the folder")
    for name in sorted(set(written) - set(expected)):
        report.mismatches.append(f"{name} is in the folder but not in the checkpoint's translation")
    for name in [n for n in expected if n in written]:
        report.tensors += 1
        have, want = written[name], expected[name]
        if have.shape != want.shape:
            report.mismatches.append(f"{name}: shape {tuple(have.shape)}, expected {tuple(want.shape)}")
            continue
        stored, source = have.load(), want.load()
        if stored.dtype == source.dtype:
            same, kind = torch.equal(stored, source), "exact"
        else:
            same, kind = torch.equal(stored, source.to(stored.dtype)), "cast_exact"
        if same:
            setattr(report, kind, getattr(report, kind) + 1)
        else:
            report.mismatches.append(f"{name}: values differ from the checkpoint's"
                                     + ("" if kind == "exact" else f" cast to {stored.dtype}"))


def _load(folder: Path, class_name: str, report: VerifyReport) -> None:
    import diffusers

    try:
        model, info = getattr(diffusers, class_name).from_pretrained(folder, variant=variant_of(folder),
                                                                      output_loading_info=True)
        problems = [f"{k}: {v}" for k, v in info.items() if v]
        report.loads_with_diffusers = not problems
        report.load_error = "; ".join(problems) or None
        del model
    except Exception as error:  # any failure to load is the finding itself
        report.loads_with_diffusers = False
        report.load_error = f"{type(error).__name__}: {error}"
