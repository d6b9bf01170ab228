"""Open the one checkpoint the user means: every reader's claims on the path are gathered (claims.py), and exactly one
is opened, by the user's word or by a rule stated here, and named in the checkpoint's notes; otherwise one line says
what was found and how to name one.

The rules, in order:

- ``--tag`` on a folder a reader with tags of its own claims whole (a DeepSpeed save dir) names one of its tags (or
  its universal checkpoint); anywhere else it names a checkpoint below the folder by its folder or file name (a
  run's step: ``--tag step-2``), or its path from there.
- No claim: the folder holds nothing any reader reads, and the line says what each looked for.
- One claim: it is read (named in a note when it lies below the folder given).
- Every claim a step of the same run (a folder named checkpoint-N, checkpoint_N, step-N, global_stepN or
  finetrainers_step_N, holding one checkpoint of any format): the newest step by natural order is read, and a note
  says so. Steps of several runs: point at one run.
- Anything else (two checkpoints side by side, a checkpoint and loose weights, steps and exported weights) is
  refused with every candidate named.

Never candidates of their own: a DeepSpeed checkpoint-N's adapter copy (``pytorch_lora_weights.safetensors``, CogVideo
finetune/); a consolidated Hugging Face writer save's ``sharded/`` (the same save in pieces); a checkpoint folder's
safetensors copy inside it holding the same tensors (``accelerate merge-weights`` into checkpoint-N: the original is
read); a folder's weights in other forms (``stem.fp16.safetensors`` variants, ``pytorch_model.bin`` beside
safetensors weights); other safetensors files of a save_pretrained model folder (its config.json names its class: it
is its plain weights, and cogexport keeps there a release's tensors the class has no place for); training state
(optimizer, scheduler, RNG, trainer files); hidden folders. One rank's file of a distributed save (PyTorch's Hugging
Face writer) is never read as a model: pointing at it is refused.

A path given alone that is a file is read by the first reader that names it (by name or first bytes), else as a
torch.save file (any name); several paths, by the reader of them all when they are one reader's files read together
(one model's parts), else as a checkpoint spread over folders (DeepSpeed's, a folder per node). Which reader does
what is the readers' own word (readers/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import CogExportError, quoted
from .base import LazyCheckpoint
from .claims import SEARCH_DEPTH, gather
from .dcp_locate import STEP_NUMBER, step_number
from .locate import natural_sorted
from .readers import Claim, OpenOptions, Reader, looks_for, phrase_of, reader_of_file, reader_of_several, \
    stands_for_folder


def as_paths(checkpoint: str | Path | Sequence[str | Path]) -> list[Path]:
    """One path or several (rank files spread over several folders) as a list of paths."""
    if isinstance(checkpoint, (str, Path)):
        return [Path(checkpoint)]
    return [Path(p) for p in checkpoint]


def open_checkpoint(checkpoint: str | Path | Sequence[str | Path], tag: str | None = None,
                    *, strict: bool = True, entry: str | None = None) -> LazyCheckpoint:
    """Open a checkpoint as a lazy mapping of names to ``LazyTensor`` (shape and dtype known, data read on load).

    A path is a checkpoint file or folder of any format cogexport reads, or a folder holding one (a run folder of
    steps: the newest is read unless ``tag`` names one); several paths are one DeepSpeed checkpoint's folders on
    several nodes, or one model's parts in separate safetensors files. See the module docstring for how one
    checkpoint is chosen; ``info.picked`` and ``info.notes`` say which was, ``info.origin`` names it in a phrase.
    """
    paths = as_paths(checkpoint)
    options = OpenOptions(tag, strict, entry)
    if len(paths) == 1 and not paths[0].exists():
        raise CogExportError(f"{paths[0]} does not exist")
    if len(paths) == 1 and (paths[0].is_dir() or stands_for_folder(paths[0])):
        return _open_folder(paths[0] if paths[0].is_dir() else paths[0].parent, options)
    opened = _open_several(paths, options) if len(paths) > 1 else _open_file(paths[0], options)
    return _named(opened, phrase_of(opened.info.format), ", ".join(map(str, paths)))


def _open_several(paths: list[Path], options: OpenOptions) -> LazyCheckpoint:
    reader = reader_of_several(paths)
    if reader is None or reader.open_several is None:
        raise CogExportError(f"no reader reads {', '.join(map(str, paths))} together as one checkpoint; point at one")
    return reader.open_several(paths, options)


def _open_file(path: Path, options: OpenOptions) -> LazyCheckpoint:
    reader = reader_of_file(path)
    if reader is None or reader.open_file is None:
        raise CogExportError(f"{path} is no file cogexport reads (it looks for {looks_for()})")
    if options.tag is not None and not reader.own_tags:
        raise CogExportError(f"--tag {quoted(options.tag)} does not apply to {path}: one file has no steps or tags; "
                             "drop --tag")
    _refuse_entry(options, reader, path)
    return reader.open_file(path, options)


def _open_folder(root: Path, options: OpenOptions) -> LazyCheckpoint:
    candidates = [claim for claim in gather(root) if not claim.companion]
    if options.tag is not None:
        return _open_tagged(root, candidates, options)
    candidates = _without_copies(root, candidates)
    if not candidates:
        raise _nothing_here(root)
    if len(candidates) == 1:
        claim = candidates[0]
        picked = "" if claim.path == root else f"read {claim.label(root)}, the only checkpoint in {root}"
        return _opened(claim, root, options, picked)
    steps = _steps(root, candidates)
    if steps is not None:
        runs = sorted({step.parent for step in steps.values()})
        if len(runs) > 1:
            raise _several_runs(root, steps)
        names = natural_sorted(step.name for step in steps.values())
        newest = next(claim for claim, step in steps.items() if step.name == names[-1])
        note = (f"took the newest step {names[-1]} of {runs[0]} (steps there: {', '.join(names)}); --tag picks "
                "another")
        return _opened(newest, root, options, note, names)
    raise _ambiguous(root, candidates)


def _open_tagged(root: Path, candidates: list[Claim], options: OpenOptions) -> LazyCheckpoint:
    own = [claim for claim in candidates if claim.path == root and claim.whole_folder]
    if own:
        return _tag_of_one_checkpoint(root, own, options)
    tag, untagged = options.tag, OpenOptions(None, options.strict, options.entry)
    steps = _steps(root, candidates) or {}
    named = [claim for claim in candidates if tag in (claim.path.name, claim.label(root))
             or (claim in steps and steps[claim].name == tag)]
    if len(named) == 1:
        run = steps[named[0]].parent if named[0] in steps else None
        names = natural_sorted(step.name for step in steps.values() if step.parent == run) if run else None
        return _opened(named[0], root, untagged, f"read {named[0].label(root)}, as --tag {tag} asks", names)
    if named:
        raise CogExportError(f"--tag {quoted(tag)} names {len(named)} checkpoints in {root}: "
                             f"{', '.join(claim.label(root) for claim in named)}; point at one")
    if steps:
        listing = ", ".join(natural_sorted(step.name for step in steps.values()))
        raise CogExportError(f"--tag {quoted(tag)} is not a step of {root} (steps there: {listing})")
    there = ", ".join(claim.label(root) for claim in candidates) or "nothing cogexport reads"
    raise CogExportError(f"--tag {quoted(tag)} names no checkpoint in {root} (it holds {there})")


def _tag_of_one_checkpoint(root: Path, own: list[Claim], options: OpenOptions) -> LazyCheckpoint:
    """--tag on a folder that is a checkpoint itself: a tag of a reader's own (a DeepSpeed save dir's); anything else
    has no tags."""
    tagged = next((claim for claim in own if claim.reader.own_tags), None)
    if tagged is not None:
        return _opened(tagged, root, options, "")
    if options.tag != root.name:
        raise CogExportError(f"--tag {quoted(options.tag)}: {root} is one checkpoint already ({own[0].what}); drop "
                             "--tag or point at the run folder")
    return _opened(own[0], root, OpenOptions(None, options.strict, options.entry), "")


# -- the rules -------------------------------------------------------------------------------------------------
def _without_copies(root: Path, candidates: list[Claim]) -> list[Claim]:
    """A checkpoint folder's consolidated copy inside it (``accelerate merge-weights`` into checkpoint-N, a model
    exported into the DeepSpeed checkpoint folder) is no second candidate when it holds the same tensors (names and
    shapes; a copy may be in another dtype): the original is read, and a note names the copy."""
    kept = list(candidates)
    for original in [claim for claim in candidates if claim.whole_folder]:
        beside = [claim for claim in candidates if claim.reader.may_be_a_copy and not claim.whole_folder
                  and original.path in (claim.path, claim.path.parent)]
        if len(beside) == 1 and _same_tensors(original, beside[0]):
            kept.remove(beside[0])
            copy = beside[0].main_file()
            original.notes.append(f"{copy.relative_to(root) if copy.is_relative_to(root) else copy} beside it holds "
                                  "the same tensors (names and shapes): a consolidated copy, not read; point at it "
                                  "to read it instead")
    return kept


def _same_tensors(first: Claim, second: Claim) -> bool:
    try:
        with first.open(OpenOptions(strict=False)) as one, second.open(OpenOptions()) as other:
            return len(one) > 0 and {n: t.shape for n, t in one.items()} == {n: t.shape for n, t in other.items()}
    except CogExportError:
        return False  # either cannot be read as it is: both stay candidates, and the user is asked


def step_folder(claim: Claim, root: Path) -> Path | None:
    """The step folder a claim is (or lies in), below ``root``: checkpoint-N, step-N, ... holding the checkpoint."""
    for folder in (claim.path, claim.path.parent):
        if folder != root and folder.is_dir() and STEP_NUMBER.match(folder.name) and folder.is_relative_to(root):
            return folder
    return None


def _steps(root: Path, candidates: list[Claim]) -> dict[Claim, Path] | None:
    """Each candidate's step folder, when every candidate is the one checkpoint of a step folder; else None."""
    steps = {claim: step_folder(claim, root) for claim in candidates}
    if any(step is None for step in steps.values()):
        return None
    folders = list(steps.values())
    if len(set(folders)) != len(folders):  # a step holding two checkpoints: not a rule's to settle
        return None
    return steps


def _opened(claim: Claim, root: Path, options: OpenOptions, picked: str,
            steps: list[str] | None = None) -> LazyCheckpoint:
    _refuse_entry(options, claim.reader, claim.path)
    checkpoint = claim.open(options)
    info = checkpoint.info
    step = step_folder(claim, root)
    if step is not None and info.tag is None:
        info.tag, info.step = step.name, step_number(step) if info.step is None else info.step
    if steps and step is not None and not claim.reader.own_tags:
        info.tags = steps
    info.picked = picked
    info.notes[:0] = [picked] * bool(picked) + claim.notes
    return _named(checkpoint, claim.what, str(root if claim.path == root else root / claim.label(root)))


def _named(checkpoint: LazyCheckpoint, what: str, where: str) -> LazyCheckpoint:
    """``info.origin``: the checkpoint read, in a phrase (what, where, its tag and step when it has them)."""
    info = checkpoint.info
    info.origin = f"{what} {where}" + (f", tag {info.tag}" if info.tag and info.tag != Path(where).name else "") \
        + (f", step {info.step}" if info.step is not None else "")
    return checkpoint


def _refuse_entry(options: OpenOptions, reader: Reader, path: Path) -> None:
    """Only some formats keep other state dicts (an EMA) beside the model (DeepSpeed's, torch.save files): asking
    another for one would silently give the model's weights."""
    if options.entry not in (None, "module") and not reader.takes_entry:
        raise CogExportError(f"{path} holds no {quoted(options.entry)} state dict ({reader.name} checkpoints hold one "
                             "set of weights)")


# -- the lines that say why not --------------------------------------------------------------------------------
def _nothing_here(root: Path) -> CogExportError:
    try:
        empty = not any(root.iterdir())
    except OSError as error:
        return CogExportError(f"cannot read {root}: {error.strerror}")
    looked = looks_for()
    if empty:
        return CogExportError(f"{root} is empty: expected {looked}")
    return CogExportError(f"{root} holds no checkpoint cogexport can read (looked in it and up to {SEARCH_DEPTH} "
                          f"folders down for {looked})")


def _several_runs(root: Path, steps: dict[Claim, Path]) -> CogExportError:
    runs = sorted({step.parent for step in steps.values()})
    names = {run: ", ".join(natural_sorted(step.name for step in steps.values() if step.parent == run)) for run in runs}
    listing = "; ".join(f"{run.relative_to(root)} ({names[run]})" for run in runs)
    return CogExportError(f"{root} holds the checkpoints of several runs: {listing}; point at one run's folder")


def _step_groups(root: Path, candidates: list[Claim]) -> tuple[list[str], set[Claim]]:
    """A run's steps among the candidates, each run in one phrase, and the candidates they account for."""
    steps = {claim: step_folder(claim, root) for claim in candidates}
    runs: dict[Path, list[Claim]] = {}
    for claim, step in steps.items():
        if step is not None:
            runs.setdefault(step.parent, []).append(claim)
    parts, grouped = [], set()
    for run, claims in sorted(runs.items()):
        names = natural_sorted(steps[claim].name for claim in claims)
        if len(claims) > 1 and len(names) == len(claims):
            where = f" in {run.relative_to(root)}" if run != root else ""
            readers = "/".join(sorted({claim.reader.name for claim in claims}))
            parts.append(f"the {readers} checkpoint steps {', '.join(names)}{where} (pick one with --tag {names[-1]})")
            grouped.update(claims)
    return parts, grouped


def _ambiguous(root: Path, candidates: list[Claim]) -> CogExportError:
    """Every candidate named, a run's steps together, and how to name one."""
    parts, grouped = _step_groups(root, candidates)
    parts += [f"{claim.what} {claim.label(root)}" + (f" ({claim.detail})" if claim.detail else "")
              for claim in candidates if claim not in grouped]
    if not grouped and all(claim.whole_folder and claim.path != root for claim in candidates):
        labels = [claim.label(root) for claim in candidates]
        listing = ", ".join(labels[:-1]) + f" and {labels[-1]}"
        return CogExportError(f"{root} holds {len(labels)} checkpoints, {listing}: point at one (or name it with "
                              f"--tag {labels[0]})")
    return CogExportError(f"{root} holds more than one set of weights: {'; '.join(parts)}; point at one, or name it "
                          "with --tag; cogexport will not guess which one you mean")
