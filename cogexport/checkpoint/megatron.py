"""Read a Megatron-Core distributed checkpoint (``dist_checkpointing.save`` with the ``torch_dist`` backend, as
Megatron-LM, NeMo and Megatron-Bridge save) as a lazy mapping of the model's per-layer names to tensors.

The layout (docs: training-stacks.md):

  RUN/latest_checkpointed_iteration.txt   the tracker: the iteration last saved (or ``release``); it, not the listing,
                                          says which iteration a run folder means
  RUN/iter_NNNNNNN/                       one iteration: a DCP save (``.metadata``, ``__<rank>_0.distcp``) and
                                          ``metadata.json`` ({"sharded_backend": "torch_dist", ...}); older
                                          Megatron-Core wrote the common state to ``common.pt`` beside it

Every key of the DCP save is placed: the model's tensors (no group prefix; a Megatron-Bridge model's start with
``module.``, dropped as DDP's is); ``optimizer.*`` (the optimizer's states, ``fp32_param`` masters, the distributed
optimizer's buckets) and ``rng_state/...`` are training state, never weights; ``common_state/...`` (the run's
arguments as a pickled argparse Namespace, the iteration, the scheduler) is never unpickled: a pickle of the run's
arguments may name any class; ``..._extra_state/...`` (Transformer Engine's per-layer FP8 metadata) holds no weights.

Homogeneous layers are one tensor with a leading layer axis (``decoder.layers.self_attention.linear_qkv.weight`` is
[L, ...]): a ``layers`` component followed by no layer number. Each layer is handed out under its own name
(``decoder.layers.3.self_attention.linear_qkv.weight``) as a lazy tensor reading only that layer's chunks.

An iteration saved with the ``zarr`` backend (the default before torch_dist) is read alike, through
megatron_zarr.py: the same keys, one zarr array each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CogExportError, quoted
from .base import CheckpointInfo, LazyCheckpoint, ReaderFacts
from .dcp import DcpFiles, dtype_name, module_name
from .dcp_metadata import METADATA_FILE, TensorEntry
from .locate import natural_sorted
from .megatron_experts import experts_at, per_expert
from .megatron_flattened import flattened_view, is_flattened_form
from .megatron_masters import LOW, MASTER_STATES, IterationFiles, masters_of
from .megatron_zarr import ZarrFiles
from .text_files import read_checkpoint_json
from .training_state import is_training_state_group

TRACKER = "latest_checkpointed_iteration.txt"
BACKEND_FILE = "metadata.json"
COMMON_FILE = "common.pt"  # the common state of Megatron-Core before 0.1x put it inside the DCP save
ITERATION = re.compile(r"^iter_(\d+)$")
RELEASE = "release"
TORCH_DIST = "torch_dist"
ZARR = "zarr"  # the default before torch_dist (megatron-core 0.8-0.15 write it): megatron_zarr.py
READ_BACKENDS = (TORCH_DIST, ZARR)
LAYERS = "layers"
BUCKETS = "optimizer.distributed."  # the distributed optimizer's dp_reshardable buckets and other per-DP-group state
OPTIMIZER_STATE = re.compile(r"^optimizer\.state\.([^.]+)\.(.+)$")  # optimizer.state.<state>.<parameter key>
# Megatron-Bridge's training state beside the weights (the run folder's copy and each iteration's)
BRIDGE_STATE = re.compile(r"^(latest_)?train_state\.pt$|^run_config\.yaml$")


@dataclass
class MegatronFacts(ReaderFacts):
    """What a Megatron-Core checkpoint says of itself: its backend, the ranks that wrote it, what it holds beside the
    model, and the keys saved stacked on a layer axis (handed out layer by layer)."""

    writer: str | None = None
    world_size: int | None = None
    contents: list[str] = field(default_factory=list)
    sharded_backend: str | None = None
    stacked: list[str] = field(default_factory=list)


# -- finding the iteration -------------------------------------------------------------------------------------------
def is_iteration(folder: Path) -> bool:
    return (ITERATION.match(folder.name) is not None or folder.name == RELEASE) and (folder / BACKEND_FILE).is_file()


def is_run(folder: Path) -> bool:
    return (folder / TRACKER).is_file()


def iterations(run: Path) -> list[str]:
    try:
        return natural_sorted(p.name for p in run.iterdir() if p.is_dir() and is_iteration(p))
    except OSError:
        return []


def tracked_iteration(run: Path) -> str:
    """The folder name the tracker names: ``iter_`` and the number in 7 digits, or ``release``."""
    path = run / TRACKER
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise CogExportError(f"cannot read {path} ({error}); name the iteration with --tag") from None
    if text == RELEASE:
        return RELEASE
    if not text.isdigit():
        raise CogExportError(f"{path} is damaged: it names no iteration ({quoted(text)}); name one with --tag "
                             f"(iterations there: {', '.join(iterations(run)) or 'none'})")
    return f"iter_{int(text):07d}"


def chosen_iteration(run: Path, tag: str | None) -> tuple[Path, str]:
    """The iteration folder ``--tag`` names (its folder name or number), else the tracker's; and a note saying why."""
    found = iterations(run)
    if tag is not None:
        name = f"iter_{int(tag):07d}" if tag.isdigit() else tag
        if name not in found:
            raise CogExportError(f"--tag {tag} is not an iteration of {run} (iterations there: "
                                 f"{', '.join(found) or 'none'})")
        return run / name, ""
    name = tracked_iteration(run)
    if name not in found:
        raise CogExportError(f"{run / TRACKER} names {name}, which {run} does not hold (iterations there: "
                             f"{', '.join(found) or 'none'}); copy that iteration's folder, or name one with --tag")
    others = f" (iterations there: {', '.join(found)}); --tag picks another" if len(found) > 1 else ""
    return run / name, f"read {name}, the iteration {TRACKER} names{others}"


def sharded_backend(folder: Path) -> tuple[str, str]:
    """metadata.json's backend (torch_dist or zarr) and its label with the version, once it is one cogexport reads;
    one line otherwise."""
    path = folder / BACKEND_FILE
    data = read_checkpoint_json(path)
    backend = data.get("sharded_backend") if isinstance(data, dict) else None
    version = data.get("sharded_backend_version") if isinstance(data, dict) else None
    if backend not in READ_BACKENDS:
        raise CogExportError(f"{path} names the backend {quoted(backend)}; cogexport reads Megatron-Core's "
                             f"{' and '.join(READ_BACKENDS)} checkpoints only")
    if backend == TORCH_DIST and not (folder / METADATA_FILE).is_file():
        raise CogExportError(f"{folder} lacks its {METADATA_FILE} (a {TORCH_DIST} save writes it last: the save did "
                             "not finish, or the folder was copied in part); copy the whole iteration folder again")
    return backend, f"{backend} v{version}" if version is not None else str(backend)


# -- placing the keys ------------------------------------------------------------------------------------------------
@dataclass
class KeySets:
    """The save's keys, each placed: the model's tensors (key -> name without ``module.``), the parameters the
    optimizer holds state for, and what everything else is."""

    model: dict[str, str] = field(default_factory=dict)
    optimized: dict[str, set[str]] = field(default_factory=dict)  # the model's key -> its states (exp_avg, ...)
    masters: dict[str, str] = field(default_factory=dict)  # the model's key -> its fp32 master's key, read instead
    master_state: str | None = None  # the optimizer state the masters are saved under (fp32_param or param)
    buckets: int = 0  # tensors of the distributed optimizer's flat buckets (optimizer.distributed.*), never read
    unplaced: list[str] = field(default_factory=list)  # parameters whose states are flattened with no record of how
    held: dict[str, int] = field(default_factory=dict)  # what else the save holds -> how many keys


def what_is_held(key: str, tensor: bool) -> str | None:
    """What a key that is not a model tensor is, in a phrase; None for a model tensor."""
    group, last = key.split("/", 1)[0].split(".", 1)[0], key.split("/", 1)[0].rsplit(".", 1)[-1]
    if group == "optimizer":
        return "optimizer state (never weights)"
    if group == "rng_state":
        return "RNG states (never weights)"
    if group == "common_state":
        return "the common state: the run's arguments, iteration and scheduler (a pickle, not loaded: the run's " \
               "arguments may name any class)"
    if last.startswith("_extra_state"):
        return "each layer's _extra_state (Transformer Engine's FP8 metadata where it is used; no weights)"
    if is_training_state_group(group):
        return "training state (never weights)"
    if not tensor:
        return "other pickled state (not loaded)"
    return None


def place_keys(files: IterationFiles) -> KeySets:
    sets = KeySets()
    for key, entry in files.metadata.entries.items():
        held = what_is_held(key, isinstance(entry, TensorEntry))
        if held is not None:
            sets.held[held] = sets.held.get(held, 0) + 1
            sets.buckets += key.startswith(BUCKETS) and isinstance(entry, TensorEntry)
            state = OPTIMIZER_STATE.match(key)
            if state and isinstance(entry, TensorEntry):
                sets.optimized.setdefault(state.group(2), set()).add(state.group(1))
            continue
        sets.model[key] = module_name((key,))
    if not sets.model:
        raise CogExportError(f"{files.folder} holds no model weights (only {', '.join(sorted(sets.held)) or 'nothing'})"
                             "; point at an iteration saved with the model")
    sets.unplaced = check_optimized_keys(files, sets)
    if not sets.unplaced:  # else no master is read: never some parameters at the masters' precision, some at bf16
        sets.master_state, sets.masters = masters_of(files, sets.optimized)
    return sets


def check_optimized_keys(files: IterationFiles, sets: KeySets) -> list[str]:
    """Megatron-Core keys each optimizer state by its parameter's own key, in the parameter's global shape: a state of
    a key the model lacks, or of another shape, means keys filed under the wrong kind (a damaged .metadata, the model
    moved under another group or a weight under the optimizer's); which tensors are the model cannot be told then.
    One exception: the states of a save recording no flattened shapes at all (megatron_flattened.py) that are in a
    flattened form of their parameter's shape, returned: megatron-core's layout without the record that places them."""
    entries, unrecorded = files.metadata.entries, []
    recorded = bool(getattr(files.metadata, "reformulated", None))
    for key, states in sets.optimized.items():
        state = f"optimizer.state.{sorted(states)[0]}.{key}"
        if key not in sets.model:
            raise CogExportError(f"{files.folder}: the optimizer holds state for {quoted(key)} ({quoted(state)}), "
                                 "which is not among the model's keys: the save's keys are filed under the wrong "
                                 "kind (a damaged .metadata?); copy the iteration folder again")
        shapes = {tuple(entries[f"optimizer.state.{name}.{key}"].size) for name in states}
        if shapes == {tuple(entries[key].size)}:
            continue
        if not recorded and all(is_flattened_form(shape, tuple(entries[key].size)) for shape in shapes):
            unrecorded.append(key)
            continue
        state = next(f"optimizer.state.{name}.{key}" for name in sorted(states)
                     if entries[f"optimizer.state.{name}.{key}"].size != entries[key].size)
        if recorded and is_flattened_form(tuple(entries[state].size), tuple(entries[key].size)):
            raise CogExportError(f"{files.folder}: {quoted(state)} is stored flattened "
                                 f"({list(entries[state].size)}, for its parameter's {list(entries[key].size)}) but "
                                 "the .metadata records no original shape for it, as it does for the save's other "
                                 "flattened tensors: the .metadata is damaged; copy the iteration folder again")
        raise CogExportError(f"{files.folder}: {quoted(state)} is {tuple(entries[state].size)}, its parameter "
                             f"{quoted(key)} {tuple(entries[key].size)}: the .metadata is damaged; copy the "
                             "iteration folder again")
    return unrecorded


def stacked_at(name: str) -> int | None:
    """Where a stacked key's layer number goes: the position after its ``layers`` component, when no number follows
    (``decoder.layers.mlp.linear_fc1.weight``); None for a per-layer or non-layer key."""
    parts = name.split(".")
    for index, part in enumerate(parts[:-1]):
        if part == LAYERS and not parts[index + 1].isdigit():
            return index + 1
    return None


def layer_name(name: str, at: int, layer: int) -> str:
    parts = name.split(".")
    return ".".join([*parts[:at], str(layer), *parts[at:]])


def unplaced_masters(files: IterationFiles, unplaced: list[str]) -> str:
    """Why the flattened masters of a save without megatron-core's record of their shapes are not read."""
    key = unplaced[0]
    state = next(name for name in files.metadata.entries
                 if (found := OPTIMIZER_STATE.match(name)) and found.group(2) == key)
    masters = any(f"optimizer.state.{name}.{k}" in files.metadata.entries for name in MASTER_STATES for k in unplaced)
    among = ", fp32 masters among them," if masters else ""
    return f" (its optimizer states of {len(unplaced)} parameters{among} are stored flattened, " \
           f"{quoted(state)} as {list(files.metadata.entries[state].size)} for its parameter's " \
           f"{list(files.metadata.entries[key].size)}: megatron-core 0.8-0.15's fully_sharded_model_space layout, " \
           "but the .metadata lacks the record of the shapes they were flattened from (megatron-core's " \
           "mcore_data: the save was rewritten by another tool?), so where each element goes cannot be told " \
           "exactly: not read)"


# -- the checkpoint --------------------------------------------------------------------------------------------------
class MegatronCheckpoint(LazyCheckpoint):
    """One iteration of a Megatron-Core run: the model's tensors under per-layer names, read lazily from its DCP
    save. ``run`` is the run folder it was chosen from (its iterations are the tags), ``note`` why it was."""

    def __init__(self, folder: Path, run: Path | None = None, note: str = "") -> None:
        super().__init__()
        self.folder = Path(folder)
        self._keys: dict[str, str] = {}  # each name -> the saved key it is (a layer of)
        name, backend = sharded_backend(self.folder)
        self.files = ZarrFiles(self.folder) if name == ZARR else flattened_view(DcpFiles(self.folder))
        self._chunks = "zarr chunks" if name == ZARR else "DCP chunks"
        self.facts = MegatronFacts(writer="Megatron-Core (dist_checkpointing.save)", sharded_backend=backend,
                                   world_size=self.files.world_size)
        named = ITERATION.match(self.folder.name)
        self.info = CheckpointInfo(format="megatron", paths=[str(self.folder)], facts=self.facts,
                                   tag=self.folder.name, tags=iterations(run) if run else [self.folder.name],
                                   step=int(named.group(1)) if named else None, files=self.files.files,
                                   notes=[note] if note else [])
        sets = place_keys(self.files)
        self._unstack(sets)
        self._describe(sets)

    def _unstack(self, sets: KeySets) -> None:
        """Each model key under its name, a stacked one layer by layer, in the save's order with the layers of a
        stack interleaved as the model lists them (layer 0's tensors, then layer 1's, ...)."""
        stacks: dict[str, list[tuple[str, str, int]]] = {}  # the stack's prefix -> (key, name, where) of its keys
        order: list[str | tuple] = []
        for key, name in sets.model.items():
            entry, at = self.files.metadata.entries[key], stacked_at(name)
            if at is None:
                order.append(key)
                continue
            prefix = ".".join(name.split(".")[:at])
            if prefix not in stacks:
                order.append(("stack", prefix))
            stacks.setdefault(prefix, []).append((key, name, at))
            self._check_stack(prefix, key, entry, stacks[prefix][0][0])
        for item in order:
            if isinstance(item, str):
                read = sets.masters.get(item, item)  # its fp32 master, where the run kept one
                self._add(sets.model[item], item, self.files.lazy(read, self.files.metadata.entries[read],
                                                                   f"{sets.model[item]} ({self._chunks} of {read})"))
                continue
            members = stacks[item[1]]
            for layer in range(self.files.metadata.entries[members[0][0]].size[0]):
                for key, name, at in members:
                    read = sets.masters.get(key, key)
                    self._add_layer(layer_name(name, at, layer), key, self.files.lazy_row(
                        read, self.files.metadata.entries[read], layer, f"layer {layer} of {read} ({self._chunks})"))
        self.facts.stacked = [key for members in stacks.values() for key, _, _ in members]
        self._check_nesting()

    def _check_nesting(self) -> None:
        """No name is another's module: a parameter has no children, so ``X.exp_avg`` beside ``X`` is a key filed
        under the wrong kind (an optimizer state taken for the model's), never a weight."""
        for name in self._tensors:
            parts = name.split(".")
            parent = next((".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in self._tensors),
                          None)
            if parent is not None:
                raise CogExportError(f"{self.folder}: the model's {quoted(self._keys[name])} is filed under its "
                                     f"tensor {quoted(parent)}, which no module can hold (an optimizer state or "
                                     "other training state among the model's keys?); the .metadata is damaged")

    def _check_stack(self, prefix: str, key: str, entry, first: str) -> None:
        if not isinstance(entry, TensorEntry) or not len(entry.size):
            raise CogExportError(f"{self.folder}: {key} has no layer axis, though its name says it is stacked "
                                 f"({prefix} and no layer number); the checkpoint is damaged")
        layers = self.files.metadata.entries[first].size[0]
        if entry.size[0] != layers:
            raise CogExportError(f"{self.folder}: {key} stacks {entry.size[0]} layers, {first} {layers}: the tensors "
                                 f"of {prefix} disagree on the number of layers; the checkpoint is damaged")

    def _add_layer(self, name: str, key: str, tensor) -> None:
        """One layer of a stacked key; a mixture-of-experts layer's experts stacked on their axis one by one."""
        at = experts_at(name)
        if at is None or not len(tensor.shape):
            self._add(name, key, tensor)
            return
        for expert_name, expert in per_expert(name, at, tensor):
            self._add(expert_name, key, expert)

    def _add(self, name: str, key: str, tensor) -> None:
        if name in self._tensors:
            raise CogExportError(f"{self.folder}: two saved entries are both the model's {name!r} (a stacked tensor "
                                 "and a per-layer one, or two prefixes); the checkpoint mixes models")
        self._tensors[name], self._keys[name] = tensor, key

    def _describe(self, sets: KeySets) -> None:
        info, stacked = self.info, set(self.facts.stacked)
        if sets.optimized:
            info.trainable = [name for name in self._tensors if self._keys[name] in sets.optimized]
            info.frozen = [name for name in self._tensors if self._keys[name] not in sets.optimized
                           and self._tensors[name].dtype.is_floating_point]
            info.buffers = [name for name, t in self._tensors.items() if not t.dtype.is_floating_point]
        else:
            info.trainable = list(self._tensors)
        self._say_what_is_read(sets)
        held = [f"model ({len(sets.model)} keys, {len(stacked)} stacked on a layer axis; {len(self._tensors)} tensors "
                "by layer)"]
        held += [f"{what}: {count} key{'s' if count > 1 else ''}" for what, count in sets.held.items()]
        states = sorted({state for found in sets.optimized.values() for state in found})
        if states:
            held.append(f"optimizer states {', '.join(states)} of {len(sets.optimized)} parameters")
        flattened = getattr(self.files, "flattened", None)
        if flattened:
            held.append(f"{len(flattened)} of them saved flattened (the distributed optimizer's "
                        "fully_sharded_model_space, megatron-core 0.8-0.15), put back in their parameters' shapes")
        beside = sorted(p.name for p in self.folder.iterdir() if p.name == COMMON_FILE or BRIDGE_STATE.match(p.name))
        if beside:
            held.append(f"beside it (not read: training state and the run's settings): {', '.join(beside)}")
        self.facts.contents = held

    def _say_what_is_read(self, sets: KeySets) -> None:
        """The weights' source, and a note where a mixed-precision run's masters are (or are not) what is read."""
        info = self.info
        saved = sorted({dtype_name(t.dtype) for name, t in self._tensors.items() if t.dtype.is_floating_point
                        and self._keys[name] not in sets.masters})
        if sets.masters:
            info.weights_source = f"the optimizer's fp32 masters ({sets.master_state}) of {len(sets.masters)} " \
                                  f"parameters, the rest as saved ({', '.join(saved) or 'none'}; " \
                                  f"{self.facts.sharded_backend} shards)"
            entries = self.files.metadata.entries
            copies = sorted({dtype_name(entries[key].dtype) for key in sets.masters})
            never = sorted(key for key in sets.model if key not in sets.masters and entries[key].dtype in LOW)
            info.notes.append(f"read the fp32 masters (optimizer.state.{sets.master_state}.*) of {len(sets.masters)} "
                              f"parameters, not their {'/'.join(copies)} copies (the optimizer stepped the masters; "
                              "the copies are them rounded); fp32 parameters are their own masters" + (
                                  f"; {len(never)} {'/'.join(copies)} tensor{'s' if len(never) > 1 else ''} without "
                                  f"one (never stepped: frozen) read as saved: {', '.join(never[:4])}"
                                  f"{', ...' if len(never) > 4 else ''}"
                                  if never else ""))
            return
        info.weights_source = f"model weights as saved ({', '.join(saved) or 'no floating tensors'}, " \
                              f"{self.facts.sharded_backend} shards)"
        low = [dtype for dtype in saved if dtype != "fp32"]
        if low:
            buckets = " (the distributed optimizer's masters are in its flat buckets, optimizer.distributed.*, laid " \
                      "out as its grad buffers were: the .metadata marks where each part begins, but not which " \
                      "parameter a part is nor which parts are padding, and the run never saves its buffers' layout " \
                      "(parameter order, alignment, bucket size): not read)" if sets.buckets else ""
            if sets.unplaced:
                buckets = unplaced_masters(self.files, sets.unplaced)
            info.notes.append(f"the saved model weights are {'/'.join(low)}, the training dtype, and the save holds no "
                              f"fp32 masters in the model's shapes (optimizer.state.{'/'.join(MASTER_STATES)}.*)"
                              f"{buckets}: the export is exact to the {'/'.join(low)} values, no finer")

    def bytes_read(self) -> dict[str, int]:
        return {str(self.folder / name): count for name, count in self.files.bytes_read.items()}

    def own_folders(self) -> list[Path]:
        return [self.folder]

    def check_stored_data(self) -> list[str]:
        return self.files.check_all()


def open_run(run: Path, tag: str | None) -> MegatronCheckpoint:
    folder, note = chosen_iteration(run, tag)
    return MegatronCheckpoint(folder, run, note)


def open_iteration(folder: Path, tag: str | None) -> MegatronCheckpoint:
    if tag is not None and tag != folder.name:
        raise CogExportError(f"--tag {tag}: {folder} is one iteration already; drop --tag or point at the run folder")
    run = folder.parent if is_run(folder.parent) else None
    return MegatronCheckpoint(folder, run)
