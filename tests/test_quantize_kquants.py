"""The K types (Q6_K, Q5_K, Q4_K) against llama.cpp's own reference quantizers (quantize_row_q*_K_ref, compiled
from the llama.cpp that llama-cpp-python vendors by scripts/build_ggml_reference.sh; skipped without that build),
byte for byte, through both of cogexport's quantizers (the compiled one and the torch search); and their error, read
back with the gguf package's dequantizers, within llama.cpp's published bound."""

from __future__ import annotations

import ctypes
import math
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from quantize_cases import K_PATHS, edge_cases, random_weights, use_k_path

from cogexport.quantize import ggml_type, quantize_tensor

K_TYPES = ["Q6_K", "Q5_K", "Q4_K"]
REFERENCE = Path(os.environ.get("COGEXPORT_GGML_REFERENCE",
                                Path(__file__).parent / ".fixtures" / "ggml-reference" / "libggml_quants_ref.so"))


@pytest.fixture(params=K_PATHS)
def k_path(request, monkeypatch):
    use_k_path(monkeypatch, request.param)
    return request.param


@pytest.fixture(scope="module")
def llama_cpp():
    if not REFERENCE.is_file():
        pytest.skip(f"llama.cpp's reference quantizers are not built ({REFERENCE}): run scripts/build_ggml_reference.sh")
    return ctypes.CDLL(str(REFERENCE))


def reference_bytes(library, tensor: torch.Tensor, type_name: str) -> np.ndarray:
    values = np.ascontiguousarray(tensor.numpy(), dtype=np.float32)
    kind = ggml_type(type_name)
    out = np.zeros(values.size // kind.block * kind.block_bytes, dtype=np.uint8)
    function = getattr(library, f"quantize_row_{type_name[:2].lower()}_K_ref")
    function(values.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(values.size))
    return out.reshape(tensor.shape[0], -1)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_edge_cases_match_llama_cpp(llama_cpp, type_name, k_path):
    for case, tensor in edge_cases(512).items():
        ours = quantize_tensor(tensor, type_name, case).numpy()
        assert np.array_equal(ours, reference_bytes(llama_cpp, tensor, type_name)), f"{type_name}: {case}"


@pytest.mark.parametrize("type_name", K_TYPES)
def test_random_weights_match_llama_cpp(llama_cpp, type_name, k_path):
    shapes = [(4, 256, 1.0), (24, 1536, 0.02), (8, 5120, 0.01), (3, 8960 - 8960 % 256, 0.3), (64, 256, 1e-3),
              (2, 13824, 0.05), (16, 3072, 40.0)]
    for seed, (count, row, scale) in enumerate(shapes * 2):
        tensor = random_weights(seed, count, row, scale)
        if seed >= len(shapes):  # heavier tails, as trained weights have
            tensor = tensor * torch.exp(random_weights(seed + 100, count, row, 1.0))
        ours = quantize_tensor(tensor, type_name).numpy()
        assert np.array_equal(ours, reference_bytes(llama_cpp, tensor, type_name)), (type_name, seed)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_opposite_sign_ties_match_llama_cpp(llama_cpp, type_name, k_path):
    """Groups whose largest magnitude occurs twice with opposite signs, the negative one first or second: the
    reference keeps the first (Q6_K's scale takes its sign), and so must the vectorised search for it."""
    tensor = random_weights(7, 8, 1024, 0.01)
    groups = tensor.view(8, -1, 16)
    groups[:, 0::2, 3], groups[:, 0::2, 9] = -0.05, 0.05
    groups[:, 1::2, 2], groups[:, 1::2, 12] = 0.05, -0.05
    ours = quantize_tensor(tensor, type_name).numpy()
    assert np.array_equal(ours, reference_bytes(llama_cpp, tensor, type_name))


def cosine_data(size: int) -> np.ndarray:
    """llama.cpp's tests/test-quantize-fns.cpp data: 0.1 + 2 cos(i), in float32."""
    return (0.1 + 2.0 * np.cos(np.arange(size, dtype=np.float32))).astype(np.float32)


@pytest.mark.parametrize("type_name", K_TYPES)
def test_error_within_llama_cpps_published_bound(type_name):
    """test-quantize-fns.cpp requires sqrt(sum of squared errors) / n < 0.002 for these types on its data
    (MAX_QUANTIZATION_TOTAL_ERROR, 4096 values); read back with the gguf package's dequantizer."""
    data = cosine_data(32 * 128)
    stored = quantize_tensor(torch.from_numpy(data)[None], type_name).numpy()
    restored = gguf.quants.dequantize(stored, gguf.GGMLQuantizationType[type_name]).reshape(-1)
    total_error = math.sqrt(float(np.sum((data.astype(np.float64) - restored) ** 2))) / data.size
    assert total_error < 0.002, total_error


# RMS error relative to the RMS of Gaussian weights (64 x 4096, std 0.02), as measured: Q6_K 0.0178, Q5_K 0.0361,
# Q4_K 0.0714 (Q8_0 0.0054, Q5_1 0.0378, Q5_0 0.0427, Q4_1 0.0782, Q4_0 0.0859). Each K type must stay under its
# ceiling and beat the legacy types of its width, as llama.cpp's k-quants do.
RELATIVE_RMS_CEILING = {"Q6_K": ("Q8_0", 0.02, "Q5_1"), "Q5_K": ("Q5_1", 0.04, "Q4_1"), "Q4_K": ("Q4_1", 0.075, None)}


def relative_rms(weights: torch.Tensor, type_name: str) -> float:
    stored = quantize_tensor(weights, type_name).numpy()
    restored = torch.from_numpy(gguf.quants.dequantize(stored, gguf.GGMLQuantizationType[type_name]))
    return ((restored - weights).pow(2).mean().sqrt() / weights.pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("type_name", K_TYPES)
def test_relative_error_on_gaussian_weights(type_name):
    weights = random_weights(11, 64, 4096, 0.02)
    same_width, ceiling, narrower = RELATIVE_RMS_CEILING[type_name]
    error = relative_rms(weights, type_name)
    assert error < ceiling, error
    if type_name != "Q6_K":  # Q6_K is narrower than Q8_0, so it only has to beat the 5-bit types
        assert error < relative_rms(weights, same_width)
    if narrower is not None:
        assert error < relative_rms(weights, narrower)


def test_compiled_float16_rounding_is_torchs(monkeypatch):
    """The compiled quantizer's own float32 -> float16 conversion (d, dmin) against torch's, round to nearest even,
    on every tie between float16 neighbours, subnormal and normal, the edges of its range and random values."""
    use_k_path(monkeypatch, "compiled")
    from cogexport.quantize import kernel

    halves = torch.arange(0, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    ties = (halves[:-1].double() + halves[1:].double()) / 2  # exactly halfway: representable in float32
    edges = torch.tensor([65504.0, 65519.99, 65520.0, 1e9, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -26, 0.0],
                         dtype=torch.float64)
    values = torch.cat([halves.double(), ties, edges, torch.randn(100_000, dtype=torch.float64) * 10.0 ** torch.randint(
        -9, 5, (100_000,))]).float()
    values = torch.cat([values, -values])
    ours = torch.empty(values.shape, dtype=torch.int16)
    kernel._library().cogexport_half_bits(ctypes.c_void_p(values.data_ptr()), ctypes.c_void_p(ours.data_ptr()),
                                          ctypes.c_int64(values.numel()))
    assert torch.equal(ours, values.to(torch.float16).view(torch.int16))


def test_a_library_without_the_quantizers_is_taken_for_none(monkeypatch):
    """An editable checkout whose library was built from an older kquant_kernel.c (a function missing) quantizes
    with the torch code instead of failing every GGUF export: stood in for by a real shared library holding none."""
    import ctypes.util

    from cogexport.quantize import kernel

    soname = ctypes.util.find_library("m") or "libm.so.6"
    folders = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
    libm = next((Path(folder, soname) for folder in folders if Path(folder, soname).is_file()), None)
    if libm is None:
        pytest.skip("no libm file to stand in for an old build")
    monkeypatch.setattr(kernel, "LIBRARY", libm)
    kernel._library.cache_clear()
    try:
        assert kernel.LIBRARY.is_file() and not kernel.available()
        tensor = torch.randn(2, 256)
        assert quantize_tensor(tensor, "Q4_K").shape == (2, 144)
    finally:
        kernel._library.cache_clear()
