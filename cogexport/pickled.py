"""Objects of classes cogexport never imports, as the readers make them from pickles and the writers put them back:
inert data holders shared by the source side (checkpoint/) and the sink side (write/)."""

from __future__ import annotations

from typing import Any


class PickledObject:
    """An object of a class cogexport never imports, kept as inert data.

    ``type_name`` is the pickled class's dotted name, ``args`` what it was constructed with and ``state``
    what was pickled as its state. Nothing of the original class runs.
    """

    type_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> "PickledObject":
        obj = object.__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def get(self, key: str, default: Any = None) -> Any:
        """An attribute from the pickled state (a dict, or a (dict, slots) pair)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:
            state = {**(state[0] or {}), **(state[1] or {})}
        return state.get(key, default) if isinstance(state, dict) else default

    def __repr__(self) -> str:
        return f"<{self.type_name} (not loaded) {self.state!r}>"


def stand_in(qualified_name: str) -> type[PickledObject]:
    return type(qualified_name.rsplit(".", 1)[-1], (PickledObject,), {"type_name": qualified_name})
