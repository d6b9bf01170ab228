"""A model and its EMA kept side by side in one flat state dict, each under its own top-level prefix: ``net.*`` and
``net_ema.*`` (imaginaire's DCP ``model/`` folders and the ``model.pt`` NVIDIA's convert_distcp_to_pt.py makes of
them). The trained set is read unless asked otherwise (``--ema``, or ``--role net_ema``, for the EMA; ``--role net``
says the default), as every trainer's run is read for the weights it trained, and a note names the EMA left unread:
never a silent choice. The set chosen keeps the trained set's prefix (``net_ema.x`` is read as ``net.x``, as NVIDIA's script renames it), so the same key map reads
either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, TypeVar

from ..errors import CogExportError

_EMA_SUFFIX = "_ema"
T = TypeVar("T")


@dataclass(frozen=True)
class WeightSets:
    """The trained set's prefix name (``net``) and its EMA's (``net_ema``)."""

    trained: str
    ema: str

    def described(self) -> str:
        return (f"two sets of weights, {self.trained}.* (the trained weights) and {self.ema}.* (their EMA): pass "
                f"--role {self.trained} for the trained weights or --ema for the EMA")

    def default_note(self, where: str) -> str:
        return (f"{where} holds {self.trained}.* (the trained weights) and {self.ema}.* (their EMA): read "
                f"{self.trained}.*; --ema reads the EMA")


def weight_sets(names: Iterable[str]) -> WeightSets | None:
    """The two sets when the names hold ``X.*`` and ``X_ema.*`` with the same names under each; else None."""
    groups: dict[str, set[str]] = {}
    for name in names:
        head, dot, rest = name.partition(".")
        if dot:
            groups.setdefault(head, set()).add(rest)
    for head, rest in groups.items():
        ema = groups.get(head + _EMA_SUFFIX)
        if ema is not None and ema == rest:
            return WeightSets(head, head + _EMA_SUFFIX)
    return None


def choose_set(weights: Mapping[str, T], role: str | None, where: str
               ) -> tuple[dict[str, T], str | None, str | None]:
    """``weights`` narrowed to the set ``role`` names (``ema`` or the EMA's prefix: the EMA; the trained prefix or
    None: the trained weights), its keys under the trained set's prefix, the set's name, and the note saying the
    EMA was left unread when no role chose; ``weights`` as they are (and None, None) when they hold no two sets."""
    sets = weight_sets(weights)
    if sets is None:
        return dict(weights), None, None
    if role is not None and role not in (sets.trained, sets.ema, "ema"):
        raise CogExportError(f"{where} holds no {role!r} weights; it holds {sets.described()}")
    chosen = sets.trained if role in (None, sets.trained) else sets.ema
    prefix = chosen + "."
    return ({sets.trained + "." + name[len(prefix):]: value for name, value in weights.items()
             if name.startswith(prefix)}, chosen, sets.default_note(where) if role is None else None)
