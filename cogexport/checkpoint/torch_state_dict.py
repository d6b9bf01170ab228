"""Read a plain ``torch.save`` state-dict file (e.g. SAT's ``vae/3d-vae.pt``) safely and lazily."""

from __future__ import annotations

from pathlib import Path

from ..errors import CogExportError
from ..lazy import LazyTensor
from .base import CheckpointInfo, LazyCheckpoint
from .torch_archive import StoredTensor, load_torch_file
from .training_state import is_training_state, named_training_state, refuse_training_state_role
from .weight_sets import choose_set

# Where training code puts the weights inside a saved dict, most specific first.
_STATE_DICT_KEYS = ("state_dict", "module", "model", "model_state_dict")


class TorchStateDictCheckpoint(LazyCheckpoint):
    """``entry`` names the dict entry to read (e.g. ``ema``, saved beside ``module``); by default the first of
    _STATE_DICT_KEYS the file has, or the file itself when its values are the tensors."""

    def __init__(self, path: Path, entry: str | None = None) -> None:
        super().__init__()
        path = Path(path)
        refuse_training_state_role(entry, str(path))
        self._archive, tree = load_torch_file(path)
        self.info = CheckpointInfo(format="torch", paths=[str(path)], files=[str(path)])
        weights, where = self._weights_in(path, tree, entry)
        if not isinstance(weights, dict) or not any(isinstance(v, StoredTensor) for v in weights.values()):
            self.close()
            raise CogExportError(f"{path} holds no state dict (expected tensors at the top level or under "
                                 f"{', '.join(repr(k) for k in _STATE_DICT_KEYS)})")
        if entry is None:
            weights, _ = self._one_of_two_sets(path, weights, None)
        self.info.weights_source = f"state dict in {where}"
        skipped = [k for k, v in weights.items() if not isinstance(v, StoredTensor)]
        if skipped:
            self.info.notes.append(f"ignored {len(skipped)} non-tensor entries: {', '.join(map(str, skipped[:5]))}")
        if isinstance(tree, dict) and isinstance(tree.get("iteration"), int):
            self.info.step = tree["iteration"]
        weights = self._without_training_state(path, weights)
        for name, tensor in weights.items():
            if isinstance(tensor, StoredTensor):
                self._tensors[str(name)] = LazyTensor(tensor.shape, tensor.dtype, tensor.read,
                                                      f"{name} in {path.name}", tensor.byte_ranges())
        self.info.trainable = list(self._tensors)

    def _weights_in(self, path: Path, tree: object, entry: str | None) -> tuple[object, str]:
        """The state dict ``entry`` names (a dict entry, else one of two prefixed sets), or the first of
        _STATE_DICT_KEYS the file has, or the file itself; and where it was found."""
        if entry is not None and isinstance(tree, dict) and isinstance(tree.get(entry), dict):
            return tree[entry], f"'{entry}'"
        if entry is not None:
            return self._one_of_two_sets(path, tree, entry)
        if isinstance(tree, dict):
            for key in _STATE_DICT_KEYS:
                if isinstance(tree.get(key), dict):
                    return tree[key], f"'{key}'"
        return tree, "the file"

    def _one_of_two_sets(self, path: Path, weights: object, role: str | None) -> tuple[object, str]:
        """The set ``role`` names of a flat state dict keeping a model and its EMA under two prefixes
        (weight_sets.py); no such dict with a role is a file without that state dict."""
        if not isinstance(weights, dict) or not all(isinstance(name, str) for name in weights):
            if role is None:
                return weights, "the file"
            self.close()
            raise CogExportError(f"{path} holds no {role!r} state dict")
        try:
            chosen, name, note = choose_set(weights, role, str(path))
        except CogExportError:
            self.close()
            raise
        if role is not None and name is None:
            self.close()
            raise CogExportError(f"{path} holds no {role!r} state dict")
        if note:
            self.info.notes.append(note)
        return chosen, (f"the {name}.* set" if name else "the file")

    def _without_training_state(self, path: Path, weights: dict) -> dict:
        """The state dict's tensors but those that are a trainer's state (training_state.py: an optimizer's
        ``state.<name>.exp_avg``, a ``step`` counter), named in a note; none left is no state dict."""
        left_out = [str(name) for name, value in weights.items()
                    if isinstance(value, StoredTensor) and is_training_state(str(name))]
        if not left_out:
            return weights
        kept = {name: value for name, value in weights.items() if str(name) not in left_out}
        if not any(isinstance(value, StoredTensor) for value in kept.values()):
            self.close()
            raise CogExportError(f"{path} holds training state only ({named_training_state(left_out)}): optimizer, "
                                 "scheduler and trainer state are never model weights; point at the model's weights")
        self.info.notes.append(f"left out {len(left_out)} tensor{'s' * (len(left_out) != 1)} of training state, never model weights: "
                               f"{named_training_state(left_out)}")
        return kept

    def bytes_read(self) -> dict[str, int]:
        return {str(self._archive.path): self._archive.bytes_read}

    def check_stored_data(self) -> list[str]:
        return self._archive.records.check_all()

    def close(self) -> None:
        self._archive.close()
