"""cogexport: turn video-diffusion training checkpoints into the files people run: Diffusers folders, original
release layouts, LoRA adapters.

Library use::

    import cogexport
    with cogexport.open_checkpoint("runs/exp1") as checkpoint:   # lazy: nothing is read yet
        for name, tensor in checkpoint.items():
            print(name, tuple(tensor.shape), tensor.dtype)      # known before any data is read
        weight = checkpoint["head.weight"].load()               # reads just this tensor
    cogexport.consolidate("runs/exp1", "consolidated/", dtype="bf16")
    cogexport.export("runs/sat-run", "exported/", model_type="t2v", base="path/to/CogVideoX-5b")
    cogexport.export_original("exported/", "release/")                # the family's original layout
"""

__version__ = "0.1.0"

import gc as _gc  # noqa: E402
import importlib as _importlib  # noqa: E402
import sys as _sys  # noqa: E402
import types as _types  # noqa: E402

# What the package gives is imported when first used, not by ``import cogexport``: importing it imports torch (a
# second), and the command line (cogexport/__main__.py) sets torch's environment before that happens.
_GIVEN = {"open_checkpoint": ".checkpoint", "consolidate": ".consolidate", "CogExportError": ".errors"}


def __getattr__(name: str):
    if name.startswith("__"):  # introspection (__wrapped__, __path__ ...) imports nothing
        raise AttributeError(f"module 'cogexport' has no attribute {name!r}")
    _import_the_library()
    try:  # what _GIVEN names, and the subpackages importing it brought in (cogexport.write, ...)
        return globals()[name]
    except KeyError:
        raise AttributeError(f"module 'cogexport' has no attribute {name!r}") from None


def _import_the_library() -> None:
    """Import what ``import cogexport`` used to. Importing torch makes a few hundred thousand objects, and the cyclic
    collector walks them over and over while it does (each full pass a walk of all of them): paused, an import takes
    0.1 s less. Never left paused."""
    collecting = _gc.isenabled()
    _gc.disable()
    try:
        for name, module in _GIVEN.items():
            globals()[name] = getattr(_importlib.import_module(module, __name__), name)
    finally:
        if collecting:
            _gc.enable()


def export(checkpoint, output, options=None, **overrides):
    """Export a checkpoint to a Diffusers folder (see cogexport.export.ExportOptions)."""
    from .export import export as run_export  # imports diffusers: only when exporting

    return run_export(checkpoint, output, options, **overrides)


def export_original(checkpoint, output, options=None, **overrides):
    """Write Diffusers weights back in their family's original layout (see cogexport.export.ExportOptions)."""
    from .export import export_original as run_export_original

    return run_export_original(checkpoint, output, options, **overrides)


__all__ = ["CogExportError", "__version__", "consolidate", "export", "export_original", "open_checkpoint"]


class _Package(_types.ModuleType):
    """This package's module. Its functions ``export`` and ``consolidate`` share their names with the modules that do
    the work (cogexport/export/, cogexport/consolidate.py), and importing a module binds it on its package by name:
    after a first ``cogexport.export(...)``, ``cogexport.export`` was the subpackage and a second call failed
    ("'module' object is not callable"). The functions keep their names here; the modules are reached by their dotted
    names (``from cogexport.export import ExportOptions``)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _FUNCTIONS_NAMED_LIKE_MODULES and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_FUNCTIONS_NAMED_LIKE_MODULES = frozenset({"export", "consolidate"})
_sys.modules[__name__].__class__ = _Package
