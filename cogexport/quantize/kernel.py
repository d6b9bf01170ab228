"""The compiled quantizer of the K types and Q8_0 (kquant_kernel.c), loaded with ctypes when the install built it.

It makes the same bytes as the torch code (kquants.py's search, legacy.py's Q8_0; each byte-identical to llama.cpp's
reference quantizers, and the tests hold both paths to it), the K types at 0.6-0.9x the reference's time per value
where the torch search took 1.1-1.6x; Q8_0 in one pass over the values where torch makes several, so that threads
share it instead of waiting on memory. ctypes
releases Python's lock for the call, so threads quantizing different rows run on every core at once
(``threads.py``). Without the library (an install without a C compiler: the extension is optional) the torch search
quantizes, and a GGUF export says so once (``MISSING_NOTE``). ``COGEXPORT_KQUANT_KERNEL=0`` turns it off (the
torch path, for comparison or should the library be suspected).
"""

from __future__ import annotations

import ctypes
import os
import sysconfig
from functools import lru_cache
from pathlib import Path

import torch

BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_0": 34}
# The types whose torch code is about twice as slow as the compiled one's: an export without the library says so.
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")
LIBRARY = Path(__file__).with_name("_kquant_kernel" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
MISSING_NOTE = ("the compiled K-type quantizer is not built (no C compiler when cogexport was installed, or built from "
                "an older source): the K types were quantized by the torch path (the same bytes, about twice as "
                "slow); reinstall cogexport where a C compiler is found to build it")


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    if os.environ.get("COGEXPORT_KQUANT_KERNEL", "1") == "0" or not LIBRARY.is_file():
        return None
    try:
        library = ctypes.CDLL(str(LIBRARY))
    except OSError:  # built for another machine or damaged: the torch path is exact too
        return None
    for type_name in BLOCK_BYTES:
        function = getattr(library, _function_name(type_name), None)
        if function is None:  # built from an older kquant_kernel.c (an editable checkout not reinstalled)
            return None
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        function.restype = ctypes.c_int
    return library


def _function_name(type_name: str) -> str:
    return f"cogexport_quantize_{type_name.lower()}"


def available() -> bool:
    """Whether the compiled quantizer is there to use."""
    return _library() is not None


def handles(type_name: str) -> bool:
    return type_name in BLOCK_BYTES and available()


def quantize_blocks(blocks: torch.Tensor, type_name: str, into: torch.Tensor) -> bool:
    """``blocks`` (float32, (count, the type's block: 256 values, Q8_0's 32)) stored as ``type_name`` into ``into``
    (uint8, contiguous, count times the bytes of a block); False, with nothing quantized, when a value is not finite or beyond float16's range (the
    caller's checks then raise the error)."""
    values = blocks.contiguous()
    if not into.is_contiguous() or into.numel() != values.shape[0] * BLOCK_BYTES[type_name]:
        raise ValueError(f"{type_name}: room for {values.shape[0]} blocks expected, got {tuple(into.shape)}")
    function = getattr(_library(), _function_name(type_name))
    return function(values.data_ptr(), into.data_ptr(), values.shape[0]) == 0
