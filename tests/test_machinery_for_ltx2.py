"""The pieces of shared machinery the LTX-2 family needed, each on its own and family-free: a table that reads keys by
globs under their full names (select_keys), a look-alike layout refused (excludes), dropped tensors kept beside the
model (drop ... keep), a judge not asked when a key its fixed renames do not know is present (judge_when = false), a
pipeline's own model classes (module) and their model_index.json entry, and a shapes hook that writes release
metadata from every model of the file."""

from __future__ import annotations

import types

import pytest
import torch

from cogexport.keymap.plan import plan_translation
from cogexport.keymap.table import TableError, parse_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import model_class, model_index_entry
from cogexport.models.shapes import FamilyShapes
from cogexport.verify_models import _judge_assumption_unmet


def lazy(names: dict[str, tuple[int, ...]]) -> dict[str, LazyTensor]:
    return {name: LazyTensor(torch.Size(shape), torch.float32, lambda shape=shape: torch.ones(shape))
            for name, shape in names.items()}


TWO_PREFIXES = """
[table]
name = "t"
select_keys = ["model.inner.*", "outer.*"]
signature = ["model.inner.*"]
excludes = ["model.inner.foreign.*"]

[placeholders]
n = "name"
s = ["mean", "std"]

[[rename]]
from = "model.inner.{n}.weight"
to = "inner.{n}.weight"

[[rename]]
from = "outer.{n}"
to = "outer.{n}"

[[drop]]
from = "model.inner.stat.{s}"
reason = "no place for it"
keep = "per_channel_statistics.safetensors"
"""


def test_select_keys_reads_full_names_and_ignores_the_rest():
    table = parse_table(TWO_PREFIXES, "t")
    source = lazy({"model.inner.a.weight": (2,), "outer.b": (3,), "model.other.c": (1,), "vae.d": (1,)})
    selected, ignored = table.select(source)
    assert selected == {"model.inner.a.weight": "model.inner.a.weight", "outer.b": "outer.b"}
    assert ignored == ["model.other.c", "vae.d"]
    plan = plan_translation(table, source, {"inner.a.weight": torch.Size((2,)), "outer.b": torch.Size((3,))}, {})
    assert list(plan.tensors) == ["inner.a.weight", "outer.b"] and plan.ignored == ["model.other.c", "vae.d"]
    # backwards, the full names again, and nothing selected away
    back = plan_translation(table.inverted(), plan.tensors, None, {}).tensors
    assert set(back) == {"model.inner.a.weight", "outer.b"}


def test_excludes_refuses_a_look_alike():
    table = parse_table(TWO_PREFIXES, "t")
    assert table.recognises(["model.inner.a"])
    assert not table.recognises(["model.inner.a", "model.inner.foreign.x"])


def test_a_kept_drop_hands_its_tensors_out_and_every_kept_file_is_made():
    table = parse_table(TWO_PREFIXES, "t")
    source = lazy({"model.inner.a.weight": (2,), "model.inner.stat.mean": (4,)})
    plan = plan_translation(table, source, {"inner.a.weight": torch.Size((2,))}, {})
    assert plan.dropped == {"model.inner.stat.mean": "no place for it"}
    kept = "per_channel_statistics.safetensors"  # a file cogexport keeps beside a model folder (kept_beside.py)
    assert list(plan.kept) == [kept] and list(plan.kept[kept]) == ["model.inner.stat.mean"]
    assert torch.equal(plan.kept[kept]["model.inner.stat.mean"].load(), torch.ones(4))
    none = plan_translation(table, lazy({"model.inner.a.weight": (2,)}), {"inner.a.weight": torch.Size((2,))}, {})
    assert none.kept == {kept: {}}  # made empty: the source had none (so the way back says nothing)
    assert table.drops[0].names() == ["model.inner.stat.mean", "model.inner.stat.std"]
    with pytest.raises(TableError, match="keep names a file cogexport keeps beside a model folder"):
        parse_table(TWO_PREFIXES.replace('"per_channel_statistics.safetensors"', '"sub/stats.bin"'), "t")


def test_judge_when_false_means_the_key_must_be_absent():
    table = parse_table(TWO_PREFIXES.replace('excludes = ["model.inner.foreign.*"]',
                                             'judge = "x"\njudge_when = { "later.key" = false, "a" = ["*", 2] }'), "t")
    assert _judge_assumption_unmet(table, {"a": (5, 2)}) is None
    assert "later.key" in _judge_assumption_unmet(table, {"a": (5, 2), "later.key": (1,)})
    assert "of shape" in _judge_assumption_unmet(table, {"a": (5, 3)})


def test_a_pipelines_own_model_class_and_its_model_index_entry():
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    assert model_class("LTX2TextConnectors") is LTX2TextConnectors
    assert model_index_entry("LTX2TextConnectors") == ["ltx2", "LTX2TextConnectors"]
    assert model_index_entry("AutoencoderKLWan") == ["diffusers", "AutoencoderKLWan"]


def test_original_metadata_gets_every_models_config_when_the_hook_takes_them():
    two = types.SimpleNamespace(original_metadata=lambda config, task: {"n": str(len(config))})
    three = types.SimpleNamespace(original_metadata=lambda config, task, components: {"c": ",".join(components)})
    assert FamilyShapes(two).original_metadata({"a": 1}, None, {"vae": {}}) == {"n": "1"}
    assert FamilyShapes(three).original_metadata({}, None, {"vae": {}, "vocoder": {}}) == {"c": "vae,vocoder"}
    assert FamilyShapes(types.SimpleNamespace()).original_metadata({}, None) == {}
