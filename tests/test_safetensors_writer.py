"""The streaming writer produces exactly the bytes ``safetensors.torch.save_file`` produces."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cogexport.lazy import LazyTensor
from cogexport.write.safetensors_file import write_safetensors


def lazy(tensors: dict[str, torch.Tensor]) -> dict[str, LazyTensor]:
    return {name: LazyTensor(t.shape, t.dtype, lambda t=t: t) for name, t in tensors.items()}


CASES = {
    "mixed dtypes": {
        "z.weight": torch.randn(3, 5), "a.bias": torch.randn(7).to(torch.bfloat16), "m": torch.arange(4),
        "b": torch.tensor([True, False]), "h": torch.randn(2, 2).half(), "u": torch.arange(3, dtype=torch.uint8),
        "i32": torch.arange(5, dtype=torch.int32), "d": torch.randn(3, dtype=torch.float64),
        "i8": torch.arange(3, dtype=torch.int8), "i16": torch.arange(3, dtype=torch.int16),
    },
    "scalars and empties": {"s": torch.tensor(2.5), "e": torch.zeros(0, 4), "one": torch.ones(1)},
    "names that sort differently as bytes": {"b": torch.ones(2), "B": torch.ones(2), "ä": torch.ones(3), "a_1": torch.ones(1)},
    "header padding": {"x" * n: torch.ones(n) for n in range(1, 9)},
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_bytes_equal_save_file(tmp_path, case, metadata):
    tensors = CASES[case]
    save_file(tensors, tmp_path / "reference.safetensors", metadata=metadata)
    write_safetensors(tmp_path / "ours.safetensors", lazy(tensors), metadata)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_several_metadata_entries_round_trip(tmp_path):
    # safetensors writes several metadata entries in a random order (a hash map), so only their content is defined.
    metadata = {"format": "pt", "note": "ünïcode", "lora_adapter_metadata": '{"r": 4}'}
    tensors = CASES["mixed dtypes"]
    write_safetensors(tmp_path / "ours.safetensors", lazy(tensors), metadata)
    with safe_open(tmp_path / "ours.safetensors", "pt") as handle:
        assert handle.metadata() == metadata
        assert all(torch.equal(handle.get_tensor(n), t) for n, t in tensors.items())


def test_each_tensor_is_loaded_once_and_released(tmp_path):
    loads = []

    def loader(name: str) -> torch.Tensor:
        loads.append(name)
        return torch.full((4,), float(len(loads)))

    tensors = {n: LazyTensor(torch.Size([4]), torch.float32, lambda n=n: loader(n)) for n in ("b", "a", "c")}
    write_safetensors(tmp_path / "out.safetensors", tensors, {"format": "pt"})
    assert loads == ["a", "b", "c"], "streamed in file order, once each"
