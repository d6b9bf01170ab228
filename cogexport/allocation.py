"""Let the command's process reuse the memory of tensors it has freed, instead of returning it to the kernel.

cogexport holds one tensor at a time: it allocates a buffer of tens to hundreds of MB, fills it, writes it and frees
it, thousands of times. glibc serves allocations that large with a fresh ``mmap`` and unmaps them on free, so every
tensor costs page faults and zeroing of its whole size again (measured on a 2B-parameter LTX-Video export: about
1 s of its 6-7 s of system time). Raising glibc's mmap and trim thresholds keeps freed blocks in the heap for the next tensor; peak memory
stays that of the largest tensors in flight. One arena for every thread keeps the worker threads' tensors there too:
glibc gives each thread an arena of its own, made of heaps of 64 MB at most, which cannot hold a bigger tensor and
hand their freed pages back (measured on a GGUF job's reading thread, cogexport/write/read_ahead.py: 0.1-0.55
million page faults for the release's reads against 12 thousand in the main thread, 1 s more CPU; the threads
allocate a few blocks a tensor, so they seldom wait on the one arena's lock). Only the command line does this: it
owns its process, a library caller owns theirs.
"""

from __future__ import annotations

import ctypes

# glibc's mallopt parameters (malloc.h) and the size under which blocks stay in the heap: above any one tensor of
# the models cogexport handles (the largest, Wan 14B's FFN weights in fp32, are about 0.3 GB).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_KEEP_BELOW = 1 << 30


def reuse_freed_tensor_memory() -> bool:
    """Tune glibc's allocator for one-tensor-at-a-time work; False where there is no glibc (nothing changes)."""
    try:  # the running interpreter's own symbols: libc is linked in (find_library would start a subprocess)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # musl, macOS: no mallopt, and their allocators behave otherwise anyway
        return False
    return all([mallopt(_M_MMAP_THRESHOLD, _KEEP_BELOW), mallopt(_M_TRIM_THRESHOLD, _KEEP_BELOW),
                mallopt(_M_ARENA_MAX, 1)])
