"""The dtype policy: one output dtype, except an allowlist of tensors kept in fp32.

Allowlist entries are globs matched on dotted name components: ``norm_q`` keeps every tensor with a
``norm_q`` component (``transformer_blocks.3.attn1.norm_q.weight``), ``norm_out.norm`` needs the two
components in a row, ``*`` keeps everything. Tensors that are not floating point are never cast.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import torch

from .errors import CogExportError
from .lazy import LazyTensor

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def dtype_named(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise CogExportError(f"--dtype {name!r} is not one of {', '.join(DTYPES)}") from None


def _block_pattern(name: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


def adapter_part(name: str) -> str:
    """What an adapter file's tensor is, whatever module it belongs to: its last name component (alpha, lokr_w1), or
    its last two for a weight or bias (lora_A.weight, lora_down.weight)."""
    parts = name.split(".")
    return ".".join(parts[-2:]) if parts[-1] in ("weight", "bias") and len(parts) > 1 else parts[-1]


def describe_written(tensors: Mapping[str, LazyTensor], pattern: Callable[[str], str] = _block_pattern) -> str:
    """The dtypes of tensors as written, in the names they are written under (the way back writes original names, in
    which the policy's Diffusers-name globs would mislead): the main dtype, and the name patterns (by default block
    indices as *) of the floating tensors kept in another."""
    floating = {name: tensor.dtype for name, tensor in tensors.items() if tensor.dtype.is_floating_point}
    if not floating:
        return "no floating tensors"
    names = {**{dtype: name for name, dtype in DTYPES.items()}, torch.float8_e4m3fn: "fp8 e4m3fn",
             torch.float8_e5m2: "fp8 e5m2"}
    counts: dict[torch.dtype, int] = {}
    for dtype in floating.values():
        counts[dtype] = counts.get(dtype, 0) + 1
    main = max(counts, key=counts.get)
    others: dict[str, list[str]] = {}
    for name, dtype in floating.items():
        if dtype != main:
            kept = others.setdefault(names.get(dtype, str(dtype)), [])
            if pattern(name) not in kept:
                kept.append(pattern(name))
    kept = "; ".join(f"{', '.join(patterns)} kept in {dtype}" for dtype, patterns in others.items())
    return f"{names.get(main, str(main))}" + (f", except {kept}" if kept else "")


def _matches(pattern: str, name: str) -> bool:
    """Whether some run of ``name``'s dotted parts matches ``pattern``'s globs, part for part."""
    wanted, plain = _globs(pattern)
    parts = name.split(".")
    if not plain.issubset(parts):  # most names: a part without wildcards is missing, so no run can match
        return False
    return any(all(fnmatch.fnmatchcase(part, glob) for part, glob in zip(parts[start:], wanted))
               for start in range(len(parts) - len(wanted) + 1))


@functools.cache
def _globs(pattern: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """A pattern's globs, one per dotted part, and those of them without wildcards (each matches only itself)."""
    wanted = tuple(pattern.split("."))
    return wanted, frozenset(glob for glob in wanted if not any(character in glob for character in "*?["))


@dataclass(frozen=True)
class AsRead:
    """Every tensor kept in the dtype it was read in: an adapter's policy when no --dtype is given (the dtype it was
    trained in; casting a bf16 adapter to fp32 doubles its size and changes nothing)."""

    keep_fp32: tuple[str, ...] = ()

    def target_dtype(self, name: str, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def apply(self, tensors: Mapping[str, LazyTensor]) -> dict[str, LazyTensor]:
        return dict(tensors)

    def describe(self) -> str:
        return "every tensor in the dtype it was read in"


@dataclass(frozen=True)
class PrecisionPolicy:
    dtype: torch.dtype
    keep_fp32: tuple[str, ...] = ()

    @classmethod
    def build(cls, dtype: str, defaults: Iterable[str], extra: Iterable[str]) -> "PrecisionPolicy":
        return cls(dtype_named(dtype), tuple(dict.fromkeys([*defaults, *extra])))

    def target_dtype(self, name: str, dtype: torch.dtype) -> torch.dtype:
        if not dtype.is_floating_point:
            return dtype
        if self.dtype != torch.float32 and any(_matches(p, name) for p in self.keep_fp32):
            return torch.float32
        return self.dtype

    def apply(self, tensors: Mapping[str, LazyTensor]) -> dict[str, LazyTensor]:
        return {name: tensor.to(self.target_dtype(name, tensor.dtype)) for name, tensor in tensors.items()}

    def describe(self) -> str:
        name = {v: k for k, v in DTYPES.items()}[self.dtype]
        if self.dtype == torch.float32 or not self.keep_fp32:
            return f"every floating tensor in {name}"
        return f"{name}, except tensors matching {', '.join(self.keep_fp32)} kept in fp32"
