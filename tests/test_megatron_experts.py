"""A Megatron-Core mixture-of-experts save (issue 42): each layer's experts, stacked by megatron-core on an axis of
their own ([L, E, ...]) and sharded by expert parallelism, come out one tensor per layer and expert under the names
megatron-core gives experts saved one by one (``...mlp.experts.experts.<expert>.linear_fc1.weight``), equal to the
truth gathered inside the ranks (tests/megatron_fixtures.py: megatron-core's own GPTModel with 4 experts per layer
at expert-parallel 2, saved by its dist_checkpointing.save)."""

from __future__ import annotations

import torch
from conftest import assert_same_tensors
from safetensors.torch import load_file


def per_expert(truth: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The truth by per-layer, per-expert names (written out here, independently of the reader's code)."""
    named = {}
    for key, full in truth.items():
        if ".layers." not in key:
            named[key] = full
            continue
        before, after = key.split(".layers.", 1)
        for layer in range(full.shape[0]):
            if "experts.experts." not in after:
                named[f"{before}.layers.{layer}.{after}"] = full[layer]
                continue
            module, tensor = after.split("experts.experts.", 1)
            for expert in range(full.shape[1]):
                named[f"{before}.layers.{layer}.{module}experts.experts.{expert}.{tensor}"] = full[layer, expert]
    return named


def test_experts_stacked_on_their_axis_come_out_one_by_one(cli, tmp_path):
    from megatron_fixtures import megatron_moe_run

    fixture = megatron_moe_run()
    result = cli("consolidate", fixture.run, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert_same_tensors(written, per_expert(fixture.tensors))
    assert "decoder.layers.1.mlp.experts.experts.3.linear_fc2.weight" in written  # rank 1's last expert
