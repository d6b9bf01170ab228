"""Kandinsky 5: the release's single file holds the kandinsky-5 repo's state dict, whose names are Diffusers' own (the
tiny models check it against the repo's module tree, written out in scripts/kandinsky5_tiny.py); the work is
recognition (Lite or Pro, from the shapes), the published configs, pipelines that render, DeepSpeed and DCP
fine-tunes, and the precision policy."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refused, assert_same_tensors, snapshot
from diffusers import Kandinsky5Transformer3DModel
from kandinsky5_fixtures import (MODEL_TYPE, SHAPE_CLASSES, build_tiny_transformer, config_folder, dcp_finetune,
                                 deepspeed_finetune, original_shapes, release_file, tiny_pipeline, tiny_text_settings)
from safetensors.torch import load_file

from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.lazy import LazyTensor
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables
from cogexport.models.target import build_target
from cogexport.precision import PrecisionPolicy

FAMILY = family_named("kandinsky5")
WEIGHTS = "diffusion_pytorch_model.safetensors"


def policy_of(dtype: str = "bf16") -> PrecisionPolicy:
    return PrecisionPolicy.build(dtype, FAMILY.transformer.keep_fp32, [])


@pytest.mark.parametrize("shape_class", SHAPE_CLASSES)
def test_the_release_names_are_diffusers_names(shape_class):
    """The kandinsky-5 repo's DiffusionTransformer3D names and shapes (written out from its module tree) are exactly
    Diffusers' Kandinsky5Transformer3DModel's, at every tiny shape class and at the published sizes."""
    model = build_tiny_transformer(shape_class)
    assert {n: t.shape for n, t in model.state_dict().items()} == original_shapes(dict(model.config))
    for name in ("Kandinsky-5.0-T2V-Lite-sft-5s", "Kandinsky-5.0-T2V-Pro-sft-5s"):
        config = FAMILY.transformer_config(FAMILY.variant_named(name))
        assert build_target(FAMILY.transformer.class_name, config).schema == original_shapes(config), name


@pytest.mark.parametrize("shape_class", SHAPE_CLASSES)
@pytest.mark.parametrize("max_shard_size", ["5GB", "40kB"])
def test_release_file_exports_as_save_pretrained_byte_for_byte(shape_class, max_shard_size, cli, tmp_path):
    """model/<name>.safetensors to a Diffusers folder: save_pretrained of the same weights in the family's dtype
    policy (the class's own fp32 modules and the norms kept fp32), byte for byte, single file and sharded."""
    model = build_tiny_transformer(shape_class, seed=5)
    release = release_file(tmp_path / "release", model.state_dict())
    before = snapshot(release.parent)
    base = config_folder(tmp_path / "base", model)
    result = cli("--model-type", MODEL_TYPE[shape_class], release, tmp_path / "ours", "--base", base,
                 "--max-shard-size", max_shard_size)
    assert result.exit_code == 0, result.stderr
    reference = Kandinsky5Transformer3DModel.from_config(model.config)
    policy = policy_of()
    reference.load_state_dict({n: t.to(policy.target_dtype(n, t.dtype)) for n, t in model.state_dict().items()},
                              assign=True)
    reference.save_pretrained(tmp_path / "theirs", max_shard_size=max_shard_size)
    ours = sorted(p.name for p in (tmp_path / "ours").iterdir() if p.name != "README.md")  # (the model card)
    assert ours == sorted(p.name for p in (tmp_path / "theirs").iterdir())
    for name in ours:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name
    assert snapshot(release.parent) == before


def test_diffusers_own_bf16_load_keeps_what_we_keep(tmp_path):
    """Kandinsky5Transformer3DModel.from_pretrained(torch_dtype=bf16) keeps its _keep_in_fp32_modules in fp32; the
    family's fp32 set is those and the normalisation weights (the q/k RMSNorms, the text embeddings' LayerNorms)."""
    from diffusers.models.normalization import RMSNorm

    model = build_tiny_transformer("t2v", seed=2)
    model.save_pretrained(tmp_path / "fp32")
    loaded = Kandinsky5Transformer3DModel.from_pretrained(tmp_path / "fp32", torch_dtype=torch.bfloat16)
    theirs = {n for n, t in loaded.state_dict().items() if t.dtype == torch.float32}
    norms = (torch.nn.LayerNorm, torch.nn.RMSNorm, RMSNorm)
    norm_weights = {f"{m}.{p}" for m, module in model.named_modules() if isinstance(module, norms)
                    for p, _ in module.named_parameters(recurse=False)}
    policy = policy_of()
    ours = {n for n, t in model.state_dict().items() if policy.target_dtype(n, t.dtype) == torch.float32}
    assert theirs and norm_weights and ours == theirs | norm_weights


def test_t2v_pipeline_folder_loads_and_renders(cli, tmp_path):
    from diffusers import Kandinsky5T2VPipeline

    base = tiny_pipeline("t2v")
    model = Kandinsky5Transformer3DModel.from_pretrained(base / "transformer")
    release = release_file(tmp_path / "release", model.state_dict())
    result = cli(release, tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "model_index.json").read_text()) == \
        json.loads((base / "model_index.json").read_text())
    scheduler = json.loads((tmp_path / "out" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "FlowMatchEulerDiscreteScheduler" and scheduler["shift"] == 5.0
    pipe = Kandinsky5T2VPipeline.from_pretrained(tmp_path / "out")
    policy = policy_of()
    for name, tensor in pipe.transformer.state_dict().items():
        source = model.state_dict()[name]
        assert torch.equal(tensor, source.to(policy.target_dtype(name, source.dtype))), name
    pipe.transformer.to(torch.float32)
    tiny_text_settings(pipe)
    frames = pipe("a cat playing guitar", height=32, width=32, num_frames=5, num_inference_steps=2, output_type="np",
                  generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape == (1, 5, 32, 32, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())
    assert frames.std() > 0


def test_i2v_pipeline_folder_loads_and_renders(cli, tmp_path):
    from diffusers import Kandinsky5I2VPipeline
    from render_pipeline import gradient_image

    base = tiny_pipeline("i2v")
    model = Kandinsky5Transformer3DModel.from_pretrained(base / "transformer")
    result = cli("--model-type", "i2v", release_file(tmp_path / "release", model.state_dict()), tmp_path / "out",
                 "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "model_index.json").read_text())["_class_name"] == "Kandinsky5I2VPipeline"
    pipe = Kandinsky5I2VPipeline.from_pretrained(tmp_path / "out")
    assert_same_tensors(pipe.transformer.state_dict(), model.state_dict())
    tiny_text_settings(pipe)
    # 25 frames: 7 latent frames; the pipeline normalises the first 4 against the ones after them (none: a NaN std)
    frames = pipe(image=gradient_image(32, 32), prompt="a cat playing guitar", height=32, width=32, num_frames=25,
                  num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape[:2] == (1, 25) and bool(torch.isfinite(torch.from_numpy(frames)).all()) and frames.std() > 0


# -- fine-tunes ------------------------------------------------------------------------------------------------------
def test_deepspeed_finetune_exports_the_fp32_masters(cli, tmp_path):
    run = deepspeed_finetune()
    base = config_folder(tmp_path / "base", build_tiny_transformer("t2v"))
    result = cli(run.checkpoint, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), run.masters())
    result = cli("verify", tmp_path / "out", "--against", run.checkpoint)
    assert result.exit_code == 0, result.stdout + result.stderr
    result = cli("inspect", run.checkpoint)  # its blocks as the family counts them (it used to say "None layers")
    assert result.exit_code == 0, result.stderr
    assert "2 text and 2 visual blocks" in result.stdout and "None" not in result.stdout, result.stdout


def test_dcp_finetune_exports_exactly(cli, tmp_path):
    run = dcp_finetune()
    base = config_folder(tmp_path / "base", build_tiny_transformer("t2v"))
    result = cli(run.root / "run" / "checkpoint", tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS),
                        {n: t.to(policy_of().target_dtype(n, t.dtype)) for n, t in run.tensors.items()})


# -- bad input -------------------------------------------------------------------------------------------------------
def test_bad_kandinsky5_input(cli, tmp_path):
    model = build_tiny_transformer("t2v")
    release = release_file(tmp_path / "release", model.state_dict())
    plain = config_folder(tmp_path / "plain", build_tiny_transformer("plain"))
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--base", plain], "takes condition channels",
                   "visual_cond False")
    assert_refused(cli, tmp_path, [release, tmp_path / "out"], "model_dim 32", "not a published Kandinsky 5 size",
                   "--base")
    plain_release = release_file(tmp_path / "plain-release", build_tiny_transformer("plain").state_dict())
    assert_refused(cli, tmp_path, ["--model-type", "i2v", plain_release, tmp_path / "out", "--base", plain],
                   "--model-type i2v")
    truncated = dict(model.state_dict())
    del truncated["visual_transformer_blocks.1.cross_attention.to_key.weight"]
    broken = release_file(tmp_path / "broken", truncated)
    assert_refused(cli, tmp_path, [broken, tmp_path / "out", "--base", config_folder(tmp_path / "b", model)],
                   "visual_transformer_blocks.1.cross_attention.to_key.weight")


# -- variants at full size (meta tensors: nothing is allocated) ------------------------------------------------------
def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


def full_size(variant: str) -> dict[str, LazyTensor]:
    config = FAMILY.transformer_config(FAMILY.variant_named(variant))
    return {name: LazyTensor(shape, torch.bfloat16, _never_read) for name, shape in original_shapes(config).items()}


@pytest.mark.parametrize("shapes_of, options, name, tensors", [
    ("Kandinsky-5.0-T2V-Lite-sft-5s", {}, "Kandinsky-5.0-T2V-Lite-sft-5s", 814),
    ("Kandinsky-5.0-T2V-Lite-sft-5s", {"model_name": "Kandinsky-5.0-T2V-Lite-distilled16steps-10s"},
     "Kandinsky-5.0-T2V-Lite-distilled16steps-10s", 814),
    ("Kandinsky-5.0-T2V-Pro-sft-5s", {}, "Kandinsky-5.0-T2V-Pro-sft-5s", 1514),
    ("Kandinsky-5.0-T2V-Pro-sft-5s", {"model_type": "i2v"}, "Kandinsky-5.0-I2V-Pro-sft-5s", 1514),
])
def test_published_variants_are_read_off_the_shapes(shapes_of, options, name, tensors):
    transformer = plan_transformer(full_size(shapes_of), ExportOptions(**options), "meta")
    assert transformer.variant.name == name and transformer.published and transformer.label == name
    assert len(transformer.tensors) == tensors
    built = dict(transformer.target.config)
    published = FAMILY.transformer_config(FAMILY.variant_named(name))
    assert json.loads(json.dumps({k: built[k] for k in published})) == json.loads(json.dumps(published))


def test_tables_never_match_another_familys_keys():
    """Kandinsky 5's names fit no other family's table and its table takes no other family's names."""
    ours = list(original_shapes(FAMILY.transformer_config(FAMILY.variants[0])))
    for other in families():
        if other.key == FAMILY.key:
            continue
        assert fitting_tables(ours, component_tables("transformer", other)) == [], other.name
        target = build_target(other.transformer.class_name, other.transformer_config(other.variants[0]))
        assert fitting_tables(list(target.schema), component_tables("transformer", FAMILY)) == [], other.name
