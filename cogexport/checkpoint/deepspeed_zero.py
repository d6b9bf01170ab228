"""Read a DeepSpeed checkpoint (ZeRO stages 0-3, any world size) as a lazy mapping of names to tensors.

The names and order are the trained module's ``state_dict()``: trainable parameters come from the fp32
masters in the optimizer partitions (gathered only from the ranks that hold them), frozen parameters and
persistent buffers from the stored bits, tied aliases from their source. Everything about the checkpoint is
read and checked when it is opened (only the small pickles, never tensor data); tensors are read one at a
time when loaded. ``deepspeed`` is never imported.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import CogExportError, quoted
from ..lazy import ByteRanges, LazyTensor, joined_ranges
from ..pickled import PickledObject
from .base import CheckpointInfo, LazyCheckpoint, ReaderFacts
from .locate import (RankFiles, locate, model_file_name, optim_file_name, rank_file_identity,
                     zero3_model_file_name)
from .tensor_parallel import INFO_KEY, TensorParallelLayout, joined
from .torch_archive import StoredTensor, TorchArchive, load_torch_file
from .training_state import refuse_training_state_role
from .zero_layout import FlatGroupLayout, Zero3SubGroupLayout, gather_zero3_pieces

# Keys DeepSpeed writes into a model-states file; anything else is the user's client_state.
ENGINE_KEYS = frozenset({
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
    "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size",
    "checkpoint_parallel_dimensions", "ds_config", "ds_version", INFO_KEY,
})
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _summary(value: Any) -> str:
    if isinstance(value, StoredTensor):
        return f"tensor {tuple(value.shape)} {DTYPE_NAMES.get(value.dtype, str(value.dtype))}"
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, PickledObject):
        return value.type_name
    if isinstance(value, (dict, list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


@dataclass
class DeepSpeedFacts(ReaderFacts):
    """What a DeepSpeed checkpoint says of its run: the ZeRO stage (None: model states only, as SAT saves them), the
    training dtype, the data-parallel world size, the DeepSpeed version that saved it, and the training code's own
    entries (client state), each summarised."""

    stage: int | None = None
    training_dtype: str | None = None
    world_size: int | None = None
    tensor_parallel: int | None = None  # AutoTP's model-parallel ranks (None: not a tensor-parallel save)
    ds_version: str | None = None
    client_state: dict[str, str] = field(default_factory=dict)


@dataclass
class PartitionedGroup:
    """One optimizer parameter group as every rank saved it: where each parameter sits (the layout), each rank's
    fp32 partition, and each rank's optimizer state for the group (per-element states are partitioned the same way;
    scalars such as Adam's step are not)."""

    index: int
    layout: FlatGroupLayout | Zero3SubGroupLayout
    masters: list[StoredTensor]
    states: list[dict]

    def master(self, name: str) -> torch.Tensor:
        return self.layout.gather(name, self.masters)

    def master_ranges(self, name: str) -> ByteRanges | None:
        """Where the fp32 master of ``name`` lies in the ranks' files, piece by piece (for a copy file to file)."""
        if not all(master.is_contiguous and master.dtype == torch.float32 for master in self.masters):
            return None
        return joined_ranges([self.masters[rank].flat_range(start, stop)
                              for rank, start, stop in self.layout.partition_pieces(name)])

    def state_names(self) -> list[str]:
        # Per-element states are partitions (1-D, one element for a one-element group); per-group ones are 0-d.
        first = self.states[0]
        return [key for key, value in first.items() if isinstance(value, StoredTensor) and len(value.shape) > 0]

    def scalars(self) -> dict[str, Any]:
        """States that are one value for the whole group (Adam's step), as rank 0 saved them."""
        return {key: value for key, value in self.states[0].items() if key not in self.state_names()}

    def state(self, name: str, key: str) -> torch.Tensor:
        partitions = [states[key] for states in self.states]
        return self.layout.gather(name, partitions, partitions[0].dtype)

    def where(self, name: str) -> str:
        if isinstance(self.layout, Zero3SubGroupLayout):
            return "ZeRO-3, all ranks"
        ranks = self.layout.ranks_holding(name)
        return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


class DeepSpeedCheckpoint(LazyCheckpoint):
    """A DeepSpeed checkpoint opened lazily: ``checkpoint[name]`` is a ``LazyTensor``.

    ``strict=False`` (for ``inspect``) records problems such as missing ranks in ``info.problems`` instead of
    raising; the mapping is then empty if the weights cannot be assembled.
    """

    def __init__(self, paths: list[Path] | Path, tag: str | None = None, *, strict: bool = True,
                 entry: str = "module", files: RankFiles | None = None) -> None:
        super().__init__()
        self.entry = entry  # the model-states entry holding the weights: module, or a copy beside it (ema)
        paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
        refuse_training_state_role(entry, "a DeepSpeed model-states file")
        self._archives: list[TorchArchive] = []
        self._unchecked: list[str] = []  # files saved without CRC-32s
        self.groups: list[PartitionedGroup] = []  # ZeRO-1/2/3: the optimizer's partitioned parameter groups
        self._group_of: dict[str, PartitionedGroup] = {}
        self.optimizer_state: dict = {}  # ZeRO-1/2/3: rank 0's optimizer file, tensors as references
        self.model_parallel: list[DeepSpeedCheckpoint] = []  # AutoTP: the other model-parallel ranks' checkpoints
        self._shard_maps: dict = {}  # AutoTP: how each tensor's shares make the whole (tensor_parallel.ShardMap)
        self.files: RankFiles = files or locate(paths, tag)
        self.facts = DeepSpeedFacts()
        self.info = CheckpointInfo(format="deepspeed", paths=[str(p) for p in paths], facts=self.facts,
                                   tag=self.files.tag, tags=self.files.tags_available)
        try:
            self._open(strict)
        except BaseException:
            self.close()
            raise
        if self._unchecked:
            self.info.notes.append(f"{len(self._unchecked)} file(s) saved without CRC-32 checksums (torch.serialization."
                                   f"set_crc32_options(False)), so damage to their data cannot be detected: "
                                   f"{', '.join(self._unchecked[:3])}{' ...' if len(self._unchecked) > 3 else ''}")

    def bytes_read(self) -> dict[str, int]:
        read = {str(archive.path): archive.bytes_read for archive in self._archives}
        for part in self.model_parallel:
            read.update(part.bytes_read())
        return read

    def check_stored_data(self) -> list[str]:
        return [problem for archive in self._archives for problem in archive.records.check_all()] + \
            [problem for part in self.model_parallel for problem in part.check_stored_data()]

    def own_folders(self) -> list[Path]:
        return list(self.files.tag_dirs)

    def close(self) -> None:
        for archive in self._archives:
            archive.close()
        for part in self.model_parallel:
            part.close()

    # -- opening -------------------------------------------------------------------------------------------
    def _load(self, path: Path) -> Any:
        archive, tree = load_torch_file(path)
        self._archives.append(archive)
        self.info.files.append(str(path))
        saved_as = rank_file_identity(archive.root + ".pt")
        if saved_as is not None and saved_as != rank_file_identity(path.name):
            # torch.save names an archive's root folder after the file it wrote: this file was renamed.
            raise CogExportError(f"{path} was saved as {archive.root}.pt (the name inside the archive): rank files "
                                 "were renamed or swapped; put each rank's file back under its own name")
        if not archive.records.has_crcs:
            self._unchecked.append(path.name)
        return tree

    def _load_rank_files(self, strict: bool, paths: list[Path]) -> list[Any] | None:
        """Every file's object tree; without ``strict``, each unreadable file is a problem and the result None."""
        trees = []
        for path in paths:
            try:
                trees.append(self._load(path))
            except CogExportError as error:
                self._problem(strict, str(error))
        return trees if len(trees) == len(paths) else None

    def _check_distinct(self, strict: bool, paths: list[Path]) -> None:
        """Two rank files with the same records (names, sizes, CRC-32s) are one file copied over another."""
        first_with: dict[tuple, Path] = {}
        for archive in self._archives:
            if archive.path in paths and archive.records.has_crcs:
                twin = first_with.setdefault(archive.fingerprint(), archive.path)
                if twin != archive.path:
                    self._problem(strict, f"{twin.name} and {archive.path.name} in {archive.path.parent} have the "
                                          "same content: one rank's file was copied over another's; restore the "
                                          "missing rank's own file")

    def _problem(self, strict: bool, message: str) -> None:
        if strict:
            raise CogExportError(message)
        self.info.problems.append(message)

    def _open(self, strict: bool) -> None:
        files = self.files
        main_path = files.model_states or files.zero3_model_states.get(0)
        if main_path is None:
            ranks = sorted(files.zero3_model_states)
            self._problem(True, f"rank 0 of a ZeRO-3 checkpoint missing: expected "
                                f"{zero3_model_file_name(0, files.mp_rank)} in "
                                f"{files.where} (found ranks {ranks})")
        states = self._load(main_path)
        module = self._weights(states, main_path)
        if module is states:  # a plain state dict under DeepSpeed's file name: no engine entries around it
            states = {}
        info, facts = self.info, self.facts
        info.step = states.get("global_steps")
        facts.ds_version = states.get("ds_version")
        facts.client_state = {k: _summary(v) for k, v in states.items() if k not in ENGINE_KEYS}
        config = states.get("ds_config") if isinstance(states.get("ds_config"), dict) else {}
        facts.training_dtype = _training_dtype(config, module)
        facts.stage = _stage(config, files, states)
        facts.world_size = int(states.get("dp_world_size")
                               or max([*files.optim_states, *files.zero3_model_states, 0]) + 1)
        info.buffers = [n for n in states.get("buffer_names") or [] if n in module]

        if self.entry != "module":  # a copy the training code saved beside the module (EMA): its own values
            info.weights_source = f"the '{self.entry}' state dict saved beside the module"
            self._assemble_module(states, module)
        elif facts.stage == 3:
            self._open_zero3(states, module, config, strict)
        elif facts.stage in (1, 2) and files.optim_states:
            self._open_zero12(states, module, config, strict)
        elif facts.stage in (1, 2) and states.get("param_shapes") is not None and "iteration" not in states:
            # DeepSpeed records param_shapes only when it saves a ZeRO optimizer. SAT saves the same model states
            # through DeepSpeed but never the optimizer (its client state carries "iteration"): its weights are
            # the module's copy by design. Anyone else's missing files would silently cost the fp32 masters.
            expected = optim_file_name(0, facts.training_dtype == "bf16", files.mp_rank)
            self._problem(strict, f"{main_path.name} records a ZeRO-{facts.stage} optimizer but {files.where} holds "
                                  f"none of its files (expected {expected} and the other ranks'): without them only "
                                  f"the module's {facts.training_dtype} copy is left, not the fp32 masters; copy the "
                                  "optimizer files too (on a multi-node run, give every node's folder)")
        elif facts.stage == 0 or facts.stage is None:
            self._open_stage0(states, module, strict)
        else:
            self._open_module_only(states, module, "no optimizer files")
        if files.mp_rank == 0 and (files.model_parallel or int(states.get("mp_world_size") or 1) > 1):
            try:
                self._open_tensor_parallel(states, strict)
            except CogExportError as error:  # inspect reports it; nothing half-joined is handed out
                self._problem(strict, str(error))
                self._tensors = {}

    # AutoTP: one ZeRO checkpoint per model-parallel rank ----------------------------------------------------
    def _model_states_name(self, mp_rank: int) -> str:
        return zero3_model_file_name(0, mp_rank) if self.facts.stage == 3 else model_file_name(mp_rank)

    def _open_tensor_parallel(self, states: dict, strict: bool) -> None:
        """Each other model-parallel rank's files opened as a ZeRO checkpoint of their own, then every tensor joined
        from the ranks' shares by what rank 0's model states record (tensor_parallel.py)."""
        files, info, tp = self.files, self.info, int(states.get("mp_world_size") or 1)
        for rank in range(1, tp):
            if rank not in files.model_parallel:
                raise CogExportError(f"tensor-parallel rank {rank} of {tp} missing: expected "
                                     f"{self._model_states_name(rank)} and its optimizer files in {files.where} (on a "
                                     "multi-node run, give every node's folder)")
        for rank in sorted(r for r in files.model_parallel if r >= tp):
            raise CogExportError(f"stale files of model-parallel rank {rank} in {files.where}: this checkpoint has "
                                 f"{tp} tensor-parallel ranks (mp_world_size in its model states); move them away")
        if not self._tensors:
            return  # the rank-0 share could not be assembled: its problems are recorded
        for rank in range(1, tp):  # one at a time, so that close() closes those opened before one that fails
            self.model_parallel.append(DeepSpeedCheckpoint([], strict=True, entry=self.entry,
                                                           files=files.model_parallel[rank]))
        shares = [self, *self.model_parallel]
        for rank, part in enumerate(shares[1:], start=1):
            self._check_same_run(part, rank)
        self.info.files += [name for part in self.model_parallel for name in part.info.files]
        layout = TensorParallelLayout(states.get(INFO_KEY), tp, str(files.model_states or files.zero3_model_states[0]))
        buffers = set(info.buffers)
        whole = {}
        for name in self._tensors:
            if name in info.tied:
                continue
            pieces = [share._tensors[name] for share in shares]
            self._shard_maps[name] = layout.map_of(name, [piece.shape for piece in pieces],
                                                   parameter=name not in buffers)
            whole[name] = joined(name, self._shard_maps[name], pieces, self._model_states_name)
        self._tensors = {name: whole[info.tied.get(name, name)] for name in self._tensors}
        self.facts.tensor_parallel = tp
        info.weights_source += f", joined over {tp} tensor-parallel ranks (AutoTP)"

    def _check_same_run(self, part: "DeepSpeedCheckpoint", rank: int) -> None:
        """A model-parallel rank's checkpoint must be the same save as rank 0's: stage, step, world size, names."""
        mine, theirs = self.facts, part.facts
        where = self._model_states_name(rank)
        for what, ours, other in (("ZeRO stage", mine.stage, theirs.stage), ("step", self.info.step, part.info.step),
                                  ("data-parallel world size", mine.world_size, theirs.world_size),
                                  ("training dtype", mine.training_dtype, theirs.training_dtype)):
            if ours != other:
                raise CogExportError(f"mixed saves: {where} records {what} {other}, rank 0's files {ours}; give one "
                                     "save's files of every tensor-parallel rank")
        if list(part._tensors) != list(self._tensors):
            missing = [name for name in self._tensors if name not in part._tensors]
            extra = [name for name in part._tensors if name not in self._tensors]
            raise CogExportError(f"{where} holds other tensors than rank 0's files (missing: {missing[:3]}, extra: "
                                 f"{extra[:3]}); tensor-parallel ranks of one save hold the same names")

    def _weights(self, states: Any, path: Path) -> dict:
        """The state dict in the model-states file: its ``entry``, or the file itself when it is a bare state dict
        saved under DeepSpeed's name (FastVideo's HunyuanVideo checkpoints, which the usual loaders fail on)."""
        if isinstance(states, dict) and self.entry in states:
            if states[self.entry] is None:
                raise CogExportError(f"{path} holds no module (a pipeline-parallel checkpoint?); not supported")
            if isinstance(states[self.entry], dict):
                return states[self.entry]
        if self.entry != "module":
            raise CogExportError(f"{path} holds no {self.entry!r} state dict")
        bare = isinstance(states, dict) and bool(states) and all(isinstance(v, StoredTensor) for v in states.values())
        if bare and not self.files.optim_states and not self.files.zero3_model_states:
            return states
        raise CogExportError(f"{path} is not a DeepSpeed model-states file (no 'module' entry)")

    def _expect_ranks(self, strict: bool, found: dict[int, Path], name_of) -> bool:
        """Check ranks 0..ws-1 are all present and nothing beyond; True if the set is complete."""
        world_size = self.facts.world_size
        ok = True
        for rank in range(world_size):
            if rank not in found:
                ok = False
                self._problem(strict, f"rank {rank} of {world_size} missing: expected {name_of(rank)} in "
                                      f"{self.files.where} (on a multi-node run, give every node's folder)")
        for rank in sorted(r for r in found if r >= world_size):
            ok = False
            self._problem(strict, f"stale rank file {found[rank]}: this checkpoint has world size {world_size} "
                                  f"(dp_world_size in its model states); move the file away")
        return ok

    def _check_prefix(self, strict: bool) -> bool:
        if len(self.files.bf16_prefixed) > 1:
            self._problem(strict, f"mixed optimizer files in {self.files.where}: some with the bf16_ prefix, some "
                                  "without (leftovers of another run?); keep one run's files")
            return False
        return True

    # ZeRO-1/2/3 shared ---------------------------------------------------------------------------------
    def _read_optimizer_files(self, strict: bool, config: dict, partitions_key: str) -> dict[int, dict] | None:
        """Every rank's optimizer state dict (small pickles only), once the set of rank files is complete and
        every file is this run's: its ZeRO stage, its DeepSpeed config, its world size."""
        files, world_size = self.files, self.facts.world_size
        bf16_prefix = True in files.bf16_prefixed
        if not (self._expect_ranks(strict, files.optim_states, lambda r: optim_file_name(r, bf16_prefix, files.mp_rank))
                and self._check_prefix(strict)):
            return None
        if self.facts.training_dtype is not None and bf16_prefix != (self.facts.training_dtype == "bf16"):
            self._problem(strict, f"mixed runs: {files.optim_states[0].name} in {files.where} is from a "
                                f"{'bf16' if bf16_prefix else 'non-bf16'} run, the model states from a "
                                f"{self.facts.training_dtype} run; give one run's files")
        paths = [files.optim_states[rank] for rank in range(world_size)]
        trees = self._load_rank_files(strict, paths)
        if trees is None:
            return None
        self._check_distinct(strict, paths)
        optim = {}
        for rank, saved in enumerate(trees):
            state = saved.get("optimizer_state_dict") if isinstance(saved, dict) else None
            if not isinstance(state, dict) or partitions_key not in state:
                self._problem(True, f"{files.optim_states[rank]} is not a ZeRO-{self.facts.stage} optimizer file (no "
                                    f"{partitions_key}); is it from another run?")
            if config and isinstance(saved.get("ds_config"), dict) and saved["ds_config"] != config:
                self._problem(strict, f"mixed runs: {files.optim_states[rank]} was saved with another DeepSpeed config "
                                    "than the model states; give one run's files")
            optim[rank] = state
        self.optimizer_state = optim[0]
        for rank, state in optim.items():
            counts = state.get("partition_count")
            for count in counts if isinstance(counts, list) else [counts]:
                if count is not None and int(count) != world_size:
                    self._problem(True, f"mixed world sizes: {files.optim_states[rank]} was saved with {count} ranks, "
                                        f"the model states say {world_size}")
        return optim

    def _add_group(self, index: int, layout, masters: list[StoredTensor], states: list[dict], saved_length,
                   strict: bool) -> None:
        """Check each rank's partitions against the layout and index the group's parameters."""
        for rank, master in enumerate(masters):
            expected = saved_length(rank)
            if master.numel != expected:
                self._problem(True, f"{self.files.optim_states[rank]} does not match this checkpoint's layout (group "
                                    f"{index}: {master.numel} elements, expected {expected}); is it from another tag "
                                    "or run?")
        steps = [_scalar(rank_states.get("step")) for rank_states in states]
        for rank, step in enumerate(steps):
            if step != steps[0]:
                self._problem(strict, f"mixed steps: {self.files.optim_states[rank]} is at optimizer step {step}, "
                                    f"{self.files.optim_states[0].name} at {steps[0]}; give one tag's files of one run")
        group = PartitionedGroup(index, layout, masters, states)
        self.groups.append(group)
        for name in layout.slots:
            self._group_of[name] = group

    def _master(self, name: str) -> LazyTensor:
        group = self._group_of[name]
        return LazyTensor(group.layout.slots[name].shape, torch.float32, lambda: group.master(name),
                          f"fp32 master of {name} ({group.where(name)})", group.master_ranges(name))

    def optimizer_states(self, name: str) -> dict[str, LazyTensor]:
        """The optimizer's per-element states of trainable parameter ``name`` (exp_avg, ...), full shape, lazily
        (under AutoTP joined from every tensor-parallel rank's share as the parameter is)."""
        if not self.model_parallel:
            return self._partitioned_states(name)
        shares = [self._partitioned_states(name), *(part._partitioned_states(name) for part in self.model_parallel)]
        return {key: joined(f"{key} of {name}", self._shard_maps[name], [states[key] for states in shares],
                            self._model_states_name, scaled=False) for key in shares[0]}

    def _partitioned_states(self, name: str) -> dict[str, LazyTensor]:
        group = self._group_of[name]
        shape = group.layout.slots[name].shape
        return {key: LazyTensor(shape, group.states[0][key].dtype, lambda key=key: group.state(name, key),
                                f"{key} of {name}") for key in group.state_names()}

    # ZeRO-1/2 ---------------------------------------------------------------------------------------------
    def _open_zero12(self, states: dict, module: dict, config: dict, strict: bool) -> None:
        info, facts = self.info, self.facts
        shapes: list[dict] = states.get("param_shapes") or []
        info.trainable = [n for group in shapes for n in group]
        info.tied = dict(states.get("shared_params") or {})
        known = set(info.trainable) | set(info.tied) | set(info.buffers)
        info.frozen = [n for n in module if n not in known]
        frozen_fragments = states.get("frozen_param_fragments") or {}
        optim = self._read_optimizer_files(strict, config, "single_partition_of_fp32_groups")
        if optim is None:
            return
        padding_stripped = "zero_stage" in optim[0]  # BF16_Optimizer keeps each rank's tail padding
        info.weights_source = f"fp32 masters (ZeRO-{facts.stage} partitions)" if padding_stripped else \
            "fp32 masters (BF16_Optimizer partitions)"
        gaps_by_group = optim[0].get("param_alignment_paddings") or [None] * len(shapes)
        for index, group_shapes in enumerate(shapes):
            layout = FlatGroupLayout.build(group_shapes, facts.world_size, gaps_by_group[index])
            self._check_slice_mappings(strict, index, layout, optim)
            self._add_group(index, layout,
                            [optim[r]["single_partition_of_fp32_groups"][index] for r in range(facts.world_size)],
                            [optim[r]["base_optimizer_state"]["state"].get(index, {}) for r in range(facts.world_size)],
                            lambda rank, layout=layout: layout.saved_length(rank, padding_stripped), strict)

        def frozen(name: str) -> LazyTensor:
            # Stage 2 saves frozen params as full tensors; stage 1 saves none, they live only in `module`.
            return _stored(frozen_fragments[name] if name in frozen_fragments else module[name], f"frozen {name}")

        try:
            for name in info.trainable:
                self._check_rounds_to_module(name, module)
        except CogExportError as error:  # inspect reports it; an export stops here, before writing anything
            self._problem(strict, str(error))
            return
        self._assemble(module, self._master, frozen)

    def _check_slice_mappings(self, strict: bool, index: int, layout: FlatGroupLayout, optim: dict[int, dict]) -> None:
        """Each ZeRO-1/2 optimizer file records which parameter slices it holds: they must be its own rank's."""
        expected = {rank: layout.fragments(rank) for rank in range(layout.world_size)}
        for rank, state in optim.items():
            mappings = state.get("param_slice_mappings")
            if not isinstance(mappings, list) or index >= len(mappings) or not isinstance(mappings[index], dict):
                continue  # older DeepSpeed versions do not record them
            recorded = {name: (address.get("start"), address.get("numel")) if isinstance(address, PickledObject)
                        else None for name, address in mappings[index].items()}
            if recorded == expected[rank]:
                continue
            owner = next((other for other, fragments in expected.items() if fragments == recorded), None)
            what = f"rank {owner}'s parameter slices" if owner is not None else \
                "parameter slices that fit no rank of this checkpoint's layout"
            self._problem(strict, f"{self.files.optim_states[rank]} holds {what} (its param_slice_mappings), not rank "
                                  f"{rank}'s: rank files were renamed, swapped or mixed with another run's; put each "
                                  "rank's file back under its own name")

    def _check_rounds_to_module(self, name: str, module: dict) -> None:
        """Before anything is written: a few elements of the fp32 master of ``name`` from every rank holding it
        must round to the module's saved 16-bit copy (ZeRO-1/2 write the masters back into the module after each
        step): a master from another rank's file or another save does not."""
        stored, group = module.get(name), self._group_of.get(name)
        if group is None or not isinstance(stored, StoredTensor) or stored.shape != group.layout.slots[name].shape \
                or not stored.is_contiguous or stored.dtype not in _BITS:
            return
        for (rank, start, stop), (_, local, _) in zip(group.layout.pieces(name), group.layout.partition_pieces(name)):
            for low, high in {(start, min(stop, start + 4)), (max(start, stop - 4), stop)}:
                saved = stored.read_flat(low, high, check=False)  # compared only, never written
                master = group.masters[rank].read_flat(local + low - start, local + high - start, check=False)
                cast = master.to(stored.dtype)
                if not torch.equal(cast.view(_BITS[cast.dtype]), saved.view(_BITS[saved.dtype])):
                    self._blame_damage(name, stored)
                    raise CogExportError(
                        f"fp32 master of {name} in {self.files.optim_states[rank].name} does not round to the module's "
                        f"{DTYPE_NAMES.get(stored.dtype, stored.dtype)} copy in {self.files.model_states} (element "
                        f"{low}): the rank files are swapped or from another save; give one save's files, each under "
                        "its own name")

    def _blame_damage(self, name: str, stored: StoredTensor) -> None:
        """Before calling a mismatch a mix-up, finish the CRC-32 checks of the records compared: damage first."""
        stored.finish_check()
        group = self._group_of[name]
        for rank, _, _ in group.layout.pieces(name):
            group.masters[rank].finish_check()

    # ZeRO-3 -----------------------------------------------------------------------------------------------
    def _open_zero3(self, states: dict, module: dict, config: dict, strict: bool) -> None:
        info, facts, files = self.info, self.facts, self.files
        shapes: list[dict] = states.get("param_shapes") or []
        info.trainable = [n for group in shapes for n in group]
        info.tied = dict(states.get("shared_params") or {})
        frozen_shapes = dict(states.get("frozen_param_shapes") or {})
        info.frozen = list(frozen_shapes)
        models_ok = self._expect_ranks(strict, files.zero3_model_states,
                                       lambda r: zero3_model_file_name(r, files.mp_rank))
        optim = self._read_optimizer_files(strict, config, "fp32_flat_groups")
        if not models_ok or optim is None:
            return
        info.weights_source = "fp32 masters (ZeRO-3 partitions)"
        others = self._load_rank_files(strict, [files.zero3_model_states[r] for r in range(1, facts.world_size)])
        if others is None:
            return
        rank_states = {0: states, **dict(enumerate(others, start=1))}
        for rank in range(facts.world_size):
            claimed = rank_states[rank].get("dp_world_size")
            if claimed is not None and int(claimed) != facts.world_size:
                self._problem(True, f"mixed world sizes: {files.zero3_model_states[rank]} says {claimed} ranks, "
                                    f"rank 0 says {facts.world_size}")
            step = rank_states[rank].get("global_steps")
            if step != info.step:
                self._problem(True, f"mixed tags: {files.zero3_model_states[rank]} is from step {step}, rank 0 from "
                                    f"step {info.step}; give one tag's files")
        for index, group_shapes in enumerate(shapes):
            layout = Zero3SubGroupLayout.build(group_shapes, facts.world_size)
            masters = []
            for rank in range(facts.world_size):
                groups = optim[rank]["fp32_flat_groups"]
                if index >= len(groups):
                    self._problem(True, f"{files.optim_states[rank]} has no sub-group {index}; is it from another "
                                        "tag or run?")
                masters.append(groups[index])
            self._add_group(index, layout, masters,
                            [optim[r]["optimizer_state_dict"]["state"].get(index, {}) for r in range(facts.world_size)],
                            lambda rank, layout=layout: layout.length, strict)

        def frozen(name: str) -> LazyTensor:
            shape = torch.Size(frozen_shapes[name])
            pieces = [rank_states[r]["frozen_param_fragments"][name] for r in range(facts.world_size)]
            piece = pieces[0].numel
            if any(p.numel != piece for p in pieces) or piece * facts.world_size < shape.numel():
                self._problem(True, f"frozen parameter {quoted(name)} has inconsistent fragments across ranks")
            dtype = pieces[0].dtype
            return LazyTensor(shape, dtype, lambda: gather_zero3_pieces(pieces, 0, piece, shape, dtype),
                              f"frozen {name} (ZeRO-3 fragments)")

        self._assemble(module, self._master, frozen)

    # Stage 0 and model-states-only ----------------------------------------------------------------------
    def _open_stage0(self, states: dict, module: dict, strict: bool) -> None:
        optimizer = states.get("optimizer")
        masters = optimizer.get("fp32_groups") if isinstance(optimizer, dict) else None
        if not masters:
            source = "stage 0, fp32 training" if self.facts.training_dtype == "fp32" else "no fp32 masters saved"
            self._open_module_only(states, module, source)
            return
        self.info.weights_source = "fp32 masters (stage 0 optimizer fp32_groups)"
        self.info.tied = _aliases(module, self.info.buffers)
        params = {n: t for n, t in module.items() if n not in self.info.buffers and n not in self.info.tied}
        flat_masters = [m for group in masters for m in group]
        try:
            owner = _match_stage0_masters(params, flat_masters)
        except CogExportError as error:
            self._problem(strict, str(error))
            return
        self.info.trainable = [n for n in params if n in owner]
        self.info.frozen = [n for n in params if n not in owner]

        def master(name: str) -> LazyTensor:
            return _stored(owner[name], f"fp32 master of {name} (stage 0)")

        self._assemble(module, master, lambda name: _stored(module[name], f"frozen {name}"))

    def _open_module_only(self, states: dict, module: dict, why: str) -> None:
        info, facts = self.info, self.facts
        dtype = facts.training_dtype or "the stored dtype"
        info.weights_source = f"module state_dict ({why}: weights are the {dtype} copy)"
        if facts.training_dtype not in (None, "fp32"):
            info.notes.append(f"{why}: the weights are the module's {dtype} copy")
        self._assemble_module(states, module)

    def _assemble_module(self, states: dict, module: dict) -> None:
        """Every entry of a module state dict as stored (tied aliases found by storage)."""
        info = self.info
        info.tied = dict(states.get("shared_params") or {}) or _aliases(module, info.buffers)
        params = [n for n in module if n not in info.buffers and n not in info.tied]
        # ZeRO-1/2 record which parameters trained (param_shapes) and which were frozen (frozen_param_shapes, stage 2)
        # even when no optimizer file was saved, as in SAT runs; without either, nothing says, so all count as trained.
        trained = {n for group in states.get("param_shapes") or [] for n in group}
        frozen = set(states.get("frozen_param_shapes") or ())
        info.frozen = [n for n in params if n in frozen or (trained and n not in trained)]
        info.trainable = [n for n in params if n not in info.frozen]
        self._assemble(module, lambda name: _stored(module[name], name), lambda name: _stored(module[name], name))

    def _assemble(self, module: dict, master, frozen) -> None:
        """Fill the mapping in the module's state_dict order; aliases resolve to their source's tensor."""
        info = self.info
        trainable, frozen_names = set(info.trainable), set(info.frozen)
        order = list(module) + [n for n in info.trainable if n not in module]
        for name in order:
            if name in info.buffers:
                self._tensors[name] = _stored(module[name], f"buffer {name}")
            elif name in trainable:
                self._tensors[name] = master(name)
            elif name in frozen_names:
                self._tensors[name] = frozen(name)
            elif name not in info.tied:
                raise CogExportError(f"{self.files.where}: module entry {quoted(name)} is neither a trained, frozen or tied "
                                     "parameter nor a buffer; the checkpoint is inconsistent")
        for alias, source in info.tied.items():
            if source not in self._tensors:
                raise CogExportError(f"tied parameter {quoted(alias)} points at {quoted(source)}, which the checkpoint does not hold")
        self._tensors = {name: self._tensors[name] if name not in info.tied else self._tensors[info.tied[name]]
                         for name in order if name in self._tensors or name in info.tied}


def _scalar(value: Any) -> Any:
    """A per-group optimizer value (Adam's step) as a plain number, whether saved as a tensor or not."""
    return value.read().item() if isinstance(value, StoredTensor) and value.numel == 1 else value


def _stored(tensor: Any, origin: str) -> LazyTensor:
    if not isinstance(tensor, StoredTensor):
        raise CogExportError(f"{origin}: expected a tensor in the checkpoint, found {type(tensor).__name__}")
    return LazyTensor(tensor.shape, tensor.dtype, tensor.read, origin, tensor.byte_ranges())


def _training_dtype(config: dict, module: dict) -> str | None:
    for key, name in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16")):
        section = config.get(key)
        if isinstance(section, dict) and section.get("enabled"):
            return name
    if config:
        return "fp32"
    floating = [t.dtype for t in module.values() if isinstance(t, StoredTensor) and t.dtype.is_floating_point]
    return DTYPE_NAMES.get(max(set(floating), key=floating.count)) if floating else None


def _stage(config: dict, files: RankFiles, states: dict) -> int | None:
    zero = config.get("zero_optimization")
    if isinstance(zero, dict) and "stage" in zero:
        return int(zero["stage"])
    if files.zero3_model_states:
        return 3
    if states.get("param_shapes") is None:
        return 0 if config else None
    return 2 if states.get("frozen_param_shapes") is not None else 1


def _aliases(module: dict, buffers: list[str]) -> dict[str, str]:
    """Tied parameters found by storage: a later name stored at the same bytes as an earlier one."""
    first_at: dict[tuple, str] = {}
    aliases = {}
    for name, tensor in module.items():
        if name in buffers or not isinstance(tensor, StoredTensor) or tensor.numel == 0:
            continue
        if tensor.location in first_at:
            aliases[name] = first_at[tensor.location]
        else:
            first_at[tensor.location] = name
    return aliases


def _match_stage0_masters(params: dict[str, StoredTensor], masters: list[StoredTensor]) -> dict[str, StoredTensor]:
    """Pair stage-0 fp32 masters (saved without names) with the module's parameters.

    The masters follow the trainable parameters in module order; frozen ones have none. When every parameter
    trains, that is the whole answer. Otherwise a master can only belong to a later parameter than the one before
    it, of its shape, whose stored low-precision bits equal the master cast down (the optimizer wrote them back
    after its last step). If that still leaves two ways to pair them, the checkpoint cannot tell: say so.
    """
    names = list(params)
    if len(names) == len(masters) and all(params[n].shape == m.shape for n, m in zip(names, masters)):
        return dict(zip(names, masters))

    def fingerprint(tensor: torch.Tensor) -> tuple:
        return tuple(tensor.shape), hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).digest()

    low_dtype = params[names[0]].dtype if names else torch.float32
    param_prints = [fingerprint(params[name].read()) for name in names]
    master_prints = [fingerprint(master.read().to(low_dtype)) for master in masters]
    count, size = len(masters), len(names)
    # completions[i][j]: can masters i.. still pair, in order, with parameters j..?
    completions = [[False] * (size + 1) for _ in range(count)] + [[True] * (size + 1)]
    for i in range(count - 1, -1, -1):
        for j in range(size - 1, -1, -1):
            completions[i][j] = completions[i][j + 1] or (master_prints[i] == param_prints[j] and completions[i + 1][j + 1])
    owner: dict[str, StoredTensor] = {}
    position = 0
    for i, master in enumerate(masters):
        choices = [j for j in range(position, size) if master_prints[i] == param_prints[j] and completions[i + 1][j + 1]]
        if not choices:
            raise CogExportError(f"stage-0 fp32 master {i} {tuple(master.shape)} matches no parameter of the module; "
                                 "the checkpoint is inconsistent")
        if len(choices) > 1:
            raise CogExportError(f"cannot tell which parameter stage-0 fp32 master {i} belongs to: {names[choices[0]]} "
                                 f"and {names[choices[1]]} have its shape and stored values, and a stage-0 checkpoint does "
                                 "not record which parameters were frozen (ZeRO stages 1-3 record parameter names)")
        owner[names[choices[0]]] = master
        position = choices[0] + 1
    return owner
