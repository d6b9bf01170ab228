"""Read one step of a FastVideo training run (hao-ai-lab/FastVideo's CheckpointManager): ``checkpoint-N/`` holding
``dcp/`` (a torch.distributed.checkpoint save), ``metadata.json`` (``{"step": N, "config": {...the run's YAML...}}``)
and ``rng_state_rank<R>.pt``, as the weights of one of its roles.

Every top-level key set of the DCP save is placed (DCP keeps each top-level key as one path element, dots and all):

  roles.<role>.<module>   a role's weights: a trainable role's trainable parameters, or the whole state dict of a
                          frozen role the method mutates (causal-CD's ``ema``, DiffusionNFT's ``old``)
  optimizers.<role>       the role's optimizer (torch.optim state of its parameters): never weights
  schedulers.<role>       its lr scheduler; ``dataloader``, RNG and other trainer state: never weights
  callbacks               the callbacks' state; the EMA callback's ``ema.student_ema.<name>`` is an EMA of the
                          student kept as each rank's LOCAL shard (FastVideo's EMA_FSDP, local_shard mode)
  <method>.ema            a method's own EMA (DiffusionNFT): ``shadow.<name>``, local shards as well

A key set holding tensors that is none of these is refused by name. A role's weights must be parameters: a key of
optimizer state among them, or (for a trainable role) a name its optimizer has no state for, or one it trains that is
missing, is refused. Tensors are read through ``DcpFiles`` (dcp.py), with every check the DCP reader makes.

Which role is read (``OpenOptions.entry``, the command line's ``--role`` / ``--ema``): by default the trained one,
``student`` (else the only trainable role); ``ema`` the ``ema`` role, else an EMA shadow when it is whole (its
shapes are the student's: world size 1), else refused with the reason (DCP kept one rank's piece of each tensor);
any other name, that role. Names are FastVideo's own modules (``blocks.0.to_q``); the Wan key map
``key_maps/wan/fastvideo_transformer.toml`` turns them into Diffusers'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CogExportError, RoleError, quoted
from .base import CheckpointInfo, LazyCheckpoint, ReaderFacts
from .dcp import DcpFiles, dtype_name, module_name
from .dcp_metadata import METADATA_FILE, DcpMetadata, TensorEntry
from .text_files import read_checkpoint_json
from .torch_archive import TorchArchive
from .training_state import components, is_optimizer_state, is_training_state_group

METADATA_JSON = "metadata.json"
DCP_FOLDER = "dcp"
STEP_FOLDER = re.compile(r"^checkpoint-(\d+)$")
RNG_FILE = re.compile(r"^rng_state(_rank\d+)?\.pt$")
ROLE_GROUP = re.compile(r"^roles\.([^.]+)\.(.+)$")
OPTIMIZER_GROUP = re.compile(r"^optimizers\.([^.]+)$")
SCHEDULER_GROUP = re.compile(r"^schedulers\.([^.]+)$")
METHOD_EMA_GROUP = re.compile(r"^[^.]+\.ema$")  # DiffusionNFT's diffusion_nft.ema
CALLBACK_SHADOW = ("callbacks", "ema", "student_ema")
STUDENT, EMA = "student", "ema"


@dataclass
class FastVideoFacts(ReaderFacts):
    """What a FastVideo step says of itself: its roles (trainable or not), the one read, the training method, the
    number of ranks, and what else it holds (optimizers, schedulers, EMA shadows, ...)."""

    writer: str | None = None
    world_size: int | None = None
    contents: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    role: str | None = None
    method: str | None = None


@dataclass
class KeySets:
    """The save's top-level key sets, each placed: flat key -> the module's name, per role and per EMA shadow."""

    roles: dict[str, dict[str, str]] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)  # role -> its top-level group
    optimized: dict[str, set[str]] = field(default_factory=dict)  # role -> the parameters its optimizer holds
    optimizer_states: dict[str, set[str]] = field(default_factory=dict)  # role -> exp_avg, step, ...
    state_shapes: dict[str, dict[str, tuple]] = field(default_factory=dict)  # role -> name -> its exp_avg's shape
    shadows: dict[str, dict[str, str]] = field(default_factory=dict)  # its top-level group -> flat key -> name
    held: dict[str, str] = field(default_factory=dict)  # every other top-level group -> what it is

    @property
    def trainable(self) -> list[str]:
        return [role for role in self.roles if role in self.optimized]


def is_fastvideo_step(folder: Path) -> bool:
    """FastVideo's step folder by its names: ``dcp/`` holding a DCP save, beside ``metadata.json``."""
    return (folder / METADATA_JSON).is_file() and (folder / DCP_FOLDER / METADATA_FILE).is_file()


# -- placing the key sets -------------------------------------------------------------------------------------------
def place_key_sets(metadata: DcpMetadata, where: Path) -> KeySets:
    """Every top-level group of the save placed (see the module docstring), or one line naming the one that is not."""
    sets = KeySets()
    for key, entry in metadata.entries.items():
        path = metadata.path_of(key)
        group, tensor, shadow = str(path[0]), isinstance(entry, TensorEntry), _shadow_prefix(path)
        role = ROLE_GROUP.match(group)
        if role:
            _place_role_key(sets, role.group(1), group, key, path, tensor, where)
        elif OPTIMIZER_GROUP.match(group):
            _place_optimizer_key(sets, OPTIMIZER_GROUP.match(group).group(1), path, entry)
        elif shadow is not None and tensor and len(path) == len(shadow) + 1:
            sets.shadows.setdefault(".".join(shadow), {})[key] = module_name(path[-1:])
        elif SCHEDULER_GROUP.match(group):
            sets.held.setdefault(group, f"the {SCHEDULER_GROUP.match(group).group(1)} role's lr scheduler")
        elif group == "callbacks" or METHOD_EMA_GROUP.match(group) or is_training_state_group(group):
            sets.held.setdefault(group, "callback state" if group == "callbacks" else "training state")
        elif tensor:
            raise CogExportError(f"{where}: the key set {quoted(group)} (e.g. {quoted(key)}) is none a FastVideo "
                                 "step saves (roles.<role>.<module>, optimizers.<role>, schedulers.<role>, dataloader, "
                                 "callbacks): cogexport will not guess what it is; the save is damaged or from a "
                                 "FastVideo version cogexport does not know")
        else:
            sets.held.setdefault(group, "other state (not read)")
    return sets


def _shadow_prefix(path: tuple) -> tuple | None:
    """The path of an EMA shadow's tensors: the callback's, or a method's own (``diffusion_nft.ema``)."""
    if tuple(map(str, path[:3])) == CALLBACK_SHADOW:
        return CALLBACK_SHADOW
    if METHOD_EMA_GROUP.match(str(path[0])) and len(path) > 2 and str(path[1]) == "shadow":
        return (str(path[0]), "shadow")
    return None


def _place_role_key(sets: KeySets, role: str, group: str, key: str, path: tuple, tensor: bool, where: Path) -> None:
    if sets.groups.setdefault(role, group) != group:
        raise CogExportError(f"{where}: the {role} role holds several modules ({sets.groups[role]}, {group}); "
                             "cogexport reads a role of one module (FastVideo's transformer)")
    if not tensor:
        return
    if is_optimizer_state(components(path[1:])):
        raise CogExportError(f"{where}: {quoted(key)} is optimizer state filed among the {role} role's weights; "
                             "optimizer state is never written as weights (the save is damaged)")
    name, weights = module_name(path[1:]), sets.roles.setdefault(role, {})
    if name in weights.values():
        raise CogExportError(f"{where}: two keys of the {role} role are both the module's {quoted(name)} (one is "
                             f"{quoted(key)}); the save mixes models")
    weights[key] = name


def _place_optimizer_key(sets: KeySets, role: str, path: tuple, entry) -> None:
    """The parameter a key of the role's optimizer is about: ``state.<module>.<name>.<state>`` or
    ``param_groups.<module>.<name>.<setting>`` (torch's flattened optimizer state dict, FQNs of the role's
    container, whose child is the role's module); a per-element state has the parameter's shape."""
    sets.optimized.setdefault(role, set())
    parts = ".".join(str(part) for part in path[1:]).split(".")
    if len(parts) < 4 or parts[0] not in ("state", "param_groups"):
        return
    name = module_name((".".join(parts[2:-1]),))
    sets.optimized[role].add(name)
    if parts[0] == "state" and isinstance(entry, TensorEntry):
        sets.optimizer_states.setdefault(role, set()).add(parts[-1])
        if len(entry.size):
            sets.state_shapes.setdefault(role, {})[name] = tuple(entry.size)


def check_roles(sets: KeySets, metadata: DcpMetadata, where: Path) -> None:
    """A trainable role's weights are the parameters its optimizer trains, no more and no fewer, each of the shape
    of its optimizer's per-element state."""
    for role in sets.trainable:
        weights, trained = sets.roles.get(role, {}), sets.optimized[role]
        if not trained:
            continue
        extra, missing = sorted(set(weights.values()) - trained), sorted(trained - set(weights.values()))
        if extra:
            raise CogExportError(f"{where}: {sets.groups[role]} holds {_some(extra)}, which its optimizer "
                                 f"(optimizers.{role}) trains no parameter of: a key set of another kind among the "
                                 "role's weights; the save is damaged")
        if missing:
            raise CogExportError(f"{where}: {sets.groups[role]} lacks {_some(missing)}, which its optimizer trains: "
                                 f"the {role} role's weights are incomplete; copy the checkpoint again")
        for key, name in weights.items():
            shape, size = sets.state_shapes.get(role, {}).get(name), tuple(metadata.entries[key].size)
            if shape is not None and size != shape:
                raise CogExportError(f"{where}: {quoted(key)} is {list(size)} but its optimizer state is "
                                     f"{list(shape)}: the {role} role's weights are not its parameters (the save is "
                                     "damaged)")


def _some(names: list[str]) -> str:
    return quoted(names[0]) + (f" and {len(names) - 1} more" if len(names) > 1 else "")


# -- which weights ---------------------------------------------------------------------------------------------
@dataclass
class Choice:
    """The weights to read: flat key -> name, what they are in a phrase, and their kind."""

    keys: dict[str, str]
    what: str
    trainable: bool


def choose_weights(sets: KeySets, entry: str | None, files: DcpFiles) -> Choice:
    where = files.folder.parent
    roles = ", ".join(_role_names(sets)) or "none"
    if entry is None:
        return _role_choice(sets, _default_role(sets, where))
    if entry in sets.roles:
        return _role_choice(sets, entry)
    if entry == EMA:
        return _shadow_choice(sets, files)
    raise RoleError(f"{where} holds no {quoted(entry)} role (roles: {roles}); name one with --role, or drop it to "
                    "read the trained one")


def _role_names(sets: KeySets) -> list[str]:
    return [f"{role} (trainable)" if role in sets.optimized else role for role in sets.roles]


def _default_role(sets: KeySets, where: Path) -> str:
    if STUDENT in sets.roles:
        return STUDENT
    if not sets.roles:
        raise CogExportError(f"{where} holds no role's weights (no roles.<role>.transformer key set); it is not a "
                             "FastVideo step cogexport can read")
    trainable = [role for role in sets.trainable if role in sets.roles]
    if len(trainable) == 1:
        return trainable[0]
    raise RoleError(f"{where} holds the roles {', '.join(_role_names(sets))} and none is the {STUDENT}: name the "
                    "one to read with --role")


def _role_choice(sets: KeySets, role: str) -> Choice:
    return Choice(sets.roles[role], f"the {role} role ({sets.groups[role]})", role in sets.optimized)


def _shadow_choice(sets: KeySets, files: DcpFiles) -> Choice:
    """``--ema`` without an ``ema`` role: the one EMA shadow, when it is whole."""
    where = files.folder.parent
    if not sets.shadows:
        raise RoleError(f"{where} holds no EMA: no 'ema' role (roles: {', '.join(_role_names(sets)) or 'none'}) and "
                        "no EMA callback state; drop --ema to read the student")
    if len(sets.shadows) > 1:
        raise RoleError(f"{where} holds several EMAs ({', '.join(sets.shadows)}) and no 'ema' role: cogexport will "
                        "not guess which one you mean")
    prefix, keys = next(iter(sets.shadows.items()))
    refuse_partial_shadow(sets, prefix, keys, files)
    refuse_unstarted(prefix, files)
    return Choice(keys, f"the EMA kept by the run ({prefix})", False)


def refuse_partial_shadow(sets: KeySets, prefix: str, keys: dict[str, str], files: DcpFiles) -> None:
    """An EMA kept as each rank's local shard is whole only when every shard is (world size 1): then its shapes are
    the student's. Otherwise DCP kept one rank's piece of each tensor, and nothing can rebuild the rest."""
    where, student = files.folder.parent, sets.roles.get(STUDENT, {})
    shapes = {name: files.metadata.entries[key].size for key, name in student.items()}
    for key, name in keys.items():
        size = files.metadata.entries[key].size
        if shapes.get(name) != size:
            whose = f"the student's is {list(shapes[name])}" if name in shapes else "the student has no such weight"
            raise RoleError(f"{where}: the EMA in {prefix} cannot be rebuilt: FastVideo keeps it as each rank's local "
                            f"shard and DCP saved one rank's piece of each tensor ({name} is {list(size)}, {whose}; "
                            f"world size {files.world_size}); export the student, or train the EMA as a role (or at "
                            "world size 1) to keep it whole")
    if set(keys.values()) != set(shapes):
        raise RoleError(f"{where}: the EMA in {prefix} does not hold every weight of the student; it cannot be read "
                        "as a model")


def refuse_unstarted(prefix: str, files: DcpFiles) -> None:
    """The EMA callback's shadow is only an EMA once it has started (``ema_started``; before, FastVideo's EMA is the
    live weights and the shadow the weights at the start)."""
    key = f"{prefix.rsplit('.', 1)[0]}.ema_started"
    where = files.metadata.storage.get((key, None))
    if where is None:
        return
    archive = TorchArchive(files.folder / where.file, where.offset, where.length)
    try:
        started = archive.load()  # a pickled bool, through the restricted unpickler
    finally:
        archive.close()
    if started is not True:
        raise RoleError(f"{files.folder.parent}: the EMA callback had not started ({key} is {quoted(started)}; its "
                        "start_iter was not reached), so its shadow is not an EMA of the training; read the student")


# -- metadata.json ---------------------------------------------------------------------------------------------
def read_step_metadata(step_folder: Path) -> tuple[int, str | None]:
    """metadata.json's step (checked against the folder's name) and the training method its config names."""
    path = step_folder / METADATA_JSON
    data = read_checkpoint_json(path)
    step = data.get("step") if isinstance(data, dict) else None
    if type(step) is not int or step < 0:
        raise CogExportError(f"{path} is damaged: it names no step ({quoted(step)}); copy the checkpoint again")
    named = STEP_FOLDER.match(step_folder.name)
    if named and int(named.group(1)) != step:
        raise CogExportError(f"{path} says step {step}, its folder {step_folder.name}: the file is another step's or "
                             "damaged; copy the checkpoint again")
    config = data.get("config")
    if config is not None and not isinstance(config, dict):
        raise CogExportError(f"{path} is damaged: its config is not a mapping; copy the checkpoint again")
    method = (config or {}).get("method")
    target = method.get("_target_") if isinstance(method, dict) else None
    return step, target if isinstance(target, str) else None


# -- the checkpoint ----------------------------------------------------------------------------------------------
class FastVideoCheckpoint(LazyCheckpoint):
    """One role's weights of a FastVideo step, under FastVideo's module names, read lazily from its DCP save."""

    def __init__(self, step_folder: Path, entry: str | None = None, strict: bool = True) -> None:
        super().__init__()
        self.step_folder = Path(step_folder)
        self.files = DcpFiles(self.step_folder / DCP_FOLDER)
        self.facts = FastVideoFacts(writer="FastVideo (CheckpointManager)", world_size=self.files.world_size)
        named = STEP_FOLDER.match(self.step_folder.name)
        self.info = CheckpointInfo(format="fastvideo", paths=[str(self.step_folder)], facts=self.facts,
                                   tag=self.step_folder.name, step=int(named.group(1)) if named else None,
                                   files=[str(self.step_folder / METADATA_JSON), *self.files.files])
        self._read_metadata(strict)
        sets = place_key_sets(self.files.metadata, self.files.folder)
        check_roles(sets, self.files.metadata, self.files.folder)
        choice = choose_weights(sets, entry, self.files)
        for key, name in choice.keys.items():
            stored = self.files.metadata.entries[key]
            self._tensors[name] = self.files.lazy(key, stored, f"{name} (DCP chunks of {key})")
        self._describe(sets, choice)

    def _read_metadata(self, strict: bool) -> None:
        try:
            self.info.step, self.facts.method = read_step_metadata(self.step_folder)
        except CogExportError as error:
            if strict:
                raise
            self.info.problems.append(str(error))

    def _describe(self, sets: KeySets, choice: Choice) -> None:
        info, facts = self.info, self.facts
        facts.roles, facts.role = _role_names(sets), choice.what
        floating = [name for name, tensor in self._tensors.items() if tensor.dtype.is_floating_point]
        if choice.trainable:
            info.trainable = list(self._tensors)
        else:
            info.frozen, info.buffers = floating, [name for name in self._tensors if name not in floating]
        dtypes = sorted({dtype_name(self._tensors[name].dtype) for name in floating})
        info.weights_source = f"{choice.what}, as saved ({', '.join(dtypes) or 'no floating tensors'}, DCP shards)"
        facts.contents = self._contents(sets, choice)
        if not choice.trainable:
            info.notes.append("a DCP save does not tell parameters from buffers: 'frozen' lists the floating tensors "
                              "of a role that is not trained")

    def _contents(self, sets: KeySets, choice: Choice) -> list[str]:
        held = [f"roles {', '.join(_role_names(sets))}"]
        for role, states in sorted(sets.optimizer_states.items()):
            held.append(f"optimizer states {', '.join(sorted(states))} of the {role} role "
                        f"({len(sets.optimized[role])} parameters; never weights)")
        for prefix, keys in sets.shadows.items():
            held.append(f"an EMA in {prefix} ({len(keys)} tensors, each rank's local shard, world size "
                        f"{self.files.world_size})")
        held += [f"{group}: {what}" for group, what in sorted(sets.held.items())]
        beside = sorted(p.name for p in self.step_folder.iterdir() if RNG_FILE.match(p.name))
        if beside:
            held.append(f"beside it (not read): {', '.join(beside)}")
        return held

    def bytes_read(self) -> dict[str, int]:
        return {str(self.files.folder / name): count for name, count in self.files.bytes_read.items()}

    def own_folders(self) -> list[Path]:
        return [self.step_folder, self.files.folder]

    def check_stored_data(self) -> list[str]:
        return self.files.check_all()
