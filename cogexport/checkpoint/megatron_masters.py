"""The fp32 masters of a mixed-precision Megatron-Core run, read as its weights.

A bf16 (or fp16) run keeps an fp32 copy of every trainable low-precision parameter, saved in the parameter's own
global shape: megatron-core's ``Float16OptimizerWithFloat16Params`` and its distributed optimizer's
``fully_sharded_model_space`` layout as ``optimizer.state.fp32_param.<key>``, the distributed optimizer's
``fully_reshardable`` layout (megatron-core 0.14 and later, gathered from its flat buckets on saving) as
``optimizer.state.param.<key>``. Those masters are what the optimizer stepped; the model's bf16 tensor is each one
rounded after the step. cogexport reads them in place of the 16-bit copies, as it reads DeepSpeed's fp32 masters
rather than the module's 16-bit copy, and says so: the rule is one, never a silent mix. Parameters without a master
are read as saved and named in a note: the ones kept in fp32 (megatron-core's norms) are their own masters (the
distributed optimizer saves their ``param`` too: the same values, not read), the others (frozen ones) were never
stepped. A save holding masters under both names is refused: it is no one layout.

Before anything is written, each master is checked against the copy it was rounded to (a few elements of one chunk
per parameter, the chunk turning with the key so every rank file is sampled): a master from another save or rank
file does not round to it. A trained low-precision parameter without a master, where others have theirs, is refused
by name: half the model at the masters' precision and half at bf16 would be neither.
"""

from __future__ import annotations

import torch

from ..errors import CogExportError, quoted
from .dcp import DcpFiles, dtype_name
from .dcp_metadata import TensorEntry
from .megatron_zarr import ZarrFiles

IterationFiles = DcpFiles | ZarrFiles  # a torch_dist iteration's DCP save, or a zarr-backend iteration

MASTER_STATES = ("fp32_param", "param")  # see the module docstring: which layout saves which
LOW = (torch.bfloat16, torch.float16)  # the training dtypes whose parameters a mixed-precision run keeps masters of
SAMPLED = 4  # elements compared per parameter


def master_key(key: str, state: str) -> str:
    return f"optimizer.state.{state}.{key}"


def master_state(files: IterationFiles, optimized: dict[str, set[str]]) -> str | None:
    """The optimizer state the save keeps its masters under, if any."""
    held = [state for state in MASTER_STATES if any(state in states for states in optimized.values())]
    if len(held) > 1:
        raise CogExportError(f"{files.folder} holds fp32 masters under both optimizer.state.{held[0]}.* and "
                             f"optimizer.state.{held[1]}.*: no one Megatron-Core layout saves both, so which are the "
                             "weights cannot be told; copy the iteration folder again")
    return held[0] if held else None


def masters_of(files: IterationFiles, optimized: dict[str, set[str]]) -> tuple[str | None, dict[str, str]]:
    """The state the masters are saved under, and the model key -> its fp32 master's key for every low-precision
    parameter that has one; checked as the module says."""
    entries = files.metadata.entries
    state = master_state(files, optimized)
    found = {key: master_key(key, state) for key, states in optimized.items()
             if state in states and entries[key].dtype in LOW}
    if not found:
        return None, {}
    for key, master in found.items():
        if entries[master].dtype != torch.float32:
            raise CogExportError(f"{files.folder}: {quoted(master)} is {dtype_name(entries[master].dtype)}, not an "
                                 "fp32 master; the .metadata is damaged or not Megatron-Core's")
    unmastered = sorted(key for key, states in optimized.items() if key not in found
                        and entries[key].dtype != torch.float32)
    if unmastered:
        raise CogExportError(f"{files.folder}: the optimizer trained {quoted(unmastered[0])} "
                             f"({dtype_name(entries[unmastered[0]].dtype)}) but holds no fp32 master of it, though "
                             f"{len(found)} other parameters have theirs (optimizer.state.{state}.*): the "
                             "iteration is incomplete or its .metadata damaged; cogexport will not mix masters with "
                             "rounded copies")
    for turn, (key, master) in enumerate(found.items()):
        check_rounds_to_copy(files, key, master, turn)
    return state, found


def check_rounds_to_copy(files: IterationFiles, key: str, master: str, turn: int) -> None:
    """The first elements of one chunk of the model's saved copy of ``key`` equal its master rounded."""
    entries = files.metadata.entries
    copy_entry, master_entry = entries[key], entries[master]
    chunks = files.check_chunks(key, copy_entry)
    if not chunks:
        return
    chunk = chunks[turn % len(chunks)]
    saved = read_elements(files, key, copy_entry, chunk, 0, min(SAMPLED, chunk.numel))
    places = torch.stack(torch.unravel_index(torch.arange(len(saved)), chunk.sizes), dim=1) + \
        torch.tensor(chunk.offsets)
    values = torch.stack([element(files, master, master_entry, tuple(place.tolist())) for place in places])
    if not torch.equal(values.to(saved.dtype).view(torch.uint8), saved.view(torch.uint8)):
        raise CogExportError(f"{files.folder}: the fp32 master of {quoted(key)} ({quoted(master)}) does not round to "
                             f"the model's saved {dtype_name(saved.dtype)} copy (at {list(places[0].tolist())}): the "
                             "iteration's rank files are damaged or mixed from different saves; copy it again")


def element(files: IterationFiles, key: str, entry: TensorEntry, place: tuple[int, ...]) -> torch.Tensor:
    """One element of a tensor, read from the chunk holding it."""
    for chunk in files.check_chunks(key, entry):
        local = [p - o for p, o in zip(place, chunk.offsets)]
        if all(0 <= at < size for at, size in zip(local, chunk.sizes)):
            flat = 0
            for at, size in zip(local, chunk.sizes):
                flat = flat * size + at
            return read_elements(files, key, entry, chunk, flat, flat + 1)[0]
    raise CogExportError(f"{files.folder}: no chunk of {quoted(key)} holds {list(place)}; the .metadata is damaged")


def read_elements(files: IterationFiles, key: str, entry: TensorEntry, chunk, start: int, stop: int) -> torch.Tensor:
    # compared only, never written: the bytes that are written are read (and checked) by the export itself
    return files.read_elements(key, entry, chunk, start, stop)
