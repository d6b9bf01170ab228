"""Consolidating real DeepSpeed checkpoints equals the fp32 masters taken inside the training process.

Every stage (0-3) x fp32/bf16/fp16 x world size 1, 2, 3, plus ZeRO-3 sub-groups, alignment gaps and the
BF16_Optimizer, on a model with odd sizes, a frozen layer, a tied weight and a float and an int buffer.
"""

from __future__ import annotations

import json

import pytest
import torch
from fixtures import ALL_VARIANTS, DeepSpeedVariant, deepspeed_checkpoint
from huggingface_hub import save_torch_state_dict
from safetensors import safe_open
from safetensors.torch import load_file

from cogexport import consolidate, open_checkpoint
from cogexport.write import byte_copy


def _read_folder(folder) -> dict[str, torch.Tensor]:
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(load_file(folder / name))
    return tensors


@pytest.mark.parametrize("variant", ALL_VARIANTS, ids=lambda v: v.id)
def test_fp32_consolidation_equals_training_masters_bit_for_bit(variant: DeepSpeedVariant, tmp_path):
    fixture = deepspeed_checkpoint(variant)
    truth = fixture.truth
    result = consolidate(fixture.checkpoint, tmp_path / "out", dtype="fp32")
    written = _read_folder(tmp_path / "out")

    assert set(written) == set(truth["order"]), "every state_dict name, nothing else"
    assert result.tensors == len(truth["order"])
    for name in truth["trainable"]:
        assert written[name].dtype == torch.float32
        assert torch.equal(written[name], fixture.tensors[name]), name
    for name in truth["frozen"]:
        stored = fixture.tensors[name]
        assert written[name].dtype == torch.float32
        assert torch.equal(written[name], stored.float()), f"frozen {name} must be its stored bits upcast"
    for alias, source in truth["tied"].items():
        assert torch.equal(written[alias], fixture.tensors[source])
    for name in truth["buffers"]:
        assert written[name].dtype == fixture.tensors[name].dtype, f"buffer {name} keeps its dtype"
        assert torch.equal(written[name], fixture.tensors[name])


@pytest.mark.parametrize("variant", [DeepSpeedVariant(2, "bf16", 2), DeepSpeedVariant(3, "fp16", 3)], ids=lambda v: v.id)
def test_low_precision_output_is_the_same_cast_of_the_masters(variant, tmp_path):
    fixture = deepspeed_checkpoint(variant)
    consolidate(fixture.checkpoint, tmp_path / "out", dtype="bf16")
    written = load_file(tmp_path / "out" / "model.safetensors")
    for name, expected in fixture.expected_state_dict().items():
        if name in fixture.truth["buffers"]:
            assert torch.equal(written[name], expected) and written[name].dtype == expected.dtype
        else:
            assert written[name].dtype == torch.bfloat16
            assert torch.equal(written[name], expected.to(torch.bfloat16)), name


def test_sharded_output_matches_huggingface_hub_byte_for_byte(tmp_path):
    fixture = deepspeed_checkpoint(DeepSpeedVariant(3, "bf16", 2, sub_group_size=300))
    consolidate(fixture.checkpoint, tmp_path / "ours", max_shard_size="1kB")
    reference = {name: tensor.float().clone() if tensor.is_floating_point() and name not in fixture.truth["buffers"]
                 else tensor.clone() for name, tensor in fixture.expected_state_dict().items()}
    (tmp_path / "hub").mkdir()
    save_torch_state_dict(reference, tmp_path / "hub", filename_pattern="model{suffix}.safetensors",
                          max_shard_size="1kB")
    ours = sorted(p.name for p in (tmp_path / "ours").iterdir())
    assert ours == sorted(p.name for p in (tmp_path / "hub").iterdir())
    assert len(ours) > 3, "the small shard size must actually shard"
    for name in ours:
        if name.endswith(".json"):
            assert json.loads((tmp_path / "ours" / name).read_text()) == json.loads((tmp_path / "hub" / name).read_text())
        else:
            assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "hub" / name).read_bytes(), name
    with safe_open(tmp_path / "ours" / ours[0], "pt") as handle:
        assert handle.metadata() == {"format": "pt"}


@pytest.mark.parametrize("variant", [DeepSpeedVariant(2, "bf16", 3), DeepSpeedVariant(3, "bf16", 3),
                                     DeepSpeedVariant(1, "fp16", 2)], ids=lambda v: v.id)
def test_only_fp32_masters_are_read_never_the_optimizer_moments(variant):
    fixture = deepspeed_checkpoint(variant)
    with open_checkpoint(fixture.checkpoint) as checkpoint:
        # Opening reads the optimizer's step counters (0-d, to catch ranks of different saves), nothing else.
        steps = 8 * variant.world_size * len(checkpoint.groups)
        assert sum(checkpoint.bytes_read().values()) <= steps, "opening reads no parameter data"
        shapes = {name: (tuple(t.shape), t.dtype) for name, t in checkpoint.items()}
        for name in checkpoint:
            if name not in fixture.truth["tied"]:  # an alias would read its source a second time
                checkpoint[name].load()
        read = checkpoint.bytes_read()
    truth = fixture.truth
    assert shapes == {n: (tuple(t.shape), t.dtype if n not in truth["trainable"] else torch.float32)
                      for n, t in fixture.expected_state_dict().items()}
    optimizer_bytes = sum(n for path, n in read.items() if path.endswith("optim_states.pt"))
    trainable_elements = sum(fixture.tensors[n].numel() for n in truth["trainable"])
    # Each trainable element is read once (ZeRO-3 also reads its rank padding), moments never.
    assert trainable_elements * 4 <= optimizer_bytes <= (trainable_elements + 9 * variant.world_size) * 4


@pytest.mark.parametrize("variant", [DeepSpeedVariant(2, "bf16", 3), DeepSpeedVariant(3, "bf16", 3),
                                     DeepSpeedVariant(3, "bf16", 2, sub_group_size=300)], ids=lambda v: v.id)
def test_fp32_masters_are_copied_file_to_file_piece_by_piece(variant, tmp_path):
    """A master split across ranks (every ZeRO-3 parameter, a ZeRO-1/2 one that straddles two partitions) is its
    pieces end to end: each is copied from its rank's file in the kernel, none loaded, and the output is still
    the masters taken inside the training process."""
    fixture = deepspeed_checkpoint(variant)
    truth = fixture.truth
    byte_copy.COUNTS.reset()
    consolidate(fixture.checkpoint, tmp_path / "out", dtype="fp32", workers=1)
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(written[name], fixture.tensors[name]) for name in truth["trainable"])
    masters = [truth["tied"].get(name, name) for name in truth["order"] if truth["tied"].get(name, name)
               in truth["trainable"]]  # an alias is its source's master, copied again
    buffers = [name for name in truth["buffers"] if fixture.tensors[name].numel()]
    copied = sum(byte_copy.COUNTS.bytes.values())
    assert copied == sum(fixture.tensors[name].numel() * 4 for name in masters) + \
        sum(fixture.tensors[name].nbytes for name in buffers)
    assert sum(byte_copy.COUNTS.ranges.values()) > len(masters) + len(buffers), "some masters come in pieces"
