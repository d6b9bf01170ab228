"""``cogexport verify OUTPUT --against CHECKPOINT``: check an exported folder against its source, and say exactly what
that proves.

Each output format checks its own files (its ``verify`` hook, exporter/output_formats.py): the formats are asked in
their registry order, and the first whose files the folder holds checks them. What every check shares lives here:
the report, the request (the source and how to read it), and the comparison of a written tensor with its source (bit
for bit where the dtype was kept, equal to the same cast of the source otherwise).

- A Diffusers model or pipeline folder (verify_models.py): consistency with cogexport's own key map, a second opinion
  from Diffusers' own converter where it ships one, and Diffusers loading the folder; a fused LoRA model against
  W + (alpha / r) B A of the run's weights (or --base's), with PEFT's merge as the second opinion (verify_fused.py).
- A LoRA adapter folder (verify_adapter.py): the run's A and B, ranks and alphas, read back from the written layout.
- An original layout (verify_original.py): every tensor against the source planned again the way --to original
  planned it, and Diffusers' single-file converter, where it ships one, reading the file back as the model it came
  from.
- A DeepSpeed universal checkpoint (verify_universal.py): every file against the ZeRO checkpoint's parameters and
  optimizer states, planned again.
- GGUF and ComfyUI quantized files (verify_quantized.py): every tensor against the reference quantizer applied to the
  source, and the error each costs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import torch

from .checkpoint import as_paths, open_weights
from .errors import CogExportError
from .lazy import LazyTensor

JUDGE_LIMIT = 8_000_000_000  # bytes of source tensors a second opinion may hold in memory


@dataclass(frozen=True)
class SourceChoice:
    """Which weights of the checkpoint the folder was exported from."""

    tag: str | None = None
    ema: bool = False
    role: str | None = None

    def open(self, paths: list[Path]):
        return open_weights(paths, self.tag, ema=self.ema, role=self.role)


@dataclass(frozen=True)
class VerifyRequest:
    """What the folder is checked against, and how far: the checkpoint (and a pipeline VAE's own source), which of
    its weights, whether Diffusers loads the folder, the most a second opinion may hold in memory."""

    against: list[Path]
    choice: SourceChoice = SourceChoice()
    load: bool = True
    vae_against: Path | None = None
    judge_limit: int = JUDGE_LIMIT
    base: Path | None = None  # as export's --base: the model a LoRA saved without its weights was fused into

    def refuse_vae_against(self, output: Path, holds: str) -> None:
        """--vae-against checks a pipeline's VAE: for a folder of another kind it is a mistake, said in one line."""
        if self.vae_against is not None:
            raise CogExportError(f"--vae-against applies to a pipeline folder; {output} {holds}")


@dataclass
class VerifyReport:
    folder: str
    model_class: str
    kind: str = "model"  # model, fused model (LoRA merged), LoRA adapter, quantized file, original layout or
    # universal checkpoint
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
        claims = [_KIND_CLAIMS.get(self.kind, _KIND_CLAIMS["model"]).format(reference=self.reference)]
        if self.judge and self.kind == "fused model":
            claims.append(f"{self.judge} makes the same {self.judged} adapted weights of the base weights and the "
                          "run's adapter (independent of cogexport's merge and scale)")
        elif self.judge and self.kind == "original layout":
            claims.append(f"Diffusers' own converter ({self.judge}) reads the file back as the same {self.judged} "
                          "tensors of the Diffusers model it was made from (independent of cogexport's tables)")
        elif self.judge:
            claims.append(f"Diffusers' own converter ({self.judge}) makes the same {self.judged} tensors of the "
                          "checkpoint (independent of cogexport's tables)")
        if self.loads_with_diffusers:
            claims.append("Diffusers loads it with no missing or unexpected keys")
        return claims

    @property
    def judge_title(self) -> str:
        """The second opinion, as a report's text names it."""
        return self.judge if self.kind == "fused model" else f"Diffusers' {self.judge}"

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "proves": self.proves}


_KIND_CLAIMS = {
    "LoRA adapter": "every adapter tensor equals the run's lora_A/lora_B (under cogexport's key map), and the recorded "
                    "rank and alpha are the run's",
    "quantized file": "every tensor is what the reference quantizer makes of the checkpoint's tensor in the family's "
                      "original names ({reference}); the error each costs is listed",
    "fused model": "every tensor equals the base weights (the run's own, or --base's) with the run's adapter merged "
                   "in, W + (alpha / r) B A (computed again from them, cast as declared)",
    "original layout": "every tensor of the file is the source's in the original names cogexport's table gives it, "
                       "cast as declared (consistency: the same table made the export)",
    "universal checkpoint": "every parameter's fp32 master, optimizer states and step, every frozen parameter and "
                            "buffer, is the ZeRO checkpoint's gathered from its rank partitions, bit for bit; the "
                            "model-states file is the checkpoint's own",
    "model": "the folder holds what cogexport's key map makes of the checkpoint, cast as declared (consistency: the "
             "same table made the export, so a wrong rule would pass this check)",
}


def is_pipeline(output: Path) -> bool:
    return (output / "model_index.json").is_file()


def verify(output: str | Path, against: str | Path | Sequence[str | Path], *, tag: str | None = None,
           ema: bool = False, role: str | None = None, load: bool = True, vae_against: str | Path | None = None,
           judge_limit: int = JUDGE_LIMIT, base: str | Path | None = None) -> list[VerifyReport]:
    """Verify OUTPUT (a model or pipeline folder, a LoRA adapter folder, quantized files, or any format's output)
    against ``against``, and a pipeline's exported VAE against ``vae_against`` (its own source). ``base`` is the
    export's --base, which a LoRA saved without the model's weights was fused into."""
    from .exporter.output_formats import output_formats

    output = Path(output)
    request = VerifyRequest(as_paths(against), SourceChoice(tag, ema, role), load,
                            Path(vae_against) if vae_against is not None else None, judge_limit,
                            Path(base) if base is not None else None)
    from .verify_universal import verify_universal

    _refuse_lora_among_several(request.against)
    reports = verify_universal(output, request)  # `cogexport universal`'s folder: no export format writes it
    if reports is not None:
        return reports
    for fmt in output_formats():
        reports = fmt.verify(output, request) if fmt.verify is not None else None
        if reports is not None:
            return reports
    checkable = ", ".join([*(fmt.title for fmt in output_formats() if fmt.verify is not None),
                           "a DeepSpeed universal checkpoint (cogexport universal)"])
    raise CogExportError(f"{output} is not an exported folder verify can check (it checks {checkable})")


def _refuse_lora_among_several(paths: list[Path]) -> None:
    """Several --against are one checkpoint's parts (a run's folders on several nodes, one model's files): a LoRA file
    among them is a fused model's adapter given with its base, which goes in --base. (Folders are not opened alone:
    one node's folder of a run is no checkpoint by itself.)"""
    if len(paths) < 2:
        return
    from .checkpoint import open_checkpoint
    from .models.recognize import lora_key

    for path in [path for path in paths if path.is_file()]:
        try:
            with open_checkpoint(path) as alone:
                is_lora = lora_key(list(alone)) is not None
        except CogExportError:  # a part that does not open alone (one node's ranks): not a LoRA file
            continue
        if is_lora:
            raise CogExportError(f"--against {path} is a LoRA, given with other checkpoints; give it alone, and the "
                                 "base weights it was fused into with --base")


def compare(written: Mapping[str, LazyTensor], expected: Mapping[str, LazyTensor], report: VerifyReport) -> None:
    """Every expected tensor in the folder, equal to its source (or its cast), and nothing else there."""
    for name in sorted(set(expected) - set(written)):
        report.mismatches.append(f"{name} is missing from the folder")
    for name in sorted(set(written) - set(expected)):
        report.mismatches.append(f"{name} is in the folder but not in the checkpoint's translation")
    for name in [n for n in expected if n in written]:
        report.tensors += 1
        kind = same(written[name], expected[name].load())
        if kind is None:
            report.mismatches.append(f"{name}: values differ from the checkpoint's")
        else:
            setattr(report, kind, getattr(report, kind) + 1)


def same(have: LazyTensor, want: torch.Tensor) -> str | None:
    """"exact" or "cast_exact" when the written tensor is the source (or its cast), else None."""
    if have.shape != want.shape:
        return None
    stored = have.load()
    if stored.dtype == want.dtype:
        return "exact" if torch.equal(stored, want) else None
    return "cast_exact" if torch.equal(stored, want.to(stored.dtype)) else None


def source_folders(sources: list[Path]) -> list[Path]:
    """The folders the source was read from (where a run's adapter config or training YAML may lie)."""
    return [p if p.is_dir() else p.parent for p in sources]
