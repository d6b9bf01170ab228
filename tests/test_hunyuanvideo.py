"""HunyuanVideo: tiny models of every shape class (T2V, I2V 33-channel, I2V 16-channel) built with Diffusers'
HunyuanVideoTransformer3DModel, judged by Diffusers' own single-file converter (run with its hard-coded hidden size
replaced by the tiny one): the way back, the way forward, release layouts, pipelines, a DeepSpeed fine-tune."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refused, snapshot
from diffusers import HunyuanVideoTransformer3DModel
from hunyuanvideo_fixtures import (MODEL_STATES, MODEL_TYPE, SHAPE_CLASSES, TINY_PROMPT_TEMPLATE,
                                   build_tiny_transformer, build_vae, config_folder, diffusers_judge, finetune,
                                   original_shapes, random_original_state_dict, release_file, tiny_config,
                                   tiny_pipeline)
from safetensors.torch import load_file

from cogexport.keymap.plan import translate_shapes
from cogexport.keymap.table import load_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables
from cogexport.models.target import build_target
from cogexport.precision import PrecisionPolicy
from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer

FAMILY = family_named("hunyuanvideo")
WEIGHTS = "diffusion_pytorch_model.safetensors"


def model_type_args(shape_class: str) -> list[str]:
    return ["--model-type", MODEL_TYPE[shape_class]]


def written_back(cli, tmp_path, model, shape_class: str, *extra) -> dict[str, torch.Tensor]:
    """``cogexport --to original`` of ``model``'s save_pretrained folder; the module dict of the file it writes."""
    model.save_pretrained(tmp_path / "diffusers")
    result = cli(tmp_path / "diffusers", tmp_path / "original", "--to", "original", *extra)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md", MODEL_STATES]
    saved = torch.load(tmp_path / "original" / MODEL_STATES, weights_only=True)
    assert list(saved) == ["module"]
    return saved["module"]


def test_the_fixtures_original_names_are_what_diffusers_converts():
    """The original names the fixtures use (written from the facts, not from cogexport's tables) are exactly what
    Diffusers' converter turns into the Diffusers model's tensors."""
    for shape_class in SHAPE_CLASSES:
        model = build_tiny_transformer(shape_class)
        converted = diffusers_judge(random_original_state_dict(dict(model.config)))
        assert {n: t.shape for n, t in converted.items()} == {n: t.shape for n, t in model.state_dict().items()}


@pytest.mark.parametrize("shape_class", SHAPE_CLASSES)
def test_way_back_is_read_by_diffusers_converter_to_the_exact_tensors(shape_class, cli, tmp_path):
    model = build_tiny_transformer(shape_class, seed=3)
    original = written_back(cli, tmp_path, model, shape_class, "--dtype", "fp32")
    assert {n: t.shape for n, t in original.items()} == original_shapes(dict(model.config))
    converted = diffusers_judge(original)
    expected = model.state_dict()
    assert set(converted) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(converted[name], tensor), name


def test_way_back_in_bf16_keeps_the_norms_in_fp32(cli, tmp_path):
    model = build_tiny_transformer("t2v", seed=4)
    original = written_back(cli, tmp_path, model, "t2v")  # the default --dtype bf16
    converted = diffusers_judge(original)
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    for name, tensor in model.state_dict().items():
        assert torch.equal(converted[name], tensor.to(policy.target_dtype(name, tensor.dtype))), name
    assert {t.dtype for t in original.values()} == {torch.bfloat16, torch.float32}


@pytest.mark.parametrize("shape_class", SHAPE_CLASSES)
@pytest.mark.parametrize("max_shard_size", ["5GB", "40kB"])
def test_forward_export_of_the_written_file_is_save_pretrained_byte_for_byte(shape_class, max_shard_size, cli,
                                                                            tmp_path):
    model = build_tiny_transformer(shape_class, seed=5)
    written_back(cli, tmp_path, model, shape_class, "--dtype", "fp32")
    base = config_folder(tmp_path / "base", model)
    source = tmp_path / "original" / MODEL_STATES
    result = cli(*model_type_args(shape_class), source, tmp_path / "fp32", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    exported = load_file(tmp_path / "fp32" / WEIGHTS)
    assert set(exported) == set(model.state_dict())
    assert all(torch.equal(exported[n], t) for n, t in model.state_dict().items())

    result = cli(*model_type_args(shape_class), source, tmp_path / "ours", "--base", base,
                 "--max-shard-size", max_shard_size)
    assert result.exit_code == 0, result.stderr
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    reference = HunyuanVideoTransformer3DModel.from_config(model.config)
    reference.load_state_dict({n: t.to(policy.target_dtype(n, t.dtype)) for n, t in model.state_dict().items()},
                              assign=True)
    reference.save_pretrained(tmp_path / "theirs", max_shard_size=max_shard_size)
    ours = sorted(p.name for p in (tmp_path / "ours").iterdir() if p.name != "README.md")  # (the model card)
    assert ours == sorted(p.name for p in (tmp_path / "theirs").iterdir())
    assert len(ours) == 2 if max_shard_size == "5GB" else len(ours) > 3
    for name in ours:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["image_condition_type"] == SHAPE_CLASSES[shape_class].get("image_condition_type")


def test_release_layouts_module_ema_bare_and_folder(cli, tmp_path):
    """The release's file ({"module": ..., "ema": ...}), FastVideo's bare state dict under the same name, and the
    transformers/ folder itself: each exports to what Diffusers' converter makes of the same weights."""
    config = tiny_config("t2v")
    module, ema = random_original_state_dict(config, seed=6), random_original_state_dict(config, seed=7)
    base = config_folder(tmp_path / "base", build_tiny_transformer("t2v"))
    release = release_file(tmp_path / "release" / "transformers", module, ema=ema)
    bare = release_file(tmp_path / "fastvideo" / "transformers", None, **module)
    cases = {"module": (release, [], module), "ema": (release, ["--ema"], ema), "bare": (bare, [], module),
             "folder": (release.parent, [], module)}
    for case, (source, extra, weights) in cases.items():
        before = snapshot(source.parent)
        result = cli(source, tmp_path / case, "--base", base, "--dtype", "fp32", *extra)
        assert result.exit_code == 0, (case, result.stderr)
        exported = load_file(tmp_path / case / WEIGHTS)
        expected = diffusers_judge(weights)
        assert set(exported) == set(expected), case
        assert all(torch.equal(exported[n], expected[n]) for n in expected), case
        assert snapshot(source.parent) == before
    result = cli("inspect", release, "--json")
    found = json.loads(result.stdout)
    assert found["models"]["transformer"]["family"] == "HunyuanVideo"


def test_release_vae_with_state_dict_and_prefix(cli, tmp_path):
    """vae/pytorch_model.pt: the Diffusers names under `state_dict`, prefixed `vae.`; the VAE exports unrenamed."""
    vae = build_vae(seed=2)
    (tmp_path / "vae").mkdir()
    torch.save({"state_dict": {f"vae.{n}": t for n, t in vae.state_dict().items()}},
               tmp_path / "vae" / "pytorch_model.pt")
    base = config_folder(tmp_path / "base", vae)
    result = cli(tmp_path / "vae" / "pytorch_model.pt", tmp_path / "out", "--component", "vae", "--base", base)
    assert result.exit_code == 0, result.stderr
    exported = load_file(tmp_path / "out" / WEIGHTS)
    assert set(exported) == set(vae.state_dict())
    assert all(torch.equal(exported[n], t) for n, t in vae.state_dict().items())  # the VAE stays fp32


def test_pipeline_folder_loads_and_renders(cli, tmp_path):
    from diffusers import HunyuanVideoPipeline

    base = tiny_pipeline("t2v")
    model = HunyuanVideoTransformer3DModel.from_pretrained(base / "transformer")
    original = release_file(tmp_path / "run", {n: t for n, t in written_back(
        cli, tmp_path, model, "t2v", "--dtype", "fp32").items()})
    result = cli(original, tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    index = json.loads((tmp_path / "out" / "model_index.json").read_text())
    assert index == json.loads((base / "model_index.json").read_text())
    scheduler = json.loads((tmp_path / "out" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "FlowMatchEulerDiscreteScheduler" and scheduler["shift"] == 7.0

    pipe = HunyuanVideoPipeline.from_pretrained(tmp_path / "out")
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    for name, tensor in pipe.transformer.state_dict().items():
        source = model.state_dict()[name]
        assert torch.equal(tensor, source.to(policy.target_dtype(name, source.dtype))), name
    pipe.transformer.to(torch.float32)
    frames = pipe("a cat playing guitar", height=32, width=32, num_frames=5, num_inference_steps=2,
                  prompt_template=TINY_PROMPT_TEMPLATE, max_sequence_length=8, output_type="np",
                  generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape == (1, 5, 32, 32, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())
    assert frames.std() > 0


@pytest.mark.parametrize("shape_class", ["i2v-33ch", "i2v-16ch"])
def test_image_to_video_pipeline_folders_load(shape_class, cli, tmp_path):
    from diffusers import HunyuanVideoImageToVideoPipeline

    base = tiny_pipeline(shape_class)
    model = HunyuanVideoTransformer3DModel.from_pretrained(base / "transformer")
    written_back(cli, tmp_path, model, shape_class, "--dtype", "fp32")
    result = cli("--model-type", "i2v", tmp_path / "original" / MODEL_STATES, tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    index = json.loads((tmp_path / "out" / "model_index.json").read_text())
    assert index == json.loads((base / "model_index.json").read_text())
    pipe = HunyuanVideoImageToVideoPipeline.from_pretrained(tmp_path / "out")
    assert pipe.transformer.config.image_condition_type == SHAPE_CLASSES[shape_class]["image_condition_type"]
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    for name, tensor in pipe.transformer.state_dict().items():
        source = model.state_dict()[name]
        assert torch.equal(tensor.float(), source.to(policy.target_dtype(name, source.dtype)).float()), name


def test_deepspeed_finetune_in_original_names_exports_the_fp32_masters(cli, tmp_path):
    run = finetune()
    base = config_folder(tmp_path / "base", build_tiny_transformer("t2v"))
    for case, extra, weights in (("masters", [], run.masters()), ("ema", ["--ema"], run.ema())):
        result = cli(run.checkpoint, tmp_path / case, "--base", base, "--dtype", "fp32", *extra)
        assert result.exit_code == 0, result.stderr
        exported = load_file(tmp_path / case / WEIGHTS)
        expected = diffusers_judge(weights)
        assert set(exported) == set(expected)
        assert all(torch.equal(exported[n], expected[n]) for n in expected), case
    assert any(not torch.equal(a, b) for a, b in zip(run.masters().values(), run.ema().values()))
    result = cli("verify", tmp_path / "masters", "--against", run.checkpoint)
    assert result.exit_code == 0, result.stdout + result.stderr


def test_precision_keeps_exactly_the_normalisation_weights_in_fp32(cli, tmp_path):
    """The fp32 set, derived from the Diffusers class itself (the parameters of its normalisation layers), is what
    the export keeps in fp32, and nothing else is."""
    from diffusers.models.normalization import RMSNorm

    model = build_tiny_transformer("t2v", seed=8)
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, RMSNorm)
    expected = {f"{module_name}.{name}" for module_name, module in model.named_modules() if isinstance(module, norms)
                for name, _ in module.named_parameters(recurse=False)}
    assert any("refiner_blocks" in n for n in expected) and any("norm_added_q" in n for n in expected)
    written_back(cli, tmp_path, model, "t2v", "--dtype", "fp32")
    result = cli(tmp_path / "original" / MODEL_STATES, tmp_path / "out", "--base", config_folder(tmp_path / "b", model))
    assert result.exit_code == 0, result.stderr
    exported = load_file(tmp_path / "out" / WEIGHTS)
    kept = {name for name, tensor in exported.items() if tensor.dtype == torch.float32}
    assert kept == expected
    assert {tensor.dtype for name, tensor in exported.items() if name not in expected} == {torch.bfloat16}


# -- bad input ---------------------------------------------------------------------------------------------------
def test_wrong_model_type(cli, tmp_path):
    config = tiny_config("i2v-33ch")
    source = release_file(tmp_path / "run", random_original_state_dict(config))
    base = config_folder(tmp_path / "base", build_tiny_transformer("i2v-33ch"))
    assert_refused(cli, tmp_path, ["--model-type", "t2v", source, tmp_path / "out", "--base", base],
                   "in_channels 33", "--model-type t2v")
    assert_refused(cli, tmp_path, ["--model-type", "flf2v", source, tmp_path / "out", "--base", base],
                   "not a HunyuanVideo task")
    # the 16-channel shapes fit t2v and i2v; an i2v claim against a T2V config is named
    t2v = release_file(tmp_path / "run" / "t2v", random_original_state_dict(tiny_config("t2v")))
    t2v_base = config_folder(tmp_path / "t2v-base", build_tiny_transformer("t2v"))
    assert_refused(cli, tmp_path, ["--model-type", "i2v", t2v, tmp_path / "out", "--base", t2v_base],
                   "--model-type i2v", "HunyuanVideo, a t2v model")


def test_base_of_another_family(cli, tmp_path):
    from cogvideox_fixtures import build_tiny_transformer as build_cogvideox

    source = release_file(tmp_path / "run", random_original_state_dict(tiny_config("t2v")))
    base = config_folder(tmp_path / "base", build_cogvideox("2b", num_layers=1))
    assert_refused(cli, tmp_path, [source, tmp_path / "out", "--base", base],
                   "holds a HunyuanVideo transformer, not a CogVideoX one")


def test_unknown_size_without_base(cli, tmp_path):
    source = release_file(tmp_path / "run", random_original_state_dict(tiny_config("t2v")))
    assert_refused(cli, tmp_path, [source, tmp_path / "out"], "hidden size 16", "not a published HunyuanVideo size",
                   "--base")


def test_base_of_the_other_image_to_video_form(cli, tmp_path):
    source = release_file(tmp_path / "run", random_original_state_dict(tiny_config("i2v-16ch")))
    base = config_folder(tmp_path / "base", build_tiny_transformer("i2v-33ch"))
    assert_refused(cli, tmp_path, ["--model-type", "i2v", source, tmp_path / "out", "--base", base],
                   "16 input channels", "has 33")


# -- variants and recognition at full size (meta tensors: nothing is allocated) --------------------------------------
def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


def full_size_original(**config) -> dict[str, LazyTensor]:
    return {name: LazyTensor(shape, torch.bfloat16, _never_read) for name, shape in original_shapes(config).items()}


@pytest.mark.parametrize("config, model_type, name, originals, tensors", [
    ({}, None, "HunyuanVideo", 856, 1264),
    ({}, "i2v", "HunyuanVideo-I2V", 856, 1264),
    ({"in_channels": 33, "guidance_embeds": False}, None, "HunyuanVideo-I2V-33ch", 852, 1260),
])
def test_published_variants_are_read_off_the_shapes(config, model_type, name, originals, tensors):
    source = full_size_original(**config)
    assert len(source) == originals
    transformer = plan_transformer(source, ExportOptions(model_type=model_type), "meta")
    variant = transformer.variant
    assert variant.name == name and transformer.published and transformer.label == name
    assert len(transformer.tensors) == tensors
    built = transformer.target.config
    assert built["image_condition_type"] == dict(FAMILY.variant_named(name).transformer).get("image_condition_type")
    assert (built["num_layers"], built["num_single_layers"], built["in_channels"]) == (20, 40, config.get("in_channels", 16))
    if name == "HunyuanVideo":  # the 16-channel I2V release has these shapes too: the user is told how to pick it
        assert any("HunyuanVideo-I2V" in note and "--model-type i2v" in note for note in transformer.notes)
    else:
        assert transformer.notes == []


def _keys_of_every_layout(family) -> dict[str, list[str]]:
    """Names in each of a family's layouts: its Diffusers classes' own, and its other tables run backwards."""
    found = {}
    for component in ("transformer", "vae"):
        if component not in family.components:  # a family that exports no VAE of its own (Wan-Animate-2)
            continue
        spec = family.components[component]
        target = build_target(spec.class_name, family.component_config(component, family.variants[0]))
        for name in spec.tables:
            if not name.startswith(f"{family.key}/"):  # another family's table it shares (Kandinsky 5's VAE)
                continue
            keys = translate_shapes(load_table(name).inverted(), target.schema, target.counts)
            found[name] = [*keys]
    return found


def test_tables_never_match_another_familys_keys():
    ours = _keys_of_every_layout(FAMILY)
    ours["hunyuanvideo/original_transformer (fixtures)"] = list(original_shapes({}))
    ours["hunyuanvideo/original_transformer (33ch)"] = list(original_shapes({"in_channels": 33,
                                                                             "guidance_embeds": False}))
    for other in families():
        if other.key == FAMILY.key:
            continue
        theirs = _keys_of_every_layout(other)
        for name, keys in theirs.items():
            assert len(keys) > 50, name
            assert fitting_tables(keys, component_tables("transformer", FAMILY) + component_tables("vae", FAMILY)) \
                == [], name
        for name, keys in ours.items():  # a family that shares our table (Kandinsky 5's VAE) fits it, no other
            found = fitting_tables(keys, component_tables("transformer", other) + component_tables("vae", other))
            assert [table.name for _, table in found if table.name != name.split(" ")[0]] == [], (name, other.name)
    for name, keys in ours.items():  # and each of ours is recognised by its own table alone
        fitting = fitting_tables(keys, component_tables("transformer") + component_tables("vae"))
        assert {table.name for _, table in fitting} == {name.split(" ")[0]}, name
