"""The key-map tables: every shipped table runs both ways and agrees with the independent SAT writer."""

from __future__ import annotations

import pytest
import torch
from cogvideox_fixtures import (VARIANTS, build_tiny_transformer, build_tiny_vae, diffusers_to_sat_transformer,
                                diffusers_to_sat_vae, num_vae_up_blocks)

from cogexport.errors import CogExportError
from cogexport.keymap.plan import plan_translation
from cogexport.keymap.table import TableError, load_table, parse_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import family_named
from cogexport.precision import PrecisionPolicy


def lazy(state_dict: dict[str, torch.Tensor]) -> dict[str, LazyTensor]:
    return {name: LazyTensor(t.shape, t.dtype, lambda t=t: t) for name, t in state_dict.items()}


def loaded(plan) -> dict[str, torch.Tensor]:
    return {name: tensor.load() for name, tensor in plan.tensors.items()}


def assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(actual) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layers", [1, 3])
def test_transformer_table_both_ways_agrees_with_the_independent_writer(variant, layers):
    diffusers_sd = build_tiny_transformer(variant, num_layers=layers, seed=layers).state_dict()
    sat_sd = diffusers_to_sat_transformer(diffusers_sd)
    table = load_table("cogvideox/sat_transformer")
    schema = {name: t.shape for name, t in diffusers_sd.items()}

    assert_same(loaded(plan_translation(table, lazy(sat_sd), schema, {})), diffusers_sd)
    backwards = plan_translation(table.inverted(), lazy(diffusers_sd), None, {})
    assert_same(loaded(backwards), sat_sd)
    # and the round trip through the table alone
    assert_same(loaded(plan_translation(table, backwards.tensors, schema, {})), diffusers_sd)


def test_vae_table_both_ways_with_the_reversed_up_blocks():
    diffusers_sd = build_tiny_vae(seed=3).state_dict()
    levels = num_vae_up_blocks(diffusers_sd)
    assert levels == 3, "three levels, so that up.0 <-> up_blocks.2 is not its own mirror image"
    sat_sd = diffusers_to_sat_vae(diffusers_sd, levels)
    table = load_table("cogvideox/sat_vae")
    plan = plan_translation(table, lazy(sat_sd), {n: t.shape for n, t in diffusers_sd.items()}, {"num_up_blocks": levels})
    assert_same(loaded(plan), diffusers_sd)
    assert set(plan.dropped) == {k for k in sat_sd if k.startswith("loss.")}
    backwards = plan_translation(table.inverted(), lazy(diffusers_sd), None, {"num_up_blocks": levels})
    assert_same(loaded(backwards), {k: v for k, v in sat_sd.items() if not k.startswith("loss.")})


def test_keys_outside_the_prefix_are_ignored_not_renamed():
    diffusers_sd = build_tiny_transformer("5b", num_layers=1).state_dict()
    engine = {f"model.diffusion_model.{k}": v for k, v in diffusers_to_sat_transformer(diffusers_sd).items()}
    engine["conditioner.embedders.0.transformer.shared.weight"] = torch.ones(3)
    engine["first_stage_model.encoder.conv_in.conv.weight"] = torch.ones(2)
    plan = plan_translation(load_table("cogvideox/sat_transformer"), lazy(engine),
                            {n: t.shape for n, t in diffusers_sd.items()}, {})
    assert plan.ignored == ["conditioner.embedders.0.transformer.shared.weight",
                            "first_stage_model.encoder.conv_in.conv.weight"]
    assert set(plan.tensors) == set(diffusers_sd)


def test_adaln_regroup_order_on_values():
    table = load_table("cogvideox/sat_transformer")
    hidden, width = 2, 3
    chunks = [torch.full((hidden, width), float(c)) for c in range(12)]
    sat = {"mixins.adaln_layer.adaLN_modulations.0.1.weight": torch.cat(chunks)}
    plan = plan_translation(table, lazy(sat), None, {}, strict=False)
    norm1 = plan.tensors["transformer_blocks.0.norm1.linear.weight"].load()
    norm2 = plan.tensors["transformer_blocks.0.norm2.linear.weight"].load()
    assert norm1[::hidden, 0].tolist() == [0, 1, 2, 6, 7, 8]
    assert norm2[::hidden, 0].tolist() == [3, 4, 5, 9, 10, 11]


def test_unknown_missing_and_misshapen_keys_are_named():
    diffusers_sd = build_tiny_transformer("2b", num_layers=1).state_dict()
    sat = diffusers_to_sat_transformer(diffusers_sd)
    table = load_table("cogvideox/sat_transformer")
    schema = {n: t.shape for n, t in diffusers_sd.items()}
    with pytest.raises(CogExportError, match=r"1 key\(s\) that key map cogvideox/sat_transformer does not know: mixins.extra.w"):
        plan_translation(table, lazy({**sat, "mixins.extra.w": torch.ones(1)}), schema, {})
    incomplete = {k: v for k, v in sat.items() if k != "transformer.final_layernorm.bias"}
    with pytest.raises(CogExportError, match="lacks 1 tensor.*norm_final.bias"):
        plan_translation(table, lazy(incomplete), schema, {})
    wrong = {**sat, "mixins.final_layer.linear.bias": torch.ones(5)}
    with pytest.raises(CogExportError, match=r"proj_out.bias is \(5,\), the model expects"):
        plan_translation(table, lazy(wrong), schema, {})


TABLE_HEAD = '[table]\nname = "t"\n[placeholders]\ni = "int"\np = ["weight", "bias"]\n'


@pytest.mark.parametrize("body, message", [
    ('[[rename]]\nfrom = "a.{i}.{p}"\nto = "b.{i}.{p}"\n[[rename]]\nfrom = "a.{i}.weight"\nto = "c.{i}"\n',
     "matches several rules"),
    ('[[rename]]\nfrom = "a.{j}"\nto = "b.{j}"\n', "undeclared placeholder"),
    ('[[rename]]\nfrom = "a.{i}"\nto = "b.{i}"\nspeling = 1\n', "unknown field"),
    ('[[regroup]]\nfrom = "a.{i}"\nchunks = 3\nto = [{key = "b.{i}", chunks = [0, 1]}]\n', "exactly once"),
    ('[[drop]]\nfrom = "a.{i}"\n', "needs a reason"),
    ('[[reindex]]\nfrom = "a.{i}"\nto = "b.{i}"\n', "needs reverse"),
    ('[[rename]]\nfrom = "a.{i}"\nto = "b"\n', "same placeholders"),
])
def test_table_mistakes_are_caught_when_the_table_loads(body, message):
    with pytest.raises(TableError, match=message):
        parse_table(TABLE_HEAD + body, "t")


@pytest.mark.parametrize("name, kept", [
    ("transformer_blocks.3.attn1.norm_q.weight", True),
    ("transformer_blocks.3.norm1.norm.bias", True),
    ("transformer_blocks.3.norm1.linear.weight", False),
    ("norm_out.norm.weight", True),
    ("norm_out.linear.weight", False),
    ("patch_embed.pos_embedding", True),
    ("patch_embed.proj.weight", False),
])
def test_fp32_allowlist_matches_dotted_components(name, kept):
    policy = PrecisionPolicy.build("bf16", family_named("cogvideox").transformer.keep_fp32, [])
    assert policy.target_dtype(name, torch.float32) == (torch.float32 if kept else torch.bfloat16)
    assert policy.target_dtype(name, torch.int64) == torch.int64
    assert PrecisionPolicy.build("bf16", [], ["proj*"]).target_dtype("patch_embed.proj.weight", torch.bfloat16) \
        == torch.float32
