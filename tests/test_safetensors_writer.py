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


@pytest.mark.parametrize("ranks", [2, 3, 5])
@pytest.mark.parametrize("case", [*CASES, "one big tensor"])
def test_a_file_written_in_runs_by_several_ranks_equals_save_file(tmp_path, case, ranks):
    """Each rank's share of a single file (a run of its tensors, rank 0's with the header), written in any order into
    the same file, as ranks of a torchrun job write them at once: save_file's bytes. Runs may be empty (more ranks
    than tensors, one tensor holding most bytes)."""
    from cogexport.write.folder_plan import TensorFile
    from cogexport.write.rank_shares import FilePart, rank_share

    tensors = CASES.get(case) or {"small": torch.ones(3), "big": torch.randn(4096), "tiny": torch.ones(1)}
    save_file(tensors, tmp_path / "reference.safetensors", metadata={"format": "pt"})
    planned = TensorFile("model.safetensors", lazy(tensors), metadata={"format": "pt"})
    shares = [rank_share([planned], rank, ranks) for rank in range(ranks)]
    assert all(isinstance(part, FilePart) for share in shares for part in share)
    for share in reversed(shares):  # the last rank first: the file is begun by a rank without the header
        for part in share:
            part.write(tmp_path, None, iter([tensor.load() for tensor in part.write_order()]))
    assert (tmp_path / "model.safetensors").read_bytes() == (tmp_path / "reference.safetensors").read_bytes()
    written = sorted(index for share in shares for part in share for index in part.run)
    assert written == list(range(len(tensors)))
