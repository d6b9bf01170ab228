"""Find a DeepSpeed checkpoint's tag and its rank files, from whatever folders or files the user points at.

Accepted: a save dir (with ``latest``), a tag dir, a model-states file, an HF Trainer / accelerate
``checkpoint-N/`` folder, and several of these at once for multi-node runs whose ranks sit on different
disks. Rank files are collected from all of them and sorted numerically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CogExportError, quoted

MODEL_STATES = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
ZERO3_MODEL_STATES = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
OPTIM_STATES = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
PIPELINE_LAYER = re.compile(r"^layer_\d+-model_states\.pt$")
UNIVERSAL_OPTIMIZER_STATE = Path("zero") / "optimizer_state.pt"


def rank_file_identity(file_name: str) -> tuple[str, int, int] | None:
    """What a DeepSpeed file name says a file is: ("model states" | "optimizer states", data-parallel rank,
    model-parallel rank)."""
    found = MODEL_STATES.match(file_name)
    if found:
        return "model states", 0, int(found.group(1))
    found = ZERO3_MODEL_STATES.match(file_name)
    if found:
        return "model states", int(found.group(1)), int(found.group(2))
    found = OPTIM_STATES.match(file_name)
    if found:
        return "optimizer states", int(found.group(2)), int(found.group(3))
    return None


def optim_file_name(rank: int, bf16: bool, mp_rank: int = 0) -> str:
    return f"{'bf16_' if bf16 else ''}zero_pp_rank_{rank}_mp_rank_{mp_rank:02d}_optim_states.pt"


def zero3_model_file_name(rank: int, mp_rank: int = 0) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_{mp_rank:02d}_model_states.pt"


def model_file_name(mp_rank: int = 0) -> str:
    return f"mp_rank_{mp_rank:02d}_model_states.pt"


@dataclass
class RankFiles:
    """Every file of one tag, wherever it was found."""

    tag: str
    tag_dirs: list[Path]
    model_states: Path | None = None  # mp_rank_00_model_states.pt (stages 0-2)
    zero3_model_states: dict[int, Path] = field(default_factory=dict)
    optim_states: dict[int, Path] = field(default_factory=dict)
    bf16_prefixed: set[bool] = field(default_factory=set)
    tags_available: list[str] = field(default_factory=list)
    save_dirs: list[Path] = field(default_factory=list)
    # Tensor (model) parallelism, as DeepSpeed AutoTP saves it: the fields above are model-parallel rank mp_rank's
    # files; each other model-parallel rank's are in model_parallel (on mp rank 0's RankFiles only).
    mp_rank: int = 0
    model_parallel: dict[int, "RankFiles"] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return " or ".join(str(d) for d in self.tag_dirs)

    def of_mp_rank(self, mp_rank: int) -> "RankFiles":
        """The files of model-parallel rank ``mp_rank`` (made empty on first use)."""
        if mp_rank == self.mp_rank:
            return self
        if mp_rank not in self.model_parallel:
            self.model_parallel[mp_rank] = RankFiles(self.tag, self.tag_dirs, tags_available=self.tags_available,
                                                     save_dirs=self.save_dirs, mp_rank=mp_rank)
        return self.model_parallel[mp_rank]


def is_universal_folder(folder: Path) -> bool:
    """A DeepSpeed universal checkpoint (its own layout, though it holds a model-states file too)."""
    return (folder / UNIVERSAL_OPTIMIZER_STATE).is_file()


def _is_tag_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not is_universal_folder(path) and any(
            MODEL_STATES.match(p.name) or ZERO3_MODEL_STATES.match(p.name) or OPTIM_STATES.match(p.name)
            for p in path.iterdir()
        )
    except OSError:
        return False


def natural_sorted(names) -> list[str]:
    """Names with their numbers compared as numbers: global_step10 after global_step9."""
    return sorted(set(names), key=lambda name: [(0, int(t), "") if t.isdigit() else (1, 0, t)
                                                for t in re.split(r"(\d+)", name)])


def list_tags(save_dir: Path) -> list[str]:
    """Tag dirs directly below a save dir, in natural order."""
    return natural_sorted(p.name for p in save_dir.iterdir() if _is_tag_dir(p))


_MAX_TAG_BYTES = 255  # a tag is one folder name


def _read_latest(save_dir: Path) -> str | None:
    latest = save_dir / "latest"
    if not latest.is_file():
        return None
    try:
        with open(latest, "rb") as handle:
            content = handle.read(_MAX_TAG_BYTES + 1)
    except OSError as error:
        raise CogExportError(f"cannot read {latest}: {error.strerror}") from None
    if not content.strip():
        raise CogExportError(f"{latest} is empty; pass --tag to choose a checkpoint")
    try:
        tag = content.decode("utf-8").strip()
    except UnicodeDecodeError:
        tag = None
    if tag is None or len(content) > _MAX_TAG_BYTES or not is_tag_name(tag):
        raise CogExportError(f"{latest} does not hold a tag name (it holds {quoted(content, 40)}; damaged?); pass "
                             "--tag to choose a checkpoint")
    return tag


def is_tag_name(tag: str) -> bool:
    """A tag names one folder: no path separators, no '.' or '..', nothing unprintable."""
    return bool(tag) and tag not in (".", "..") and "/" not in tag and "\\" not in tag and tag.isprintable()


@dataclass
class _Place:
    """One user-given path: either a tag dir itself, or a save dir holding tag dirs."""

    path: Path
    tag_dir: Path | None
    latest: str | None
    tags: list[str]
    damaged_latest: str | None = None  # why 'latest' could not be read: an error only when no --tag is given


def _classify(path: Path) -> _Place:
    if not path.exists():
        raise CogExportError(f"{path} does not exist")
    if path.is_file():
        if not (MODEL_STATES.match(path.name) or ZERO3_MODEL_STATES.match(path.name)):
            raise CogExportError(f"{path} is not a DeepSpeed model-states file; point at the checkpoint folder")
        return _Place(path, path.parent, None, [path.parent.name])
    if _is_tag_dir(path):
        return _Place(path, path, None, [path.name])
    tags = list_tags(path)
    try:
        latest, damaged = _read_latest(path), None
    except CogExportError as error:
        latest, damaged = None, str(error)
    if damaged and not tags:
        raise CogExportError(damaged)
    if not tags and latest is None:
        emptiness = "is empty" if not any(path.iterdir()) else "holds no checkpoint cogexport can read"
        raise CogExportError(
            f"{path} {emptiness}: expected a DeepSpeed or SAT save dir ('latest', tag folders with *_model_states.pt), "
            "a tag folder such as global_step100, a checkpoint-N folder, a DCP save (.metadata beside __0_0.distcp "
            "files) or a run folder of them, or safetensors weights"
        )
    return _Place(path, None, latest, tags, damaged)


def _choose_tag(places: list[_Place], tag: str | None) -> str:
    if tag is not None:
        if not is_tag_name(tag):
            raise CogExportError(f"--tag {quoted(tag)} is not a tag name (one folder name, such as global_step500)")
        return tag
    damaged = next((p.damaged_latest for p in places if p.damaged_latest), None)
    if damaged:
        raise CogExportError(damaged)
    latests = {p.latest for p in places if p.latest is not None}
    if len(latests) > 1:
        raise CogExportError(f"mixed tags: the 'latest' files name {', '.join(map(quoted, sorted(latests)))}; pass --tag")
    if latests:
        return latests.pop()
    named = {p.tag_dir.name for p in places if p.tag_dir is not None}
    if len(named) > 1:
        raise CogExportError(f"mixed tags: the folders given are tags {', '.join(sorted(named))}; give one tag's folders")
    if named:
        return named.pop()
    all_tags = natural_sorted(t for p in places for t in p.tags)
    if len(all_tags) == 1:
        return all_tags[0]
    raise CogExportError(
        f"{places[0].path} holds several checkpoints and no 'latest' file: pass --tag (one of {', '.join(all_tags)})"
    )


def resolve_tag(paths: list[Path], tag: str | None = None) -> str:
    """The tag ``locate`` would read for these paths."""
    return _choose_tag([_classify(Path(p)) for p in paths], tag)


def ema_source(paths: list[Path], tag: str | None) -> tuple[list[Path], str | None]:
    """Point at the EMA copy SAT saves beside a checkpoint: tag '1000' -> '1000-ema'."""
    places = [_classify(Path(p)) for p in paths]
    if len(places) == 1 and places[0].tag_dir is not None:
        sibling = places[0].tag_dir.with_name(places[0].tag_dir.name + "-ema")
        if not sibling.is_dir():
            raise CogExportError(f"no EMA copy of {places[0].tag_dir}: expected {sibling}")
        return [sibling], None
    chosen = _choose_tag(places, tag)
    ema = chosen if chosen.endswith("-ema") else f"{chosen}-ema"
    if not any((place.path / ema).is_dir() for place in places):
        raise CogExportError(f"no EMA copy of tag {quoted(chosen)}: expected {places[0].path / ema}")
    return paths, ema


def locate(paths: list[Path], tag: str | None = None) -> RankFiles:
    """Resolve the user's paths to one tag and every rank file of it."""
    places = [_classify(Path(p)) for p in paths]
    chosen = _choose_tag(places, tag)
    tag_dirs: list[Path] = []
    for place in places:
        if place.tag_dir is not None:
            if tag is None and place.tag_dir.name != chosen and len(places) > 1:
                raise CogExportError(f"mixed tags: {place.tag_dir} is tag {place.tag_dir.name}, the checkpoint's is {chosen}")
            tag_dirs.append(place.tag_dir)
            continue
        candidate = place.path / chosen
        if candidate.is_dir():
            tag_dirs.append(candidate)
        elif len(places) == 1 or place.latest is not None or tag is not None:
            source = "--tag" if tag is not None else f"{place.path / 'latest'}"
            available = ", ".join(place.tags) or "none"
            raise CogExportError(f"{source} names tag {quoted(chosen)} but {candidate} does not exist (tags here: {available})")
        else:
            raise CogExportError(f"mixed tags: {place.path} has no tag {quoted(chosen)} (it has {', '.join(place.tags)})")
    files = RankFiles(tag=chosen, tag_dirs=tag_dirs, tags_available=natural_sorted(t for p in places for t in p.tags),
                      save_dirs=[p.path for p in places if p.tag_dir is None])
    for tag_dir in tag_dirs:
        _collect(tag_dir, files)
    if files.model_states is None and not files.zero3_model_states:
        expected = zero3_model_file_name(0) if files.model_parallel else model_file_name(0)
        raise CogExportError(f"no model-states file for tag {quoted(chosen)} in {files.where}: expected {expected} "
                             "(add the folder of the node that ran rank 0)")
    return files


def _collect(tag_dir: Path, files: RankFiles) -> None:
    for path in sorted(tag_dir.iterdir()):
        name = path.name
        if PIPELINE_LAYER.match(name):
            raise CogExportError(f"{tag_dir} is a pipeline-parallel checkpoint ({name}); cogexport reads data-parallel ZeRO checkpoints")
        found = MODEL_STATES.match(name) or ZERO3_MODEL_STATES.match(name) or OPTIM_STATES.match(name)
        if not found:
            continue
        # a tensor-parallel run (DeepSpeed AutoTP) saves one set of ZeRO files per model-parallel rank
        of_rank = files.of_mp_rank(int(found.groups()[-1]))
        if MODEL_STATES.match(name):
            _add(of_rank, "model_states", None, path)
        elif ZERO3_MODEL_STATES.match(name):
            _add(of_rank, "zero3_model_states", int(found.group(1)), path)
        else:
            of_rank.bf16_prefixed.add(found.group(1) is not None)
            _add(of_rank, "optim_states", int(found.group(2)), path)


def _add(files: RankFiles, kind: str, rank: int | None, path: Path) -> None:
    # Paths stay as the user gave them (outputs go next to them); the same file reached twice is one file.
    if rank is None:
        if files.model_states is not None and files.model_states.resolve() != path.resolve():
            raise CogExportError(f"two copies of {path.name}: {files.model_states} and {path}; give each rank's folder once")
        files.model_states = files.model_states or path
        return
    table: dict[int, Path] = getattr(files, kind)
    if rank in table and table[rank].resolve() != path.resolve():
        raise CogExportError(f"rank {rank} appears twice: {table[rank]} and {path}; give each rank's folder once")
    table.setdefault(rank, path)
