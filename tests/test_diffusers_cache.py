"""What an export learns of Diffusers' classes is kept on disk (cogexport/models/diffusers_cache.py): an export that
finds it there writes the same bytes without importing Diffusers, and anything else in the cache is made anew."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cogvideox_fixtures import build_tiny_transformer, config_folder, tiny_pipeline, write_sat_run
from conftest import command_in_fresh_process, folder_bytes
from diffusers import CogVideoXTransformer3DModel
from fixtures import SCRIPTS

from cogexport.models.diffusers_cache import NotCacheable, decode, encode

sys.path.insert(0, str(SCRIPTS))
from tiny_models import randomize_  # noqa: E402

def export_in_fresh_process(run: Path, base: Path, output: Path, cache: str,
                            options: tuple[str, ...] = ("--component", "transformer")) -> dict:
    return command_in_fresh_process([run, output, "--base", base, *options], cache)


@pytest.fixture(scope="module")
def sat_run(tmp_path_factory):
    where = tmp_path_factory.mktemp("cache-run")
    original = build_tiny_transformer("5b", num_layers=2, seed=3)
    return write_sat_run(where / "run", original.state_dict()).run_dir, config_folder(where / "base", original)


def test_a_remembered_export_writes_the_same_bytes_without_importing_diffusers(sat_run, tmp_path):
    run, base = sat_run
    cache = tmp_path / "cache"
    unremembered = export_in_fresh_process(run, base, tmp_path / "off", cache="")
    first = export_in_fresh_process(run, base, tmp_path / "first", cache=str(cache))
    again = export_in_fresh_process(run, base, tmp_path / "again", cache=str(cache))
    assert "diffusers" in unremembered["imported"] and "diffusers" in first["imported"]
    assert again["imported"] == []
    assert sorted(p.name.split("-")[0] for p in next(cache.iterdir()).iterdir()) == ["defaults", "target"]
    expected = folder_bytes(tmp_path / "off")
    assert folder_bytes(tmp_path / "first") == expected and folder_bytes(tmp_path / "again") == expected


def test_a_remembered_pipeline_export_writes_the_same_folder_without_importing_diffusers(tmp_path):
    base = tiny_pipeline("t2v")
    model = CogVideoXTransformer3DModel.from_config(CogVideoXTransformer3DModel.load_config(base / "transformer"))
    run = write_sat_run(tmp_path / "run", randomize_(model, 5).state_dict()).run_dir
    cache = tmp_path / "cache"
    for name, where in (("off", ""), ("first", str(cache))):
        assert "diffusers" in export_in_fresh_process(run, base, tmp_path / name, where, options=())["imported"]
    again = export_in_fresh_process(run, base, tmp_path / "again", str(cache), options=())
    assert again["imported"] == []
    assert sorted(p.name.split("-")[0] for p in next(cache.iterdir()).iterdir()) == \
        ["defaults", "model_index_entry", "pipeline", "scheduler", "target"]
    expected = folder_bytes(tmp_path / "off")
    assert {"model_index.json", "scheduler/scheduler_config.json", "transformer/config.json"} <= set(expected)
    assert folder_bytes(tmp_path / "first") == expected and folder_bytes(tmp_path / "again") == expected


@pytest.mark.parametrize("spoil", ["truncated", "another key", "not an object", "an answer short of a field"])
def test_a_spoiled_cache_entry_is_made_anew(spoil, sat_run, tmp_path):
    run, base = sat_run
    cache = tmp_path / "cache"
    export_in_fresh_process(run, base, tmp_path / "first", cache=str(cache))
    entries = sorted(next(cache.iterdir()).iterdir())
    for entry in entries:
        text = entry.read_text()
        spoiled = {"truncated": text[: len(text) // 2],
                   "another key": json.dumps({**json.loads(text), "key": "{}"}),
                   "not an object": "[1, 2]",
                   "an answer short of a field": json.dumps({**json.loads(text), "answer": {"counts": {}}})}[spoil]
        entry.write_text(spoiled)
    told = export_in_fresh_process(run, base, tmp_path / "again", cache=str(cache))
    assert "diffusers" in told["imported"]  # nothing spoiled was taken
    assert folder_bytes(tmp_path / "again") == folder_bytes(tmp_path / "first")
    for entry in entries:  # and each entry was written anew, whole
        assert json.loads(entry.read_text())["answer"]


def test_json_carries_a_config_exactly():
    config = {"rope_axes_dim": (16, 56, 56), "blocks": ["a", ("b", 2)], "scale": 0.18215, "none": None,
              "nested": {"pair": (1.5, True)}}
    assert decode(json.loads(json.dumps(encode(config)))) == config
    assert type(decode(encode(config))["rope_axes_dim"]) is tuple
    for uncarried in ({"dtype": object()}, {1: "an int key"}, {"__tuple__": [1]}):
        with pytest.raises(NotCacheable):
            encode(uncarried)


def test_an_answer_json_cannot_carry_is_made_each_time_and_not_kept(tmp_path, monkeypatch):
    from cogexport.models.diffusers_cache import remembered

    monkeypatch.setenv("COGEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    made = []

    def make() -> dict:
        made.append(1)
        return {"defaults": {"kind": {"a set"}}}  # a set: JSON has none

    for _ in range(2):
        assert remembered("defaults", {"class": "Nothing"}, make) == {"defaults": {"kind": {"a set"}}}
    assert len(made) == 2
    assert not [path for path in (tmp_path / "cache").rglob("*.json")]
    kept = remembered("defaults", {"class": "Tuples"}, lambda: {"defaults": {"sizes": (1, 2)}})
    again = remembered("defaults", {"class": "Tuples"}, lambda: pytest.fail("asked again"))
    assert kept == again and type(again["defaults"]["sizes"]) is tuple
