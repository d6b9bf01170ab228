"""Make a Wan checkpoint laid out as Megatron-Bridge / NeMo DFM save their ``WanModel``, with megatron-core's own
``dist_checkpointing.save`` on CPU gloo ranks at TP=2, and the ground truth in Diffusers' names.

    python scripts/make_megatron_bridge_wan.py OUT --tp 2

Megatron-Bridge cannot be installed beside this torch (its WanModel lives in NeMo DFM), so the layout is made here
from its facts (docs: the Megatron-Bridge section of training-stacks.md; its names written by hand from WanBridge's
mapping, independently of cogexport's table): a seeded tiny Diffusers ``WanTransformer3DModel`` (its state dict is
the truth), every block tensor stacked on a leading layer axis under ``module.decoder.layers.<name>``, self-attention's
q, k, v fused into ``linear_qkv`` INTERLEAVED PER HEAD (rows ``[q_h; k_h; v_h]`` for each head h), cross-attention's
k, v into ``linear_kv`` per head (``[k_h; v_h]``). Each rank saves its tensor-parallel piece as Megatron-Core shards
it: column-parallel tensors (qkv, q, kv, fc1; weights and biases) on axis 1 of the stacked tensor, row-parallel
weights (both output projections, fc2) on axis 2, everything else replicated. Beside the model: Adam-shaped optimizer
states (``optimizer.state.exp_avg.module...``), RNG ShardedObjects, each linear's ``_extra_state``; the iteration
folder also gets ``train_state.pt`` and ``run_config.yaml``, the run folder ``latest_train_state.pt`` and the tracker.

OUT/run/iter_0000004/ and OUT/run/latest_checkpointed_iteration.txt; OUT/truth.safetensors (Diffusers names, fp32)
and OUT/truth.json (the Diffusers config), written before the ranks start, which save exactly those tensors. The
same two CUDA calls as make_megatron_checkpoint.py are stood in for.
"""

from __future__ import annotations

import io
import json
import sys
import warnings
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_megatron_checkpoint import stand_in_cuda  # noqa: E402
from tiny_training import gloo_group, launch  # noqa: E402
from wan_tiny_configs import build_tiny_transformer, tiny_transformer_config  # noqa: E402

ITERATION = 4
PREFIX = "module."
# Diffusers name -> the bridge's, outside the blocks (replicated)
TOP = {"scale_shift_table": "head.modulation", "proj_out.weight": "head.head.weight", "proj_out.bias": "head.head.bias",
       **{f"patch_embedding.{p}": f"patch_embedding.{p}" for p in ("weight", "bias")},
       **{f"condition_embedder.time_embedder.linear_{n}.{p}": f"time_embedder.linear_{n}.{p}"
          for n in (1, 2) for p in ("weight", "bias")},
       **{f"condition_embedder.time_proj.{p}": f"time_proj.{p}" for p in ("weight", "bias")},
       **{f"condition_embedder.text_embedder.linear_{n}.{p}": f"text_embedding.{m}.{p}"
          for n, m in ((1, 0), (2, 2)) for p in ("weight", "bias")}}
# a block's Diffusers name -> (the bridge's name in the block, the tensor-parallel axis of one layer's tensor or None)
BLOCK = {"scale_shift_table": ("adaLN.modulation", None),
         "attn1.norm_q.weight": ("full_self_attention.q_layernorm.weight", None),
         "attn1.norm_k.weight": ("full_self_attention.k_layernorm.weight", None),
         "attn2.norm_q.weight": ("cross_attention.q_layernorm.weight", None),
         "attn2.norm_k.weight": ("cross_attention.k_layernorm.weight", None),
         "norm2.weight": ("norm3.weight", None), "norm2.bias": ("norm3.bias", None),
         "attn1.to_out.0.weight": ("full_self_attention.linear_proj.weight", 1),
         "attn1.to_out.0.bias": ("full_self_attention.linear_proj.bias", None),
         "attn2.to_q.weight": ("cross_attention.linear_q.weight", 0),
         "attn2.to_q.bias": ("cross_attention.linear_q.bias", 0),
         "attn2.to_out.0.weight": ("cross_attention.linear_proj.weight", 1),
         "attn2.to_out.0.bias": ("cross_attention.linear_proj.bias", None),
         "ffn.net.0.proj.weight": ("mlp.linear_fc1.weight", 0), "ffn.net.0.proj.bias": ("mlp.linear_fc1.bias", 0),
         "ffn.net.2.weight": ("mlp.linear_fc2.weight", 1), "ffn.net.2.bias": ("mlp.linear_fc2.bias", None)}
FUSED = {"full_self_attention.linear_qkv": ("attn1", ("q", "k", "v")),
         "cross_attention.linear_kv": ("attn2", ("k", "v"))}


def per_head(parts: list[torch.Tensor], heads: int) -> torch.Tensor:
    """q, k, v (or k, v) fused as the bridge fuses them: for each head its rows of each part in turn."""
    pieces = [part.reshape(heads, part.shape[0] // heads, *part.shape[1:]) for part in parts]
    return torch.stack(pieces, dim=1).reshape(-1, *parts[0].shape[1:])


def bridge_layout(weights: dict[str, torch.Tensor], layers: int, heads: int) -> dict[str, tuple[torch.Tensor, object]]:
    """The bridge's key -> (the full tensor, its tensor-parallel axis in the saved tensor or None)."""
    saved = {PREFIX + bridge: (weights[name], None) for name, bridge in TOP.items()}
    stack = lambda of: torch.stack([of(i) for i in range(layers)])  # noqa: E731
    for name, (bridge, axis) in BLOCK.items():
        saved[f"{PREFIX}decoder.layers.{bridge}"] = (stack(lambda i: weights[f"blocks.{i}.{name}"]),
                                                     None if axis is None else axis + 1)
    for fused, (attention, parts) in FUSED.items():
        for p in ("weight", "bias"):
            saved[f"{PREFIX}decoder.layers.{fused}.{p}"] = (stack(lambda i: per_head(
                [weights[f"blocks.{i}.{attention}.to_{part}.{p}"] for part in parts], heads)), 1)
    return saved


def sharded(key: str, full: torch.Tensor, axis, tp: int, rank: int):
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    if axis is None:
        return ShardedTensor.from_rank_offsets(key, full.clone(), replica_id=rank)
    local = full.chunk(tp, dim=axis)[rank].clone()
    return ShardedTensor.from_rank_offsets(key, local, (axis, rank, tp))


def rank_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    warnings.filterwarnings("ignore")
    stand_in_cuda()
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from safetensors.torch import load_file

    config = json.loads((Path(spec["out"]) / "truth.json").read_text())["config"]
    weights = load_file(Path(spec["out"]) / "truth.safetensors")
    with gloo_group(rendezvous, rank, world_size):
        layout = bridge_layout(weights, config["num_layers"], config["num_attention_heads"])
        model = {key: sharded(key, full, axis, world_size, rank) for key, (full, axis) in layout.items()}
        optimizer = {f"optimizer.state.{state}.{key}": sharded(f"optimizer.state.{state}.{key}",
                                                               full * scale, axis, world_size, rank)
                     for key, (full, axis) in layout.items() for state, scale in (("exp_avg", 0.1),
                                                                                   ("exp_avg_sq", 0.01))}
        extra = {f"{key}._extra_state": ShardedObject(f"{PREFIX}decoder.layers.{key}._extra_state", io.BytesIO(),
                                                      (1,), (0,), replica_id=rank)
                 for key in ("full_self_attention.linear_qkv", "cross_attention.linear_kv")}
        rng = ShardedObject("rng_state", [{"torch_rng_state": torch.get_rng_state()}], (1, world_size), (0, rank),
                            replica_id=0)
        run = Path(spec["out"]) / "run"
        folder = run / f"iter_{ITERATION:07d}"
        if rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        torch.distributed.barrier()
        dist_checkpointing.save({"model": model, "optimizer": {"state": optimizer}, "extra": extra, "rng_state": rng,
                                 "checkpoint_version": 3.0, "iteration": ITERATION}, str(folder))
        if rank == 0:
            torch.save({"step": ITERATION, "consumed_train_samples": 8}, folder / "train_state.pt")
            torch.save({"step": ITERATION, "consumed_train_samples": 8}, run / "latest_train_state.pt")
            (folder / "run_config.yaml").write_text("model:\n  num_layers: 2\n")
            (run / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--tp", default=2, show_default=True)
def main(out: Path, tp: int) -> None:
    """The truth is made here, once (the ranks read it instead of each importing Diffusers to build the model)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = build_tiny_transformer("t2v", seed=7).state_dict()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "truth.safetensors"))
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in tiny_transformer_config("t2v").items()}
    (out / "truth.json").write_text(json.dumps({"config": config}, indent=1))
    launch(rank_main, out, world_size=tp)


if __name__ == "__main__":
    main()
