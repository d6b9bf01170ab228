"""Open the one checkpoint the user means: every reader's claims on the path are gathered (claims.py), and exactly one
is opened, by the user's word or by a rule stated here, and named in the checkpoint's notes; otherwise one line says
what was found and how to name one.

The rules, in order:

- ``--tag`` on a folder a reader with tags of its own claims whole (a DeepSpeed save dir) names one of its tags (or
  its universal checkpoint), or the folder itself by its name; anywhere else it names a checkpoint below the folder
  by its folder or file name (a run's step: ``--tag step-2``), its path from there, or one of the tags its claim is
  also named by (a Hugging Face Trainer checkpoint-2's ``global_step2``, which the reader then reads).
- No claim: the folder holds nothing any reader reads, and the line says what each looked for.
- One claim: it is read (named in a note when it lies below the folder given).
- Every claim a step of the same run (a folder named checkpoint-N, checkpoint_N, step-N, global_stepN or
  finetrainers_step_N, holding one checkpoint of any format): the newest step by natural order is read, and a note
  says so. Steps of several runs: point at one run.
- Anything else (two checkpoints side by side, a checkpoint and loose weights, steps and exported weights) is
  refused with every candidate named.

Never candidates of their own: a DeepSpeed checkpoint-N's adapter copy (``pytorch_lora_weights.safetensors``, CogVideo
finetune/); a consolidated Hugging Face writer save's ``sharded/`` (the same save in pieces); the only loose weights
inside a checkpoint's folder (``accelerate merge-weights`` into checkpoint-N, the Hugging Face Trainer's
``model.safetensors`` beside DeepSpeed's save, a ``save_pretrained`` copy): once the checkpoint is open they are
judged against it (copies.py), and are its copy (the same names and shapes in any dtype: a note names it, a
lower-precision copy when narrower), its ZeRO-3 placeholders (the same names, shape [0] where DeepSpeed had
partitioned the tensor: no weights, a note names them), or a second set of weights (other names or shapes, or
unreadable): refused, unless ``--tag`` named the checkpoint; a folder's weights in other forms
(``stem.fp16.safetensors`` variants, ``pytorch_model.bin`` beside safetensors weights); other weight files of a
Diffusers model folder (its config.json names its class: it is the files from_pretrained reads, the others named in a
note; with none of those, it is refused, model_folder.py); training state (optimizer, scheduler, RNG, trainer files); hidden
folders. One rank's file of a distributed save (PyTorch's Hugging Face writer) is never read as a model: pointing at
it is refused. Nor are ZeRO-3's empty placeholders, whatever reads them: a checkpoint holding any is refused
(``inspect``: a problem).

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
from .copies import NotACopy, judge_copy, possible_copies, refuse_placeholders, shown_copy
from .dcp_locate import STEP_NUMBER, step_number
from .locate import natural_sorted
from .text_files import not_weights_message, text_file_kind
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
        opened = _open_folder(paths[0] if paths[0].is_dir() else paths[0].parent, options)
    else:
        opened = _open_several(paths, options) if len(paths) > 1 else _open_file(paths[0], options)
        opened = _named(opened, phrase_of(opened.info.format), ", ".join(map(str, paths)))
    try:
        refuse_placeholders(opened, strict)
    except BaseException:
        opened.close()
        raise
    return opened


def _open_several(paths: list[Path], options: OpenOptions) -> LazyCheckpoint:
    reader = reader_of_several(paths)
    if reader is None or reader.open_several is None:
        raise CogExportError(f"no reader reads {', '.join(map(str, paths))} together as one checkpoint; point at one")
    return reader.open_several(paths, options)


def _open_file(path: Path, options: OpenOptions) -> LazyCheckpoint:
    reader = reader_of_file(path)
    if reader is None or reader.open_file is None:
        raise CogExportError(f"{path} is no file cogexport reads (it looks for {looks_for()})")
    kind = text_file_kind(path)
    # A text file no reader names is not weights of any kind (the reader of files of any name would call it damaged);
    # an LFS pointer is one whatever its name (model.safetensors, never fetched).
    if kind is not None and (reader.any_file or kind == "a Git LFS pointer"):
        raise CogExportError(not_weights_message(path, kind))
    if options.tag is not None and not reader.own_tags:
        raise CogExportError(f"--tag {quoted(options.tag)} does not apply to {path}: one file has no steps or tags; "
                             "drop --tag")
    _refuse_entry(options, reader, path)
    return reader.open_file(path, options)


def _open_folder(root: Path, options: OpenOptions) -> LazyCheckpoint:
    candidates = [claim for claim in gather(root) if not claim.companion]
    copies = possible_copies(candidates)
    candidates = [claim for claim in candidates if claim not in copies.values()]
    if options.tag is not None:
        return _open_tagged(root, candidates, options, copies)
    if not candidates:
        raise _nothing_here(root)
    if len(candidates) == 1:
        claim = candidates[0]
        picked = "" if claim.path == root else f"read {claim.label(root)}, the only checkpoint in {root}"
        return _opened(claim, root, options, picked, copy=copies.get(claim))
    steps = _steps(root, candidates)
    if steps is not None:
        runs = sorted({step.parent for step in steps.values()})
        if len(runs) > 1:
            raise _several_runs(root, steps)
        names = natural_sorted(step.name for step in steps.values())
        newest = next(claim for claim, step in steps.items() if step.name == names[-1])
        note = (f"took the newest step {names[-1]} of {runs[0]} (steps there: {', '.join(names)}); --tag picks "
                "another")
        return _opened(newest, root, options, note, names, copies.get(newest))
    raise _ambiguous(root, candidates)


def _open_tagged(root: Path, candidates: list[Claim], options: OpenOptions,
                 copies: dict[Claim, Claim]) -> LazyCheckpoint:
    own = [claim for claim in candidates if claim.path == root and claim.whole_folder]
    if own:
        return _tag_of_one_checkpoint(root, own, options, copies)
    tag, untagged = options.tag, OpenOptions(None, options.strict, options.entry)
    steps = _steps(root, candidates) or {}
    named = [claim for claim in candidates if tag in (claim.path.name, claim.label(root), *claim.also_named)
             or (claim in steps and steps[claim].name == tag)]
    if len(named) == 1:
        run = steps[named[0]].parent if named[0] in steps else None
        names = natural_sorted(step.name for step in steps.values() if step.parent == run) if run else None
        reached = options if tag in named[0].also_named else untagged  # one of its own tags: the reader's to read
        return _opened(named[0], root, reached, f"read {named[0].label(root)}, as --tag {tag} asks", names,
                       copies.get(named[0]), named=True)
    if named:
        raise CogExportError(f"--tag {quoted(tag)} names {len(named)} checkpoints in {root}: "
                             f"{', '.join(claim.label(root) for claim in named)}; point at one")
    if steps:
        listing = ", ".join(natural_sorted(step.name for step in steps.values()))
        raise CogExportError(f"--tag {quoted(tag)} is not a step of {root} (steps there: {listing})")
    there = ", ".join(claim.label(root) for claim in candidates) or "nothing cogexport reads"
    raise CogExportError(f"--tag {quoted(tag)} names no checkpoint in {root} (it holds {there})")


def _tag_of_one_checkpoint(root: Path, own: list[Claim], options: OpenOptions,
                           copies: dict[Claim, Claim]) -> LazyCheckpoint:
    """--tag on a folder that is a checkpoint itself: the folder's own name (``--tag checkpoint-2`` on checkpoint-2),
    or a tag of a reader's own (a DeepSpeed save dir's); anything else has no tags."""
    untagged = OpenOptions(None, options.strict, options.entry)
    if options.tag == root.name and not (root / options.tag).exists():
        return _opened(own[0], root, untagged, "", copy=copies.get(own[0]), named=True)
    tagged = next((claim for claim in own if claim.reader.own_tags), None)
    if tagged is None:
        raise CogExportError(f"--tag {quoted(options.tag)}: {root} is one checkpoint already ({own[0].what}); drop "
                             "--tag or point at the run folder")
    return _opened(tagged, root, options, "", copy=copies.get(tagged), named=True)


# -- the rules -------------------------------------------------------------------------------------------------
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


def _opened(claim: Claim, root: Path, options: OpenOptions, picked: str, steps: list[str] | None = None,
            copy: Claim | None = None, named: bool = False) -> LazyCheckpoint:
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
    if copy is not None:
        info.notes.append(_copy_note(checkpoint, claim, copy, root, named))
    return _named(checkpoint, claim.what, str(root if claim.path == root else root / claim.label(root)))


def _copy_note(checkpoint: LazyCheckpoint, claim: Claim, copy: Claim, root: Path, named: bool) -> str:
    """What the only loose weights inside the checkpoint's folder are (copies.py). Not its copy, or unreadable: two
    sets of weights, refused unless the user named the checkpoint (--tag), when a note says so."""
    shown = shown_copy(copy, root)
    try:
        return judge_copy(checkpoint, copy, shown)
    except NotACopy as why:
        if not named:
            checkpoint.close()
            label = claim.label(root) if claim.path != root else root.name
            raise CogExportError(f"{root} holds more than one set of weights: {claim.what} {label}, and {shown} inside "
                                 f"it, which is not its copy ({why}); point at that file to read it, or name the "
                                 f"checkpoint with --tag {label}; cogexport will not guess which one you mean"
                                 ) from None
        return f"{shown} inside it is not its copy ({why}): not read"


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
