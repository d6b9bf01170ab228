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

# What the package gives is imported when first used, not by ``import cogexport``: importing it imports torch (a
# second), and the command line (cogexport/__main__.py) sets torch's environment before that happens.
# The modules doing the work are named apart from the functions given here (cogexport/exporter/ beside ``export``,
# cogexport/consolidation.py beside ``consolidate``): importing a module binds it on its package by its name, which
# would replace a function of the same name.
_GIVEN = {"open_checkpoint": ".checkpoint", "consolidate": ".consolidation", "CogExportError": ".errors"}
# Given too, but imported only when asked for: they bring in the whole export package (0.1 s more).
_GIVEN_WHEN_ASKED = {"ExportOptions": ".exporter.options", "ExportResult": ".exporter.result"}


def __getattr__(name: str):
    if name.startswith("__"):  # introspection (__wrapped__, __path__ ...) imports nothing
        raise AttributeError(f"module 'cogexport' has no attribute {name!r}")
    if name in _GIVEN_WHEN_ASKED:
        return _give(name, _GIVEN_WHEN_ASKED[name])
    if not _GIVEN.keys() <= globals().keys():
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
            _give(name, module)
    finally:
        if collecting:
            _gc.enable()


def _give(name: str, module: str):
    """Import ``name`` from this package's ``module`` and bind it here, so it is looked up once."""
    globals()[name] = value = getattr(_importlib.import_module(module, __name__), name)
    return value


def export(checkpoint, output, options=None, **overrides):
    """Export a checkpoint to a Diffusers folder (see cogexport.ExportOptions)."""
    from .exporter import export as run_export

    return run_export(checkpoint, output, options, **overrides)


def export_original(checkpoint, output, options=None, **overrides):
    """Write Diffusers weights back in their family's original layout (see cogexport.ExportOptions)."""
    from .exporter import export_original as run_export_original

    return run_export_original(checkpoint, output, options, **overrides)


__all__ = ["CogExportError", "ExportOptions", "ExportResult", "__version__", "consolidate", "export", "export_original",
           "open_checkpoint"]
