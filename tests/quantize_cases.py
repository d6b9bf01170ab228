"""Tensors that exercise quantizers: random weights of several scales and shapes, and the edge cases (zeros,
constants, one outlier, values on rounding ties, tiny and subnormal magnitudes, the largest float16-safe ones)."""

from __future__ import annotations

import torch


def edge_cases(row: int) -> dict[str, torch.Tensor]:
    """name -> a (rows, ``row``) float32 tensor; ``row`` is a multiple of 256."""
    generator = torch.Generator().manual_seed(1234)
    noise = torch.randn(8, row, generator=generator)
    ties = torch.arange(8 * row, dtype=torch.float32).reshape(8, row) % 33 - 16  # integers: exact half steps
    outlier = noise * 0.01
    outlier[:, 7] = 40.0
    mixed = noise * torch.logspace(-6, 2, 8)[:, None]
    sparse = torch.where(noise.abs() > 1.5, noise, torch.zeros_like(noise))
    return {
        "zeros": torch.zeros(4, row),
        "negative zeros": -torch.zeros(4, row),
        "constant": torch.full((4, row), 0.375),
        "negative constant": torch.full((4, row), -2.5),
        "positive only": noise.abs() + 0.5,
        "negative only": -noise.abs() - 0.5,
        "one outlier": outlier,
        "integer ties": ties,
        "half-step ties": ties / 2,
        "mixed magnitudes": mixed,
        "sparse": sparse,
        "tiny": noise * 1e-30,
        "subnormal": noise * 1e-39,
        "large": noise / noise.abs().max() * 65000.0,
        "bf16 weights": (noise * 0.02).to(torch.bfloat16).float(),
        "fp16 weights": (noise * 0.05).to(torch.float16).float(),
    }


def random_weights(seed: int, rows: int, row: int, scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, row, generator=generator) * scale


# The K types' two quantizers: the compiled one (cogexport/quantize/kquant_kernel.c, built at install) and the torch
# search it falls back to; each must make the reference's bytes.
K_PATHS = ["compiled", "torch"]


def use_k_path(monkeypatch, path: str) -> None:
    """Make ``quantize_tensor`` use the K types' ``path`` for the rest of the test. A missing compiled quantizer
    skips its cases, unless COGEXPORT_REQUIRE_KERNEL=1 (scripts/test.sh, whose install builds it) makes that a
    failure: CI must not pass by testing only the fallback."""
    import os

    import pytest

    from cogexport.quantize import kernel

    if path == "torch":
        monkeypatch.setattr(kernel, "_library", lambda: None)
    elif not kernel.available():
        message = f"the compiled K quantizer is not built ({kernel.LIBRARY}): pip install -e . builds it"
        if os.environ.get("COGEXPORT_REQUIRE_KERNEL") == "1":
            pytest.fail(message)
        pytest.skip(message)
