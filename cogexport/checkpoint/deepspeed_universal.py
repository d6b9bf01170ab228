"""Read a DeepSpeed universal checkpoint folder (``cogexport universal``'s or ``ds_to_universal``'s output) lazily:
the weights are the per-parameter ``zero/<name>/fp32.pt`` files, described by the folder's model-states file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CogExportError
from ..lazy import LazyTensor
from .base import CheckpointInfo, LazyCheckpoint, ReaderFacts
from .deepspeed_zero import ENGINE_KEYS, _summary
from .torch_archive import StoredTensor, TorchArchive, load_torch_file

MODEL_STATES_NAMES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
# What DeepSpeed takes from a universal checkpoint, and what it leaves to the model being resumed.
RESTORED = ("trainable parameters' fp32 masters, every per-parameter optimizer state, the optimizer step and "
            "param_groups (lr, betas, ...), global_steps, the lr scheduler and client state")
NOT_RESTORED = ("frozen parameters and buffers: they keep the resuming model's own initialisation (cogexport "
                "stores them in zero/<name>/fp32.pt and the model-states file, but DeepSpeed does not read them)")


@dataclass
class UniversalFacts(ReaderFacts):
    """What a universal checkpoint says of the run it was made from: the world size it was saved at, the DeepSpeed
    version, and the training code's own entries (client state), each summarised."""

    world_size: int | None = None
    ds_version: str | None = None
    client_state: dict[str, str] = field(default_factory=dict)


def _read_and_close(tensor: StoredTensor, archive: TorchArchive):
    # One file per parameter: keeping each open after its read would run out of descriptors on big models.
    try:
        return tensor.read()
    finally:
        archive.close()


class UniversalCheckpoint(LazyCheckpoint):
    def __init__(self, folder: Path) -> None:
        super().__init__()
        folder = Path(folder)
        self._archives: list[TorchArchive] = []
        self.facts = UniversalFacts()
        self.info = CheckpointInfo(format="deepspeed-universal", paths=[str(folder)], facts=self.facts, tag=folder.name,
                                   weights_source="fp32 masters (universal checkpoint)")
        try:
            self._open(folder)
        except BaseException:
            self.close()
            raise

    def _load(self, path: Path) -> Any:
        archive, tree = load_torch_file(path)
        self._archives.append(archive)
        self.info.files.append(str(path))
        return tree

    def _open(self, folder: Path) -> None:
        info = self.info
        states_path = next((folder / n for n in MODEL_STATES_NAMES if (folder / n).is_file()), None)
        if states_path is None:
            raise CogExportError(f"{folder} has zero/optimizer_state.pt but no model-states file; not a complete "
                                 "universal checkpoint")
        states = self._load(states_path)
        info.step = states.get("global_steps")
        self.facts.ds_version = states.get("ds_version")
        self.facts.world_size = states.get("dp_world_size")
        self.facts.client_state = {k: _summary(v) for k, v in states.items() if k not in ENGINE_KEYS}
        info.buffers = list(states.get("buffer_names") or [])
        module_order = list(states.get("module") or {})
        saved = {}
        for path in sorted((folder / "zero").iterdir()):
            if path.is_dir() and (path / "fp32.pt").is_file():
                saved[path.name] = path
        for name in sorted(saved, key=lambda n: (module_order.index(n) if n in module_order else len(module_order), n)):
            tree = self._load(saved[name] / "fp32.pt")
            tensor = tree.get("param") if isinstance(tree, dict) else tree
            if not isinstance(tensor, StoredTensor):
                raise CogExportError(f"{saved[name] / 'fp32.pt'} holds no tensor")
            self._tensors[name] = LazyTensor(tensor.shape, tensor.dtype, lambda t=tensor, a=self._archives[-1]:
                                             _read_and_close(t, a), f"{name} (universal)")
            states_here = {p.stem for p in saved[name].glob("*.pt")} - {"fp32", "step"}
            if states_here:
                info.trainable.append(name)
            elif name not in info.buffers:
                info.frozen.append(name)
        info.buffers = [name for name in info.buffers if name in self._tensors]
        # A tied alias has no folder of its own (cogexport) or a copy DeepSpeed never reads: it is its source.
        info.tied = {alias: source for alias, source in (states.get("shared_params") or {}).items()
                     if source in saved}
        info.trainable = [name for name in info.trainable if name not in info.tied]
        info.frozen = [name for name in info.frozen if name not in info.tied]
        names = sorted({*saved, *info.tied}, key=lambda n: (module_order.index(n) if n in module_order
                                                            else len(module_order), n))
        self._tensors = {name: self._tensors[info.tied.get(name, name)] for name in names}
        info.notes += [f"DeepSpeed restores from it: {RESTORED}", f"DeepSpeed does not restore: {NOT_RESTORED}"]
        unchecked = [a.path.name for a in self._archives if not a.records.has_crcs]
        if unchecked:
            info.notes.append(f"{len(unchecked)} file(s) saved without CRC-32 checksums, so damage to their data "
                              f"cannot be detected: {', '.join(unchecked[:3])}{' ...' if len(unchecked) > 3 else ''}")

    def bytes_read(self) -> dict[str, int]:
        return {str(archive.path): archive.bytes_read for archive in self._archives}

    def check_stored_data(self) -> list[str]:
        return [problem for archive in self._archives for problem in archive.records.check_all()]

    def close(self) -> None:
        for archive in self._archives:
            archive.close()
