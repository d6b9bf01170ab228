"""MiniMax-H3: the release partition (shards, index and the MiniMaxH3DiTModel config.json; qkv interleaved per head),
Comfy-Org's single files (qkv stacked) and Diffusers folders, both ways. The original layouts are written by
DiffSynth-Studio's MiniMaxH3DiT (the release's module tree) and judged by Diffusers' own single-file converter with
each qkv order (fp32, torch.equal) and by DiffSynth-Studio's forward against the exported model's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import snapshot
from minimax_h3_fixtures import (ORIGINAL_CONFIG, comfy_file, diffsynth_forward, diffsynth_model, diffusers_config,
                                 diffusers_forward, packed_inputs, release_dtypes, release_partition)
from safetensors.torch import load_file

from cogexport.keymap.plan import plan_translation
from cogexport.keymap.table import parse_table
from cogexport.lazy import LazyTensor

HEADS = ORIGINAL_CONFIG["num_attention_heads"]
WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> dict:
    """DiffSynth-Studio's tiny MiniMaxH3DiT (fp32), its state dict, and a release partition of it."""
    model = diffsynth_model(seed=1)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    folder = tmp_path_factory.mktemp("minimax_h3")
    return {"model": model, "state": state, "release": release_partition(folder / "FL2VA" / "transformer", state),
            "folder": folder}


def converted(state: dict, qkv_layout: str) -> dict:
    """Diffusers' own single-file converter's answer for these original tensors in this qkv order."""
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    return convert_minimax_h3_transformer_checkpoint_to_diffusers(dict(state), config=diffusers_config(),
                                                                  qkv_layout=qkv_layout)


def assert_same_tensors(ours: dict, expected: dict) -> None:
    assert set(ours) == set(expected)
    different = [name for name in expected if not torch.equal(ours[name], expected[name])]
    assert not different, different[:5]


# -- the key-map language: a regroup repeated per group ----------------------------------------------------------------
GROUPED = """
[table]
name = "test/grouped"
[placeholders]
i = "int"
[[regroup]]
from = "l.{i}.qkv"
chunks = 3
groups = "heads"
to = [{ key = "l.{i}.q", chunks = [0] }, { key = "l.{i}.k", chunks = [1] }, { key = "l.{i}.v", chunks = [2] }]
"""


def _lazy(tensors: dict) -> dict:
    return {name: LazyTensor(t.shape, t.dtype, lambda t=t: t) for name, t in tensors.items()}


def test_a_grouped_regroup_takes_each_targets_chunk_from_every_group_and_runs_backwards():
    table = parse_table(GROUPED, "test/grouped")
    fused = torch.arange(3 * 3 * 2 * 4, dtype=torch.float32).reshape(3 * 3 * 2, 4)  # 3 heads of [q k v], 2 rows each
    plan = plan_translation(table, _lazy({"l.0.qkv": fused}), None, {"heads": 3})
    q, k, v = fused.unflatten(0, (3, 3, 2)).unbind(1)
    for name, expected in {"l.0.q": q, "l.0.k": k, "l.0.v": v}.items():
        assert torch.equal(plan.tensors[name].load(), expected.flatten(0, 1)), name
    back = plan_translation(table.inverted(), plan.tensors, None, {"heads": 3})
    assert torch.equal(back.tensors["l.0.qkv"].load(), fused)
    with pytest.raises(Exception, match="needs 'heads'"):
        plan_translation(table, _lazy({"l.0.qkv": fused}), {"l.0.q": q.shape}, {})


# -- the release partition and Comfy-Org's single file, judged by Diffusers' converter ----------------------------------
def test_a_release_partition_exports_what_diffusers_converter_makes_of_its_interleaved_shards(original, cli, tmp_path):
    result = cli(original["release"], tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), converted(original["state"], "interleaved"))
    kept = load_file(tmp_path / "out" / "rotary_frequencies.safetensors")
    assert list(kept) == ["rope.inv_freq"] and torch.equal(kept["rope.inv_freq"], original["state"]["rope.inv_freq"])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {key: config[key] for key in diffusers_config()} == {**diffusers_config(), "patch_size": [1, 2, 2]}
    # verify asks the same converter, with the target's config and the release's order
    checked = cli("verify", tmp_path / "out", "--against", original["release"])
    assert checked.exit_code == 0 and "second opinion:" in checked.stdout and "makes the same" in checked.stdout, \
        checked.stdout + checked.stderr


def test_a_comfy_single_file_exports_what_diffusers_converter_makes_of_its_stacked_rows(original, cli, tmp_path):
    single = comfy_file(tmp_path / "comfy" / "minimax_h3_fl2va_bf16.safetensors", original["state"])
    config = tmp_path / "base"
    config.mkdir()
    from diffusers import MiniMaxH3Transformer3DModel

    MiniMaxH3Transformer3DModel.from_config(diffusers_config()).save_config(config)
    result = cli(single, tmp_path / "out", "--dtype", "fp32", "--base", config)
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), converted(load_file(single), "stacked"))


def test_inspect_names_the_layout_the_files_say(original, cli, tmp_path):
    single = comfy_file(tmp_path / "minimax_h3.safetensors", original["state"])
    assert "minimax_h3/comfy_transformer" in cli("inspect", single, "--json").stdout
    assert "minimax_h3/release_transformer" in cli("inspect", original["release"], "--json").stdout


def test_the_two_qkv_orders_are_never_guessed(original, cli, tmp_path):
    """The release's shards without their config.json say neither order: refused in one line, nothing written; a
    single file with the release's config.json beside it (merged from the shards) is the release's order."""
    shards = tmp_path / "shards"
    shutil.copytree(original["release"], shards)
    (shards / "config.json").unlink()
    before = snapshot(shards)
    result = cli(shards, tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 2 and not (tmp_path / "out").exists() and snapshot(shards) == before
    assert result.stderr.count("\n") == 1 and "MiniMaxH3DiTModel" in result.stderr and "one safetensors file" in \
        result.stderr, result.stderr
    merged = tmp_path / "merged"
    merged.mkdir()
    from safetensors.torch import save_file

    save_file(original["state"], merged / "minimax_h3.safetensors")
    shutil.copy(original["release"] / "config.json", merged / "config.json")
    result = cli(merged / "minimax_h3.safetensors", tmp_path / "from_merged", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "from_merged" / WEIGHTS), converted(original["state"], "interleaved"))


def test_a_pruned_checkpoint_is_refused_by_name(original, cli, tmp_path):
    state = {**original["state"], "adaln_t_table": torch.zeros(9, ORIGINAL_CONFIG["time_embed_dim"])}
    checkpoint = release_partition(tmp_path / "checkpoint", state)
    result = cli(checkpoint, tmp_path / "out")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert result.stderr.count("\n") == 1 and "adaln_t_table" in result.stderr and "a pruned MiniMax-H3" in \
        result.stderr, result.stderr


# -- the original forward ------------------------------------------------------------------------------------------
def test_diffsynths_forward_equals_the_exported_models(original, cli, tmp_path):
    from diffusers import MiniMaxH3Transformer3DModel

    result = cli(original["release"], tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    exported = MiniMaxH3Transformer3DModel.from_pretrained(tmp_path / "out").eval()
    given = packed_inputs(seed=2)
    (video, audio), (their_video, their_audio) = diffusers_forward(exported, given), \
        diffsynth_forward(original["model"], given)
    assert torch.allclose(video, their_video, atol=1e-5, rtol=0) and torch.allclose(audio, their_audio, atol=1e-5, rtol=0)
    assert video.abs().max() > 0.1  # a model that outputs something
    # a Diffusers folder is read as it is: exported again, the same weights, byte for byte
    assert cli(tmp_path / "out", tmp_path / "again", "--dtype", "fp32").exit_code == 0
    assert (tmp_path / "again" / WEIGHTS).read_bytes() == (tmp_path / "out" / WEIGHTS).read_bytes()


def test_the_published_size_is_recognised_and_its_release_names_run_both_ways():
    """FL2VA's config at full size, on the meta device: its Diffusers names are the published variant's, and the
    release table makes them from the release's names (56 heads of [q k v] per qkv_proj) and back."""
    from cogexport.keymap.plan import translate_shapes
    from cogexport.keymap.table import load_table
    from cogexport.models.family import family_named
    from cogexport.models.recognize import read_facts
    from cogexport.models.target import build_target

    family = family_named("MiniMax-H3")
    target = build_target(family.transformer.class_name, family.transformer_config(family.variants[0]))
    table = load_table("minimax_h3/release_transformer")
    original = translate_shapes(table.inverted(), target.schema, target.counts)
    assert original["blocks.49.attn.qkv_proj.weight"] == (3 * 56 * 128, 5376) and "token_refiner.blocks.1.mlp.fc1.weight" in original
    assert translate_shapes(table, original, target.counts) == dict(target.schema)
    recognised = read_facts(family, table, original)
    assert recognised.variant.name == "MiniMax-H3-FL2VA" and recognised.tasks == ("fl2va", "ref2va")


# -- the way back --------------------------------------------------------------------------------------------------
def test_the_way_back_is_the_release_partition_byte_for_byte(original, cli, tmp_path):
    """The release in its own mixed precision, exported (bf16 with its fp32 modules) and written back: the same
    shards, cut at the same tensors, the same index and config.json."""
    release = release_partition(tmp_path / "release", release_dtypes(original["state"]))
    assert len(list(release.glob("model-*.safetensors"))) > 3
    assert cli(release, tmp_path / "diffusers").exit_code == 0
    result = cli(tmp_path / "diffusers", tmp_path / "back", "--to", "original", "--max-shard-size", "20kB")
    assert result.exit_code == 0, result.stderr
    shards = sorted(p.name for p in release.glob("model-*.safetensors"))
    assert sorted(p.name for p in (tmp_path / "back").glob("model-*.safetensors")) == shards
    for name in shards:
        assert (tmp_path / "back" / name).read_bytes() == (release / name).read_bytes(), name
    checked = cli("verify", tmp_path / "back", "--against", tmp_path / "diffusers")
    assert checked.exit_code == 0 and "makes the same" in checked.stdout, checked.stdout + checked.stderr
    index = "model.safetensors.index.json"
    assert json.loads((tmp_path / "back" / index).read_text())["weight_map"] == \
        json.loads((release / index).read_text())["weight_map"]
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == ORIGINAL_CONFIG
