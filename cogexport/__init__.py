"""cogexport: turn video-diffusion training checkpoints into inference-ready Hugging Face Diffusers folders.

Library use::

    import cogexport
    with cogexport.open_checkpoint("runs/exp1") as checkpoint:   # lazy: nothing is read yet
        for name, tensor in checkpoint.items():
            print(name, tuple(tensor.shape), tensor.dtype)      # known before any data is read
        weight = checkpoint["head.weight"].load()               # reads just this tensor
    cogexport.consolidate("runs/exp1", "exported/", dtype="bf16")
"""

__version__ = "0.1.0"

from .checkpoint import open_checkpoint  # noqa: E402
from .consolidate import consolidate  # noqa: E402
from .errors import CogExportError  # noqa: E402

__all__ = ["CogExportError", "__version__", "consolidate", "open_checkpoint"]
