"""Quantizing in threads with the compiled quantizer (cogexport/quantize/threads.py): a tensor's rows in pieces,
each quantized by a thread of the pool, give the bytes one thread gives, for the K types, Q8_0 and the stored dtypes; what
a piece cannot quantize is redone whole and raises the one-thread error; small tensors and the other types stay in
the calling thread; a job picks threads when the compiled quantizer is built and worker processes when not."""

from __future__ import annotations

import pytest
import torch
from quantize_cases import random_weights, use_k_path

from cogexport.finite_values import NonfiniteValuesError
from cogexport.quantize import quantize_tensor
from cogexport.quantize.processes import QuantizingProcesses
from cogexport.quantize.threads import QuantizingThreads, quantizing_pool


@pytest.fixture
def compiled(monkeypatch):
    use_k_path(monkeypatch, "compiled")


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
def test_pieces_quantized_in_threads_are_the_one_thread_bytes(compiled, type_name):
    tensor = random_weights(7, 37, 1024, 0.02)  # 37 rows: pieces of unequal size
    with QuantizingThreads(3, min_piece_values=1 << 10) as threads:
        for stored in (tensor, tensor.to(torch.bfloat16)):
            expected = quantize_tensor(stored, type_name)
            assert torch.equal(threads.quantize(lambda: stored, type_name, "w"), expected)
        assert threads._pool is not None  # the pieces went to the threads


def test_a_value_a_piece_cannot_quantize_raises_the_one_thread_error(compiled):
    tensor = random_weights(8, 16, 1024, 0.02)
    tensor[11, 3], tensor[2, 0] = float("nan"), float("inf")
    with QuantizingThreads(2, min_piece_values=1 << 10) as threads, pytest.raises(NonfiniteValuesError) as refused:
        threads.quantize(lambda: tensor, "Q4_K", "blocks.0.ffn.0.weight")
    assert "'blocks.0.ffn.0.weight'" in str(refused.value) and "1 NaN" in str(refused.value)
    with QuantizingThreads(2, min_piece_values=1 << 10) as threads, pytest.raises(Exception, match="beyond 65504"):
        threads.quantize(lambda: tensor.nan_to_num(0.0, 0.0) * 1e6, "Q6_K", "big")


def test_small_tensors_other_types_and_one_thread_stay_in_the_calling_thread(compiled):
    tensor = random_weights(9, 4, 1024, 0.02)
    for threads, type_name in ((QuantizingThreads(2), "Q4_K"), (QuantizingThreads(1, min_piece_values=1), "Q4_K"),
                               (QuantizingThreads(2, min_piece_values=1), "Q5_0")):
        with threads:
            assert torch.equal(threads.quantize(lambda: tensor, type_name, "w"), quantize_tensor(tensor, type_name))
            assert threads._pool is None


@pytest.mark.parametrize("path, kind", [("compiled", QuantizingThreads), ("torch", QuantizingProcesses)])
def test_a_job_quantizes_in_threads_with_the_compiled_quantizer_else_in_processes(monkeypatch, path, kind):
    use_k_path(monkeypatch, path)
    with quantizing_pool(2) as pool:
        assert isinstance(pool, kind) and pool.count == 2
