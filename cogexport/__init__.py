"""cogexport: turn video-diffusion training checkpoints into inference-ready Hugging Face Diffusers folders.

Library use::

    import cogexport
    with cogexport.open_checkpoint("runs/exp1") as checkpoint:   # lazy: nothing is read yet
        for name, tensor in checkpoint.items():
            print(name, tuple(tensor.shape), tensor.dtype)      # known before any data is read
        weight = checkpoint["head.weight"].load()               # reads just this tensor
    cogexport.consolidate("runs/exp1", "consolidated/", dtype="bf16")
    cogexport.export("runs/sat-run", "exported/", model_type="t2v", base="path/to/CogVideoX-5b")
"""

__version__ = "0.1.0"

from .checkpoint import open_checkpoint  # noqa: E402
from .consolidate import consolidate  # noqa: E402
from .errors import CogExportError  # noqa: E402


def export(checkpoint, output, options=None, **overrides):
    """Export a CogVideoX checkpoint to a Diffusers folder (see cogexport.to_diffusers.ExportOptions)."""
    from .to_diffusers import export as run_export  # imports diffusers: only when exporting

    return run_export(checkpoint, output, options, **overrides)


__all__ = ["CogExportError", "__version__", "consolidate", "export", "open_checkpoint"]
