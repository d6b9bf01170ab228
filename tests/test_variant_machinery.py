"""The machinery families that extend another family's model need (Wan's variants on Wan's tables): a reshape rule
that runs both ways, the most specific of layouts that extend one another, a layout several families list read as its
owner's, a table that says why it has no judge, and the family a config beside the weights names."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from cogexport.errors import CogExportError
from cogexport.keymap.plan import plan_translation
from cogexport.keymap.table import TableError, load_table, parse_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import family_of_class, family_named
from cogexport.models.recognize import family_beside, most_specific, owner_first

RESHAPE = """[table]
name = "toy/reshape"
[placeholders]
i = "int"
[[reshape]]
from = "act.{i}.bias"
to = "act.{i}.flat_bias"
from_shape = [1, -1, 1, 1]
to_shape = [-1]
"""


def lazy(tensors: dict[str, torch.Tensor]) -> dict[str, LazyTensor]:
    return {name: LazyTensor(t.shape, t.dtype, lambda t=t: t) for name, t in tensors.items()}


def test_a_reshape_runs_both_ways_bit_for_bit():
    table = parse_table(RESHAPE, "toy/reshape")
    original = {f"act.{i}.bias": torch.randn(1, 3 + i, 1, 1) for i in range(2)}
    forward = plan_translation(table, lazy(original), {"act.0.flat_bias": (3,), "act.1.flat_bias": (4,)}, {})
    assert {name: tuple(t.shape) for name, t in forward.tensors.items()} == {"act.0.flat_bias": (3,),
                                                                            "act.1.flat_bias": (4,)}
    assert all(torch.equal(forward.tensors[f"act.{i}.flat_bias"].load(), original[f"act.{i}.bias"].flatten())
               for i in range(2))
    back = plan_translation(table.inverted(), forward.tensors, None, {})
    assert set(back.tensors) == set(original)
    assert all(torch.equal(back.tensors[name].load(), tensor) for name, tensor in original.items())


def test_a_reshape_refuses_a_tensor_of_another_shape():
    table = parse_table(RESHAPE, "toy/reshape")
    with pytest.raises(CogExportError, match=r"act.0.bias \(1, 3, 2, 1\) is not of the shape \[1, -1, 1, 1\]"):
        plan_translation(table, lazy({"act.0.bias": torch.zeros(1, 3, 2, 1)}), None, {})


@pytest.mark.parametrize("views, message", [('from_shape = [1, -1, 1, 1]', "needs from_shape and to_shape"),
                                            ('from_shape = [-1, -1]\nto_shape = [-1]', "at most one -1"),
                                            ('from_shape = [1, 0]\nto_shape = [-1]', "needs from_shape and to_shape")])
def test_reshape_mistakes_are_caught_when_the_table_loads(views, message):
    body = '[table]\nname = "t"\n[[reshape]]\nfrom = "a"\nto = "b"\n' + views + "\n"
    with pytest.raises(TableError, match=message):
        parse_table(body, "t")


def test_a_table_that_says_why_it_has_no_judge_inherits_none():
    # Wan's judge, through the included table
    assert load_table("wan_vace/original_transformer").judge == "convert_wan_transformer_to_diffusers"
    skyreels = load_table("skyreels_v2/original_transformer")
    assert skyreels.judge is None and "fps_projection" in skyreels.no_judge


def _table(name: str, signature: list[str], requires: list[str]):
    text = f'[table]\nname = "{name}"\nsignature = {json.dumps(signature)}\nrequires = {json.dumps(requires)}\n'
    text += '[placeholders]\nkey = "path"\n[[rename]]\nfrom = "{key}"\nto = "{key}"\n'
    return parse_table(text, name)


def test_the_most_specific_layout_wins_and_only_over_layouts_it_extends():
    a, b = SimpleNamespace(key="a"), SimpleNamespace(key="b")
    plain = _table("a/layout", ["x.*"], ["y.*"])
    extended = _table("b/layout", ["x.*"], ["y.*", "z.*"])
    other = _table("b/other", ["w.*"], ["y.*", "z.*"])
    assert most_specific([(a, plain), (b, extended)]) == [(b, extended)]
    assert most_specific([(b, extended), (a, plain)]) == [(b, extended)]
    # another signature is another model, not an extension: both stay, and the caller calls the keys mixed
    assert most_specific([(a, plain), (b, other)]) == [(a, plain), (b, other)]


def test_a_layout_several_families_list_is_its_owners():
    a, b = SimpleNamespace(key="a"), SimpleNamespace(key="b")
    shared = _table("b/layout", ["x.*"], [])
    assert owner_first([(a, shared), (b, shared)]) == [(b, shared), (a, shared)]


def test_a_class_several_families_list_is_its_owners():
    """Wan's VAE (AutoencoderKLWan) is listed by SkyReels-V2, Wan Animate and Wan VACE too, which sort around Wan."""
    assert family_of_class("AutoencoderKLWan") == (family_named("wan"), "vae")
    assert family_of_class("WanVACETransformer3DModel") == (family_named("wan_vace"), "transformer")


@pytest.mark.parametrize("config, family", [
    ({"_class_name": "SkyReelsV2Transformer3DModel"}, "SkyReels-V2"),
    ({"_class_name": "WanModel", "inject_sample_info": False}, "SkyReels-V2"),  # claimed by SkyReels-V2
    ({"_class_name": "WanModel"}, None),  # Wan's own: the weights decide
    ({"_class_name": "AutoencoderKLWan"}, "Wan"),  # any model class names its family (the VAE: Wan's)
    ({"_class_name": "SomethingElse"}, None)])
def test_the_family_a_config_beside_the_weights_names(config, family, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    found = family_beside([tmp_path])
    assert (found.name if found else None) == family
