"""The GGML tensor types cogexport writes: their block sizes and byte sizes, taken from the ``gguf`` package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gguf


@dataclass(frozen=True)
class GgmlType:
    """One GGML tensor type: ``block`` values stored in ``block_bytes`` bytes (a float type is a block of one)."""

    name: str
    code: gguf.GGMLQuantizationType
    block: int
    block_bytes: int

    @property
    def is_float(self) -> bool:
        return self.block == 1

    def fits(self, row_length: int) -> bool:
        """Whether a row of this many values can be stored (rows are cut into whole blocks)."""
        return row_length % self.block == 0

    def row_bytes(self, row_length: int) -> int:
        return row_length // self.block * self.block_bytes

    def nbytes(self, shape: tuple[int, ...]) -> int:
        rows = 1
        for dim in shape[:-1]:
            rows *= dim
        return rows * self.row_bytes(shape[-1] if shape else 1)


# Every type cogexport quantizes to (the K types: llama.cpp's reference algorithm, no importance matrix).
WRITABLE = ("F32", "F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K", "Q4_K")


def ggml_type(name: str) -> GgmlType:
    """The type called ``name`` (``Q4_K``, ``F16``, ...), any GGML type the gguf package knows."""
    import gguf  # 20 ms of a start: imported when a type is first asked for, by GGUF jobs only

    code = gguf.GGMLQuantizationType[name]
    block, block_bytes = gguf.GGML_QUANT_SIZES[code]
    return GgmlType(name, code, block, block_bytes)


def ggml_type_of(code: int) -> GgmlType:
    import gguf

    return ggml_type(gguf.GGMLQuantizationType(code).name)
