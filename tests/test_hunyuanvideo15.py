"""HunyuanVideo 1.5: judged by the original-code fixture (Tencent's HunyuanVideo_1_5_DiffusionTransformer at a tiny
size, written by its own save_pretrained, and the state dict Diffusers' repository conversion script made of it), and
for the shapes the fixture lacks (MeanFlow, other depths, the VAE) by the script's facts written out in
scripts/hunyuanvideo15_tiny.py, which the fixture checks first. Both directions, release folders with their
config.json, pipelines that render, DeepSpeed and DCP fine-tunes, variants at full size."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refused, assert_same_tensors, snapshot
from diffusers import HunyuanVideo15Transformer3DModel
from hunyuanvideo15_fixtures import (FIXTURE_RELEASE, FIXTURE_TRUTH, MODEL_TYPE, ORIGINAL_CODE, SHAPE_CLASSES,
                                     original_code,
                                     WEIGHTS, build_tiny_transformer, build_vae, config_folder, dcp_finetune,
                                     deepspeed_finetune, original_shapes, original_vae_state_dict,
                                     random_original_state_dict, reference_to_diffusers, reference_vae_to_diffusers,
                                     release_folder, tiny_config, tiny_pipeline, tiny_text_settings)
from safetensors.torch import load_file, save_file

from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.keymap.plan import translate_shapes
from cogexport.keymap.table import load_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables
from cogexport.models.target import build_target
from cogexport.precision import PrecisionPolicy

FAMILY = family_named("hunyuanvideo15")


def config_of(path) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "_diffusers_version"}


def written_back(cli, tmp_path, model, *extra) -> dict[str, torch.Tensor]:
    """``cogexport --to original`` of ``model``'s save_pretrained folder; the tensors of the file it writes."""
    model.save_pretrained(tmp_path / "diffusers")
    result = cli(tmp_path / "diffusers", tmp_path / "original", "--to", "original", *extra)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md", "config.json", WEIGHTS]
    return load_file(tmp_path / "original" / WEIGHTS)


# -- the original-code fixture -----------------------------------------------------------------------------------
def test_the_judges_helpers_agree_with_the_original_code():
    """The original names and the script's conversion written out in hunyuanvideo15_tiny are exactly what Tencent's
    class saved and what Diffusers' script made of it."""
    original_code()
    original = load_file(FIXTURE_RELEASE / WEIGHTS)
    config = {k: v for k, v in config_of(FIXTURE_TRUTH / "config.json").items() if not k.startswith("_")}
    assert {n: t.shape for n, t in original.items()} == original_shapes(config)
    assert_same_tensors(reference_to_diffusers(original), load_file(FIXTURE_TRUTH / "ground_truth.safetensors"))


@pytest.mark.parametrize("with_base", [False, True])
def test_the_release_folder_exports_to_the_scripts_ground_truth(with_base, cli, tmp_path):
    """The release's transformer/480p_t2v/ folder (weights and config.json): without --base its config.json gives the
    config the script's save_pretrained wrote, with --base the same; the tensors are the script's, to the bit."""
    before = snapshot(original_code())
    extra = ["--base", FIXTURE_TRUTH] if with_base else []
    result = cli(FIXTURE_RELEASE, tmp_path / "out", "--dtype", "fp32", *extra)
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), load_file(FIXTURE_TRUTH / "ground_truth.safetensors"))
    assert config_of(tmp_path / "out" / "config.json") == config_of(FIXTURE_TRUTH / "config.json")
    assert snapshot(ORIGINAL_CODE) == before


def test_the_exported_model_reproduces_the_original_models_outputs(cli, tmp_path):
    """The exported folder, loaded by Diffusers, computes what the original class computed (T2V and I2V inputs):
    exactly what the Diffusers model with the conversion script's weights computes, and the original class's recorded
    output up to float32 rounding (the fixture's README: 7e-07 with the Diffusers of its day; 8.5e-06 with Diffusers
    0.42's kernels, the same for the script's weights: a library's summation order, not a weight)."""
    result = cli(original_code() / "original" / "transformer" / "480p_t2v", tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    model = HunyuanVideo15Transformer3DModel.from_pretrained(tmp_path / "out").eval()
    judge = HunyuanVideo15Transformer3DModel.from_pretrained(tmp_path / "out").eval()
    judge.load_state_dict(load_file(FIXTURE_TRUTH / "ground_truth.safetensors"))
    io = load_file(ORIGINAL_CODE / "reference_io.safetensors")
    for case in ("t2v", "i2v"):
        def given(name):
            return io[f"{case}.{name}"]
        inputs = dict(hidden_states=given("x"), timestep=given("t"), encoder_hidden_states=given("text_states"),
                      encoder_attention_mask=given("text_mask"), encoder_hidden_states_2=given("byt5_text_states"),
                      encoder_attention_mask_2=given("byt5_text_mask"), image_embeds=given("vision_states"),
                      return_dict=False)
        with torch.no_grad():
            out, expected = model(**inputs)[0], judge(**inputs)[0]
        assert torch.equal(out, expected), case
        assert torch.allclose(out, given("original_output"), atol=2e-5, rtol=0), case


def test_the_way_back_is_the_original_codes_own_save_byte_for_byte(cli, tmp_path):
    """Diffusers' weights written back in the original layout are the file Tencent's class saved, byte for byte, and
    the config.json its save_pretrained wrote (the Diffusers version aside)."""
    original_code()
    model = HunyuanVideo15Transformer3DModel.from_config(json.loads((FIXTURE_TRUTH / "config.json").read_text()))
    model.load_state_dict(load_file(FIXTURE_TRUTH / "ground_truth.safetensors"))
    written_back(cli, tmp_path, model, "--dtype", "fp32")
    assert (tmp_path / "original" / WEIGHTS).read_bytes() == (FIXTURE_RELEASE / WEIGHTS).read_bytes()
    assert config_of(tmp_path / "original" / "config.json") == config_of(FIXTURE_RELEASE / "config.json")


# -- every shape class, judged by the script's facts --------------------------------------------------------------
@pytest.mark.parametrize("shape_class", SHAPE_CLASSES)
def test_way_back_is_what_the_script_converts_to_the_exact_tensors(shape_class, cli, tmp_path):
    model = build_tiny_transformer(shape_class, seed=3)
    original = written_back(cli, tmp_path, model, "--dtype", "fp32", "--model-type", MODEL_TYPE[shape_class])
    assert {n: t.shape for n, t in original.items()} == original_shapes(dict(model.config))
    assert_same_tensors(reference_to_diffusers(original), model.state_dict())
    config = json.loads((tmp_path / "original" / "config.json").read_text())
    assert (config["ideal_task"], config["use_meanflow"]) == (MODEL_TYPE[shape_class], shape_class == "meanflow")


@pytest.mark.parametrize("shape_class", SHAPE_CLASSES)
@pytest.mark.parametrize("max_shard_size", ["5GB", "40kB"])
def test_forward_export_of_a_release_folder_is_save_pretrained_byte_for_byte(shape_class, max_shard_size, cli,
                                                                             tmp_path):
    model = build_tiny_transformer(shape_class, seed=5)
    config = dict(model.config)
    release = release_folder(tmp_path / "release", random_original_state_dict(config, seed=5), config)
    expected = reference_to_diffusers(load_file(release / WEIGHTS))
    base = config_folder(tmp_path / "base", model)
    result = cli(release, tmp_path / "ours", "--base", base, "--max-shard-size", max_shard_size)
    assert result.exit_code == 0, result.stderr
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    reference = HunyuanVideo15Transformer3DModel.from_config(config)
    reference.load_state_dict({n: t.to(policy.target_dtype(n, t.dtype)) for n, t in expected.items()}, assign=True)
    reference.save_pretrained(tmp_path / "theirs", max_shard_size=max_shard_size)
    ours = sorted(p.name for p in (tmp_path / "ours").iterdir() if p.name != "README.md")  # (the model card)
    assert ours == sorted(p.name for p in (tmp_path / "theirs").iterdir())
    assert len(ours) == 2 if max_shard_size == "5GB" else len(ours) > 3
    for name in ours:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name


def test_precision_keeps_exactly_the_normalisation_weights_in_fp32(cli, tmp_path):
    """The fp32 set, derived from the Diffusers class itself (the parameters of its normalisation layers), is what
    the export keeps in fp32, and nothing else is."""
    model = build_tiny_transformer("t2v", seed=8)
    norms = (torch.nn.LayerNorm, torch.nn.RMSNorm, *_diffusers_norms())
    expected = {f"{module_name}.{name}" for module_name, module in model.named_modules() if isinstance(module, norms)
                for name, _ in module.named_parameters(recurse=False)}
    assert any("context_embedder_2.norm" in n for n in expected) and any("norm_added_q" in n for n in expected)
    written_back(cli, tmp_path, model, "--dtype", "fp32")
    result = cli(tmp_path / "original", tmp_path / "out", "--base", config_folder(tmp_path / "b", model))
    assert result.exit_code == 0, result.stderr
    exported = load_file(tmp_path / "out" / WEIGHTS)
    assert {name for name, tensor in exported.items() if tensor.dtype == torch.float32} == expected
    assert {tensor.dtype for name, tensor in exported.items() if name not in expected} == {torch.bfloat16}


def _diffusers_norms() -> tuple:
    from diffusers.models.normalization import RMSNorm

    return (RMSNorm,)


# -- the VAE -------------------------------------------------------------------------------------------------------
def test_release_vae_to_diffusers_and_back(cli, tmp_path):
    """vae/diffusion_pytorch_model.safetensors in the release's names: the script's conversion, to the bit; written
    back, the same file's tensors."""
    vae = build_vae(seed=2)
    original = original_vae_state_dict(vae)
    (tmp_path / "release" / "vae").mkdir(parents=True)
    save_file(original, tmp_path / "release" / "vae" / WEIGHTS)
    base = config_folder(tmp_path / "base", vae)
    result = cli(tmp_path / "release" / "vae", tmp_path / "out", "--component", "vae", "--base", base)
    assert result.exit_code == 0, result.stderr
    exported = load_file(tmp_path / "out" / WEIGHTS)
    assert_same_tensors(exported, reference_vae_to_diffusers(original, dict(vae.config)))  # the VAE stays fp32
    assert_same_tensors(exported, vae.state_dict())
    result = cli(tmp_path / "out", tmp_path / "back", "--to", "original", "--component", "vae")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == ["README.md", WEIGHTS]
    assert_same_tensors(load_file(tmp_path / "back" / WEIGHTS), original)


# -- pipelines -----------------------------------------------------------------------------------------------------
def _render(pipe, image=None):
    tiny_text_settings(pipe)
    arguments = dict(prompt="a cat playing guitar", num_frames=5, num_inference_steps=2, output_type="np",
                     generator=torch.Generator().manual_seed(0))
    if image is None:
        arguments.update(height=32, width=32)
    else:
        arguments["image"] = image
    return pipe(**arguments).frames


def test_t2v_pipeline_folder_loads_and_renders(cli, tmp_path):
    from diffusers import HunyuanVideo15Pipeline

    base = tiny_pipeline("t2v")
    model = HunyuanVideo15Transformer3DModel.from_pretrained(base / "transformer")
    written_back(cli, tmp_path, model, "--dtype", "fp32")
    result = cli(tmp_path / "original", tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "model_index.json").read_text()) == \
        json.loads((base / "model_index.json").read_text())
    scheduler = json.loads((tmp_path / "out" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "FlowMatchEulerDiscreteScheduler" and scheduler["shift"] == 5.0
    pipe = HunyuanVideo15Pipeline.from_pretrained(tmp_path / "out")
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    for name, tensor in pipe.transformer.state_dict().items():
        source = model.state_dict()[name]
        assert torch.equal(tensor, source.to(policy.target_dtype(name, source.dtype))), name
    assert pipe.guider.guidance_scale == 6.0
    pipe.transformer.to(torch.float32)
    frames = _render(pipe)
    assert frames.shape == (1, 5, 32, 32, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())
    assert frames.std() > 0


def test_step_distilled_i2v_pipeline_folder_loads_and_renders(cli, tmp_path):
    """The MeanFlow model: its second timestep embedder written back and forth, the I2V pipeline (SigLIP image
    encoder and feature extractor from --base) with the step-distilled variant's shift 7.0."""
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from render_pipeline import gradient_image

    base = tiny_pipeline("meanflow")
    model = HunyuanVideo15Transformer3DModel.from_pretrained(base / "transformer")
    written_back(cli, tmp_path, model, "--dtype", "fp32")
    result = cli(tmp_path / "original", tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "model_index.json").read_text()) == \
        json.loads((base / "model_index.json").read_text())
    scheduler = json.loads((tmp_path / "out" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["shift"] == 7.0
    pipe = HunyuanVideo15ImageToVideoPipeline.from_pretrained(tmp_path / "out")
    assert_same_tensors(pipe.transformer.state_dict(), model.state_dict())
    frames = _render(pipe, gradient_image(32, 32))
    assert frames.shape[:2] == (1, 5) and bool(torch.isfinite(torch.from_numpy(frames)).all()) and frames.std() > 0


# -- fine-tunes ------------------------------------------------------------------------------------------------------
def test_deepspeed_finetune_in_original_names_exports_the_fp32_masters(cli, tmp_path):
    run = deepspeed_finetune()
    base = config_folder(tmp_path / "base", build_tiny_transformer("t2v"))
    result = cli(run.checkpoint, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), reference_to_diffusers(run.masters()))
    result = cli("verify", tmp_path / "out", "--against", run.checkpoint)
    assert result.exit_code == 0, result.stdout + result.stderr


def test_dcp_finetune_in_diffusers_names_exports_exactly(cli, tmp_path):
    run = dcp_finetune()
    base = config_folder(tmp_path / "base", build_tiny_transformer("t2v"))
    result = cli(run.root / "run" / "checkpoint", tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), {n: run.tensors[n] for n in run.truth["order"]})
    result = cli(run.root / "run" / "checkpoint", tmp_path / "bf16", "--base", base)
    assert result.exit_code == 0, result.stderr
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    assert_same_tensors(load_file(tmp_path / "bf16" / WEIGHTS),
                        {n: t.to(policy.target_dtype(n, t.dtype)) for n, t in run.tensors.items()})


# -- bad input -------------------------------------------------------------------------------------------------------
def test_meanflow_model_is_no_t2v_model(cli, tmp_path):
    config = tiny_config("meanflow")
    source = release_folder(tmp_path / "run", random_original_state_dict(config))
    base = config_folder(tmp_path / "base", build_tiny_transformer("meanflow"))
    assert_refused(cli, tmp_path, ["--model-type", "t2v", source, tmp_path / "out", "--base", base],
                   "--model-type t2v")
    plain = config_folder(tmp_path / "plain-base", build_tiny_transformer("i2v"))
    assert_refused(cli, tmp_path, [source, tmp_path / "out", "--base", plain], "time_r_in", "use_meanflow False")


def test_original_keys_the_diffusers_class_cannot_hold_are_refused(cli, tmp_path):
    """A guidance embedder (guidance_embed, false in every release) has no place in HunyuanVideo15Transformer3DModel:
    refused by name, by the weights and by the config.json beside them, never dropped."""
    config = dict(build_tiny_transformer("t2v").config)
    weights = random_original_state_dict(config)
    guided = {**weights, "guidance_in.mlp.0.weight": torch.zeros(32, 256), "guidance_in.mlp.0.bias": torch.zeros(32)}
    base = config_folder(tmp_path / "base", build_tiny_transformer("t2v"))
    source = release_folder(tmp_path / "guided", guided)
    assert_refused(cli, tmp_path, [source, tmp_path / "out", "--base", base], "guidance_in.mlp.0")
    described = release_folder(tmp_path / "described", weights, config)
    original = json.loads((described / "config.json").read_text())
    (described / "config.json").write_text(json.dumps({**original, "guidance_embed": True}))
    assert_refused(cli, tmp_path, [described, tmp_path / "out"], "guidance_embed True", "config.json")


def test_base_of_another_family_and_unknown_size(cli, tmp_path):
    from hunyuanvideo_fixtures import build_tiny_transformer as build_hunyuanvideo

    source = release_folder(tmp_path / "run", random_original_state_dict(tiny_config("t2v")))
    base = config_folder(tmp_path / "base", build_hunyuanvideo("t2v"))
    assert_refused(cli, tmp_path, [source, tmp_path / "out", "--base", base],
                   "holds a HunyuanVideo 1.5 transformer, not a HunyuanVideo one")
    assert_refused(cli, tmp_path, [source, tmp_path / "out"], "hidden size 32",
                   "not a published HunyuanVideo 1.5 size", "--base")


# -- variants and recognition at full size (meta tensors: nothing is allocated) --------------------------------------
def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


def full_size_original(**config) -> dict[str, LazyTensor]:
    return {name: LazyTensor(shape, torch.bfloat16, _never_read) for name, shape in original_shapes(config).items()}


@pytest.mark.parametrize("config, options, name, originals, tensors", [
    ({}, {}, "HunyuanVideo-1.5-480p_t2v", 1793, 1801),
    ({}, {"model_type": "i2v"}, "HunyuanVideo-1.5-480p_i2v", 1793, 1801),
    ({}, {"model_name": "HunyuanVideo-1.5-720p_i2v_distilled"}, "HunyuanVideo-1.5-720p_i2v_distilled", 1793, 1801),
    ({"use_meanflow": True}, {}, "HunyuanVideo-1.5-480p_i2v_step_distilled", 1797, 1805),
])
def test_published_variants_are_read_off_the_shapes(config, options, name, originals, tensors):
    source = full_size_original(**config)
    assert len(source) == originals
    transformer = plan_transformer(source, ExportOptions(**options), "meta")
    assert transformer.variant.name == name and transformer.label == name
    assert len(transformer.tensors) == tensors
    built = dict(transformer.target.config)
    published = FAMILY.transformer_config(FAMILY.variant_named(name))
    assert {k: built[k] for k in ("target_size", "task_type", "use_meanflow", "num_layers", "in_channels")} == \
        {k: published[k] for k in ("target_size", "task_type", "use_meanflow", "num_layers", "in_channels")}
    if name == "HunyuanVideo-1.5-480p_t2v":  # the I2V releases have these shapes too: the user is told how to pick
        assert any("--model-type i2v" in note for note in transformer.notes)


def test_a_release_folders_config_names_its_variant(tmp_path):
    """The 720p I2V release's config.json (ideal_resolution 720p, ideal_task i2v) makes it that variant, its
    scheduler shift 7.0, without --base."""
    from cogexport.models.hunyuanvideo15 import original_config

    published = FAMILY.transformer_config(FAMILY.variant_named("HunyuanVideo-1.5-720p_i2v"))
    folder = tmp_path / "720p_i2v"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(original_config(published, "i2v")))
    source = full_size_original()
    transformer = plan_transformer(source, ExportOptions(), "meta", folders=[folder])
    assert transformer.variant.name == "HunyuanVideo-1.5-720p_i2v" and transformer.published
    assert FAMILY.scheduler_for(transformer.variant)["shift"] == 7.0
    assert dict(transformer.target.config)["target_size"] == 960


def _keys_of_every_layout(family) -> dict[str, list[str]]:
    """Names in each of a family's layouts: its Diffusers classes' own, and its other tables run backwards."""
    found = {}
    for spec in family.components.values():
        target = build_target(spec.class_name, family.component_config(spec.component, family.variants[0]))
        for name in spec.tables:
            found[name] = list(translate_shapes(load_table(name).inverted(), target.schema, target.counts))
    return found


# Other families' tables whose signatures are loose enough to take HunyuanVideo 1.5's VAE names too (Wan's Diffusers
# VAE: any VAE with decoder.norm_out.gamma; CogVideoX's SAT VAE: any LDM-style encoder.down.*): choose_table settles
# them by which class has the translated names.
LOOSE = {"wan/diffusers_vae", "cogvideox/sat_vae"}


def test_tables_never_match_another_familys_keys():
    """No table of ours takes another family's names; another family's takes ours only where its signature is loose
    (LOOSE), and then the recognition picks ours, without --base."""
    from cogexport.models.recognize import choose_table

    ours = _keys_of_every_layout(FAMILY)
    for other in families():
        if other.key == FAMILY.key:
            continue
        for name, keys in _keys_of_every_layout(other).items():
            assert fitting_tables(keys, component_tables("transformer", FAMILY) + component_tables("vae", FAMILY)) \
                == [], name
        for name, keys in ours.items():
            found = fitting_tables(keys, component_tables("transformer", other) + component_tables("vae", other))
            assert {table.name for _, table in found} <= LOOSE, (name, other.name)
    for name, keys in ours.items():  # each of ours is recognised by its own family's table alone
        fitting = fitting_tables(keys, component_tables("transformer", FAMILY) + component_tables("vae", FAMILY))
        assert [table.name for _, table in fitting] == [name], name
        component = "vae" if "vae" in name else "transformer"
        shapes = {key: LazyTensor(torch.Size([1]), torch.float32, _never_read) for key in keys}
        family, table = choose_table(shapes, component, component, "test")
        assert (family.key, table.name) == (FAMILY.key, name)
