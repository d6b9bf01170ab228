"""The float and 32-value block types against the gguf package's own quantizers (llama.cpp's gguf-py, which matches
ggml's reference): the same bytes for random weights and every edge case; bad values refused with one line."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from quantize_cases import K_PATHS, edge_cases, random_weights, use_k_path

from cogexport.errors import CogExportError
from cogexport.quantize import quantize_tensor, rows

REFERENCE_TYPES = ["BF16", "F16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0"]


def reference_bytes(tensor: torch.Tensor, type_name: str) -> np.ndarray:
    stored = gguf.quants.quantize(tensor.numpy(), gguf.GGMLQuantizationType[type_name])
    return stored.view(np.uint8).reshape(tensor.shape[0], -1)


@pytest.mark.parametrize("type_name", REFERENCE_TYPES)
def test_edge_cases_match_the_reference(type_name):
    for case, tensor in edge_cases(256).items():
        ours = quantize_tensor(tensor, type_name, case).numpy()
        assert np.array_equal(ours, reference_bytes(tensor, type_name)), f"{type_name}: {case}"


@pytest.mark.parametrize("type_name", REFERENCE_TYPES)
def test_random_weights_match_the_reference(type_name):
    for seed, (count, row, scale) in enumerate([(3, 32, 1.0), (17, 96, 0.02), (64, 1536, 0.05), (5, 8960, 3.0),
                                                (200, 64, 1e-4), (1, 4096, 250.0)]):
        tensor = random_weights(seed, count, row, scale)
        assert np.array_equal(quantize_tensor(tensor, type_name).numpy(), reference_bytes(tensor, type_name)), seed


@pytest.fixture(params=K_PATHS)
def q8_path(request, monkeypatch):
    """Q8_0 has two quantizers too: the compiled one (kquant_kernel.c) and the torch code (legacy.py)."""
    use_k_path(monkeypatch, request.param)
    return request.param


def test_q8_0_through_either_quantizer_matches_the_reference(q8_path):
    cases = {**edge_cases(256), **{seed: random_weights(seed, count, row, scale) for seed, (count, row, scale)
                                   in enumerate([(17, 96, 0.02), (64, 1536, 0.05), (1, 4096, 250.0)])}}
    for case, tensor in cases.items():
        assert np.array_equal(quantize_tensor(tensor, "Q8_0").numpy(), reference_bytes(tensor, "Q8_0")), case


def test_q8_0_rounds_half_away_from_zero_at_the_edges_of_its_rounding(q8_path):
    """A block whose largest magnitude is 127 is stored with scale 1, so each value is rounded as it is: the
    float32 just below one half (which an added 0.5 would round up to 1), exact halves of every magnitude, and
    the floats just beside them, each sign."""
    below_half = 0.5 - 2.0 ** -25
    values = [127.0, below_half, 0.5, 1.5, 2.5, 63.5, 126.5, 1.0 - 2.0 ** -24, 2.5 - 2.0 ** -22, 2.5 + 2.0 ** -22,
              126.5 - 2.0 ** -17, 3.0 * 2.0 ** -25, 0.0, 1e-40, 64.5, 100.49999]
    block = torch.tensor(values + [-v for v in values], dtype=torch.float32)[None]
    assert np.array_equal(quantize_tensor(block, "Q8_0").numpy(), reference_bytes(block, "Q8_0"))


def test_bfloat16_and_float16_inputs_are_quantized_from_their_exact_values():
    weights = random_weights(7, 16, 128, 0.02).to(torch.bfloat16)
    ours = quantize_tensor(weights, "Q8_0").numpy()
    assert np.array_equal(ours, reference_bytes(weights.float(), "Q8_0"))


def test_chunks_do_not_change_the_bytes(monkeypatch):
    tensor = random_weights(3, 64, 256, 0.1)
    whole = quantize_tensor(tensor, "Q5_0")
    monkeypatch.setattr(rows, "CHUNK_VALUES", 700)  # less than 3 rows per chunk, uneven
    assert torch.equal(quantize_tensor(tensor, "Q5_0"), whole)


def test_tensors_of_other_ranks_are_stored_by_their_last_dimension():
    conv = random_weights(4, 6, 64, 0.1).reshape(6, 2, 4, 8)
    flat = conv.reshape(-1, 8)
    assert torch.equal(quantize_tensor(conv, "F16"), quantize_tensor(flat, "F16"))
    vector = torch.randn(64)
    assert quantize_tensor(vector, "Q8_0").shape == (1, 68)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("type_name", ["Q8_0", "BF16", "F32"])  # F32 and BF16 hold any finite magnitude
def test_non_finite_values_are_refused_naming_the_tensor(bad, type_name):
    tensor = torch.zeros(4, 64)
    tensor[2, 5] = bad
    with pytest.raises(CogExportError, match="'blocks.0.ffn.0.weight' holds NaN or infinite values"):
        quantize_tensor(tensor, type_name, "blocks.0.ffn.0.weight")


def test_values_beyond_float16_are_refused_where_float16_holds_them():
    tensor = torch.full((2, 32), 70000.0)
    for type_name in ("F16", "Q8_0", "Q4_K"):
        with pytest.raises(CogExportError, match="beyond 65504"):
            quantize_tensor(tensor if type_name != "Q4_K" else torch.full((1, 256), 70000.0), type_name, "w")
    assert quantize_tensor(tensor, "BF16").shape == (2, 64)


def test_rows_that_do_not_fill_blocks_are_refused():
    with pytest.raises(CogExportError, match="rows of 48 values cannot be stored as Q4_0"):
        quantize_tensor(torch.zeros(2, 48), "Q4_0", "w")
