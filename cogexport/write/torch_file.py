"""Write ``torch.save`` files that DeepSpeed will read, including objects of DeepSpeed's own classes.

Reading turns DeepSpeed's pickled classes (e.g. an fp16 ``DynamicLossScaler``) into inert ``PickledObject``
stand-ins; writing puts them back as they were pickled: the class by name, created with ``cls.__new__``, then
its saved state. Pickling a class by name normally imports it; this pickler writes the name itself, so
deepspeed never needs to be installed, and DeepSpeed unpickles its real class.
"""

from __future__ import annotations

import pickle
import types
from pathlib import Path
from typing import Any

import torch

from ..pickled import PickledObject


class _StandInPickler(pickle._Pickler):  # the Python pickler, whose save() can be extended
    def save(self, obj: Any, save_persistent_id: bool = True) -> None:
        if not isinstance(obj, PickledObject):
            return super().save(obj, save_persistent_id)
        module, _, name = obj.type_name.rpartition(".")
        self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
        super().save(tuple(obj.args))
        self.write(pickle.NEWOBJ)
        self.memoize(obj)
        if obj.state is not None:
            super().save(obj.state)
            self.write(pickle.BUILD)


# torch.save takes a pickle module; only its Pickler is used for writing.
_PICKLE_MODULE = types.SimpleNamespace(Pickler=_StandInPickler, __name__="cogexport.write.torch_file")


def save_torch_file(obj: Any, path: Path) -> None:
    """torch.save ``obj`` to ``path``; stand-ins of foreign classes are written as those classes."""
    torch.save(obj, path, pickle_module=_PICKLE_MODULE)
