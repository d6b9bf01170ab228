"""The LoRA machinery on its own: adapters renamed module by module with a family's key map, including the fused
layers some original layouts have (CogVideoX SAT's query_key_value and its 12-chunk adaLN; HunyuanVideo's
img_attn_qkv, linear1 and half-swapped final adaLN, as a table written here): lora_B is split like the weight
and lora_A shared going to Diffusers names, and fused back (B stacked, or A stacked with a block-diagonal B)
going the other way; kohya's underscore names resolved against the family's real modules."""

from __future__ import annotations

import pytest
import torch

from cogexport.errors import CogExportError
from cogexport.keymap.table import load_table, parse_table
from cogexport.lazy import LazyTensor
from cogexport.lora.adapter import LoraModule
from cogexport.lora.modules import translate_modules
from cogexport.lora.names import decode_kohya
from cogexport.lora.tables import lora_tables

# HunyuanVideo's fused layers, as its original-layout table maps them (docs: video-dit-formats.md 2.2)
FUSED = """
[table]
name = "test/fused"
[placeholders]
i = "int"
p = ["weight", "bias"]
[[chunk]]
from = "double_blocks.{i}.img_attn_qkv.{p}"
to = ["transformer_blocks.{i}.attn.to_q.{p}", "transformer_blocks.{i}.attn.to_k.{p}", "transformer_blocks.{i}.attn.to_v.{p}"]
[[regroup]]
from = "single_blocks.{i}.linear1.{p}"
chunks = 7
to = [{ key = "single_transformer_blocks.{i}.attn.to_q.{p}", chunks = [0] },
      { key = "single_transformer_blocks.{i}.attn.to_k.{p}", chunks = [1] },
      { key = "single_transformer_blocks.{i}.attn.to_v.{p}", chunks = [2] },
      { key = "single_transformer_blocks.{i}.proj_mlp.{p}", chunks = [3, 4, 5, 6] }]
[[regroup]]
from = "final_layer.adaLN_modulation.1.{p}"
chunks = 2
to = [{ key = "norm_out.linear.{p}", chunks = [1, 0] }]
"""


def lazy(tensor: torch.Tensor) -> LazyTensor:
    return LazyTensor(tensor.shape, tensor.dtype, lambda: tensor)


def module(out: int, inp: int, rank: int, alpha: float, seed: int, **deltas) -> LoraModule:
    generator = torch.Generator().manual_seed(seed)
    down, up = torch.randn(rank, inp, generator=generator), torch.randn(out, rank, generator=generator)
    return LoraModule(lazy(down), lazy(up), alpha, **{k: lazy(v) for k, v in deltas.items()})


def test_fused_layers_split_lora_b_like_the_weight_and_share_lora_a():
    table = parse_table(FUSED, "test/fused")
    qkv = module(3 * 8, 8, 4, 8.0, 0, diff_b=torch.randn(24))
    linear1 = module(7 * 8, 8, 2, 2.0, 1)
    final = module(2 * 8, 8, 4, 4.0, 2)
    split, origins = translate_modules({"double_blocks.0.img_attn_qkv": qkv, "single_blocks.3.linear1": linear1,
                                        "final_layer.adaLN_modulation.1": final}, table, "test")
    assert origins["transformer_blocks.0.attn.to_v"] == ["double_blocks.0.img_attn_qkv"]
    for index, name in enumerate(("to_q", "to_k", "to_v")):
        part = split[f"transformer_blocks.0.attn.{name}"]
        assert part.down is qkv.down and part.alpha == 8.0
        assert torch.equal(part.up.load(), torch.chunk(qkv.up.load(), 3)[index])
        assert torch.equal(part.diff_b.load(), torch.chunk(qkv.diff_b.load(), 3)[index])
    rows = torch.chunk(linear1.up.load(), 7)
    assert torch.equal(split["single_transformer_blocks.3.attn.to_k"].up.load(), rows[1])
    assert torch.equal(split["single_transformer_blocks.3.proj_mlp"].up.load(), torch.cat(rows[3:]))
    assert split["single_transformer_blocks.3.proj_mlp"].down is linear1.down
    shift, scale = torch.chunk(final.up.load(), 2)
    assert torch.equal(split["norm_out.linear"].up.load(), torch.cat([scale, shift]))

    # and back: the shared A lets B be stacked again, exactly the adapter that came in
    back, _ = translate_modules(split, table.inverted(), "test")
    for name, original in (("double_blocks.0.img_attn_qkv", qkv), ("single_blocks.3.linear1", linear1),
                           ("final_layer.adaLN_modulation.1", final)):
        assert back[name].down is original.down and back[name].alpha == original.alpha
        assert torch.equal(back[name].up.load(), original.up.load())
    assert torch.equal(back["double_blocks.0.img_attn_qkv"].diff_b.load(), qkv.diff_b.load())


def test_separate_adapters_fuse_into_one_block_diagonal_adapter():
    table = parse_table(FUSED, "test/fused").inverted()
    q, k = module(8, 8, 4, 8.0, 3), module(8, 8, 2, 4.0, 4)  # different ranks, the same scale 2
    fused, _ = translate_modules({"transformer_blocks.1.attn.to_q": q, "transformer_blocks.1.attn.to_k": k}, table, "t")
    qkv = fused["double_blocks.1.img_attn_qkv"]
    assert qkv.rank == 6 and qkv.alpha / qkv.rank == 2.0
    assert torch.equal(qkv.down.load(), torch.cat([q.down.load(), k.down.load()]))
    expected = torch.zeros(24, 6)
    expected[:8, :4], expected[8:16, 4:] = q.up.load(), k.up.load()  # v has no adapter: zero rows
    assert torch.equal(qkv.up.load(), expected)

    only_q, _ = translate_modules({"transformer_blocks.1.attn.to_q": q}, table, "t")
    assert only_q["double_blocks.1.img_attn_qkv"].down is q.down
    assert torch.equal(only_q["double_blocks.1.img_attn_qkv"].up.load(), torch.cat([q.up.load(), torch.zeros(16, 4)]))

    stronger = module(8, 8, 4, 16.0, 5)
    with pytest.raises(CogExportError, match="different strengths"):
        translate_modules({"transformer_blocks.1.attn.to_q": q, "transformer_blocks.1.attn.to_k": stronger}, table, "t")


def test_cogvideox_sat_fused_layers():
    """CogVideoX's own SAT layout: q, k, v stacked in query_key_value; the adaLN's 12 chunks interleaved into
    norm1 and norm2."""
    table = load_table("cogvideox/sat_transformer")
    qkv, adaln = module(3 * 16, 16, 4, 1.0, 6), module(12 * 16, 8, 4, 1.0, 7)
    split, _ = translate_modules({"transformer.layers.0.attention.query_key_value": qkv,
                                  "mixins.adaln_layer.adaLN_modulations.0.1": adaln}, table, "test")
    assert torch.equal(split["transformer_blocks.0.attn1.to_v"].up.load(), torch.chunk(qkv.up.load(), 3)[2])
    chunks = torch.chunk(adaln.up.load(), 12)
    assert torch.equal(split["transformer_blocks.0.norm2.linear"].up.load(),
                       torch.cat([chunks[i] for i in (3, 4, 5, 9, 10, 11)]))
    back, _ = translate_modules(split, table.inverted(), "test")
    assert torch.equal(back["mixins.adaln_layer.adaLN_modulations.0.1"].up.load(), adaln.up.load())


def test_kohya_names_resolve_against_the_family_modules():
    musubi = next(t for t in lora_tables() if t.name == "wan/musubi_lora")
    decoded = decode_kohya(musubi, ["blocks_0_self_attn_q", "blocks_11_cross_attn_k_img", "blocks_3_ffn_2",
                                    "head_head", "text_embedding_0", "blocks_0_self_attn_x", "blocks_0_self_attn"])
    assert decoded == {"blocks_0_self_attn_q": "blocks.0.self_attn.q", "blocks_11_cross_attn_k_img":
                       "blocks.11.cross_attn.k_img", "blocks_3_ffn_2": "blocks.3.ffn.2", "head_head": "head.head",
                       "text_embedding_0": "text_embedding.0", "blocks_0_self_attn_x": None, "blocks_0_self_attn": None}
