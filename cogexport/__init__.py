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

# Importing torch makes a few hundred thousand objects, and the cyclic collector walks them over and over while
# it does (each full pass a walk of all of them): paused, an import takes 0.1 s less. Never left paused.
_collecting = _gc.isenabled()
_gc.disable()
try:
    from .checkpoint import open_checkpoint  # noqa: E402
    from .consolidate import consolidate  # noqa: E402
    from .errors import CogExportError  # noqa: E402
finally:
    if _collecting:
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
