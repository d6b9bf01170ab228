"""The tiled order block-scaled formats store their block scales in (cuBLAS's "block scaling factors layout", which
ComfyUI's NVFP4 and MXFP8 weights use so the scales feed the matrix multiply as they are).

A matrix of scales, one per block of a weight row, is padded with zeros to a multiple of 128 rows and 4 columns and
cut into tiles of 128 x 4. Tiles follow one another row of tiles by row of tiles; within a tile, row ``32 * i + j``
and column ``c`` of the tile is stored at position ``16 * j + 4 * i + c`` (the four 32-row bands interleaved). The
stored array has the padded shape.
"""

from __future__ import annotations

import torch

TILE_ROWS, TILE_COLUMNS = 128, 4
BANDS = 4  # 32-row bands per tile


def padded(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


def tiled_shape(rows: int, columns: int) -> tuple[int, int]:
    """The stored shape of a rows x columns matrix of scales."""
    return padded(rows, TILE_ROWS), padded(columns, TILE_COLUMNS)


def to_tiles(scales: torch.Tensor) -> torch.Tensor:
    """``scales`` (rows x columns of one-byte values: fp8 or E8M0 codes) in the tiled order, zero-padded to
    ``tiled_shape``."""
    rows, columns = scales.shape
    height, width = tiled_shape(rows, columns)
    full = torch.zeros(height, width, dtype=torch.uint8)
    full[:rows, :columns] = scales.view(torch.uint8)
    # (tile row, band, row in band, tile column, column in tile) -> (tile row, tile column, row in band, band, column)
    tiles = full.reshape(height // TILE_ROWS, BANDS, TILE_ROWS // BANDS, width // TILE_COLUMNS, TILE_COLUMNS)
    return tiles.permute(0, 3, 2, 1, 4).reshape(height, width).view(scales.dtype)


def from_tiles(stored: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """The rows x columns matrix of one-byte scales ``to_tiles`` stored."""
    height, width = tiled_shape(rows, columns)
    tiles = stored.view(torch.uint8).reshape(height // TILE_ROWS, width // TILE_COLUMNS, TILE_ROWS // BANDS, BANDS,
                                             TILE_COLUMNS)
    return tiles.permute(0, 3, 2, 1, 4).reshape(height, width)[:rows, :columns].contiguous().view(stored.dtype)
