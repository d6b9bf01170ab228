"""Quantizing in worker processes (cogexport/quantize/processes.py): a tensor's rows in pieces, each quantized by a
worker process, give the bytes one process gives, for every block type and the stored dtypes; what a worker cannot
quantize is redone here and raises the in-process error (naming the tensor, counting its values whole); small
tensors never start a worker."""

from __future__ import annotations

import pytest
import torch
from quantize_cases import random_weights

from cogexport.finite_values import NonfiniteValuesError
from cogexport.quantize import quantize_tensor
from cogexport.quantize.processes import QuantizingProcesses


@pytest.fixture(scope="module")
def pool():
    with QuantizingProcesses(2, min_piece_values=1 << 12) as processes:
        yield processes


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K"])
def test_pieces_quantized_in_processes_are_the_one_process_bytes(pool, type_name):
    tensor = random_weights(7, 37, 1024, 0.02)  # 37 rows: pieces of unequal size
    for stored in (tensor, tensor.to(torch.bfloat16)):
        expected = quantize_tensor(stored, type_name)
        assert torch.equal(pool.quantize(lambda: stored, type_name, "w"), expected)
    assert pool._pool is not None  # the pieces went to the workers


def test_types_cheaper_than_the_copies_to_a_worker_are_quantized_here():
    tensor = random_weights(10, 37, 1024, 0.02)
    with QuantizingProcesses(2, min_piece_values=1 << 12) as processes:
        for type_name in ("Q8_0", "Q4_0", "Q5_1", "BF16", "F16"):
            assert torch.equal(processes.quantize(lambda: tensor, type_name, "w"), quantize_tensor(tensor, type_name))
        assert processes._pool is None


def test_a_value_a_worker_cannot_quantize_raises_the_in_process_error(pool):
    tensor = random_weights(8, 16, 1024, 0.02)
    tensor[11, 3], tensor[2, 0] = float("nan"), float("inf")
    with pytest.raises(NonfiniteValuesError) as refused:
        pool.quantize(lambda: tensor, "Q4_K", "blocks.0.ffn.0.weight")
    assert "'blocks.0.ffn.0.weight'" in str(refused.value) and "1 NaN" in str(refused.value)
    with pytest.raises(Exception, match="beyond 65504"):
        pool.quantize(lambda: tensor.nan_to_num(0.0, 0.0) * 1e6, "Q8_0", "big")


def test_small_tensors_and_one_process_never_start_a_worker():
    tensor = random_weights(9, 4, 1024, 0.02)
    for processes in (QuantizingProcesses(2), QuantizingProcesses(1, min_piece_values=1)):
        with processes:
            assert torch.equal(processes.quantize(lambda: tensor, "Q4_K", "w"), quantize_tensor(tensor, "Q4_K"))
            assert processes._pool is None
