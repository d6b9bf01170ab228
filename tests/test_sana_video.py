"""SanaVideo: NVlabs' release file (SANA_Video_2B_480p.pth, a torch.save of {"state_dict": SanaMSVideo's state dict},
and a safetensors copy of that state dict) into Diffusers' SanaVideoTransformer3DModel, judged by an independent writer
of the layout (scripts/make_tiny_sana_video.py) and, where its source is at hand, by Diffusers' own conversion script
run at toy size (scripts/sana_video_judge.py); the tensors Diffusers has no place for kept beside and given back by
--to original; the Diffusers folder as input; a DCP fine-tune; the published variant from full-size shapes; bad
input."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from conftest import assert_refused, assert_same_tensors
from diffusers import SanaVideoTransformer3DModel
from fixtures import SCRIPTS
from safetensors.torch import load_file
from sana_video_fixtures import (RELEASE, build_tiny_pipeline, build_transformer, dcp_finetune, deepspeed_finetune,
                                 forward_inputs, release_buffers, release_state_dict, write_release)

from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.keymap.plan import translate_shapes
from cogexport.keymap.table import load_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables
from cogexport.models.target import build_target
from cogexport.precision import PrecisionPolicy

FAMILY = family_named("sana_video")
WEIGHTS = "diffusion_pytorch_model.safetensors"
BUFFERS = "original_buffers.safetensors"
# huggingface/diffusers' scripts folder (a clone): its convert_sana_video_to_diffusers.py is the layout's judge
DIFFUSERS_SCRIPTS = os.environ.get("COGEXPORT_DIFFUSERS_SCRIPTS")


def load_release(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model (seed 3), its save_pretrained folder in fp32 (the --base config and the truth) and the
    release files written from it."""
    folder = tmp_path_factory.mktemp("sana-video")
    model = build_transformer(seed=3)
    model.save_pretrained(folder / "diffusers")
    return {"model": model, "base": folder / "diffusers", **write_release(folder / "release", model)}


@pytest.mark.parametrize("kind", ["pth", "safetensors"])
def test_release_exports_exactly_and_keeps_what_diffusers_drops(tiny, cli, tmp_path, kind):
    """Either release file in fp32: save_pretrained's own files byte for byte (config included), the forward of the
    exported model equal to the source's to the bit, and every tensor Diffusers' class has no place for kept as it was
    beside the model."""
    result = cli(tiny[kind], tmp_path / "out", "--base", tiny["base"], "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    for path in tiny["base"].iterdir():
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes(), path.name
    assert_same_tensors(load_file(tmp_path / "out" / BUFFERS), release_buffers(dict(tiny["model"].config)))
    assert "the learned null caption" in result.stdout
    exported = SanaVideoTransformer3DModel.from_pretrained(tmp_path / "out").eval()
    inputs = forward_inputs(tiny["model"])
    with torch.no_grad():
        assert torch.equal(exported(**inputs).sample, tiny["model"](**inputs).sample)


def test_to_original_gives_the_release_state_dict_back(tiny, cli, tmp_path):
    """.pth -> Diffusers -> --to original: a torch.save of {"state_dict": ...} that torch.load reads back to every
    tensor of the release under its name, in its dtype, to the bit (q, k, v fused again; the buffers kept beside
    written back). Not byte for byte: the pickle's key order is the Diffusers model's, not SanaMSVideo's."""
    assert cli(tiny["pth"], tmp_path / "diffusers", "--base", tiny["base"], "--dtype", "fp32").exit_code == 0
    result = cli("--to", "original", tmp_path / "diffusers", tmp_path / "back", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = torch.load(tmp_path / "back" / RELEASE, map_location="cpu", weights_only=True)
    assert list(written) == ["state_dict"]
    assert_same_tensors(written["state_dict"], load_release(tiny["pth"]))
    verified = cli("verify", tmp_path / "back", "--against", tmp_path / "diffusers")
    assert verified.exit_code == 0, verified.stdout + verified.stderr


def test_to_original_from_a_diffusers_folder_names_what_it_cannot_write(tiny, cli, tmp_path):
    result = cli("--to", "original", tiny["base"], tmp_path / "back", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert "has no original_buffers.safetensors" in result.stderr and "y_embedder.y_embedding" in result.stderr
    release = load_release(tiny["pth"])
    buffers = release_buffers(dict(tiny["model"].config))
    assert_same_tensors(load_release(tmp_path / "back" / RELEASE),
                        {name: t for name, t in release.items() if name not in buffers})


def test_diffusers_folder_exports_byte_for_byte(tiny, cli, tmp_path):
    """A Diffusers-named save (a SimpleTuner or pipeline transformer/ folder) needs no --base: its config says the
    size; the export is the same files."""
    result = cli(tiny["base"], tmp_path / "out", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    for path in tiny["base"].iterdir():
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes(), path.name


PIPELINES = {"t2v": ("SanaVideoPipeline", "DPMSolverMultistepScheduler", "flow_shift"),
             "i2v": ("SanaImageToVideoPipeline", "FlowMatchEulerDiscreteScheduler", "shift")}


@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_pipeline_folder_with_base_loads_and_renders(cli, tmp_path, task):
    """The release file with --base a tiny SanaVideoPipeline or SanaImageToVideoPipeline folder (Gemma-2, Wan 2.1's
    VAE): the base's class says the task (the shapes cannot); the same model_index.json, the script's scheduler for
    that task, the transformer in the export's dtype, and five frames."""
    import diffusers

    base = tmp_path / "base"
    build_tiny_pipeline(seed=0, task=task).save_pretrained(base)
    model = SanaVideoTransformer3DModel.from_pretrained(base / "transformer")
    release = write_release(tmp_path / "release", model)["pth"]
    result = cli(release, tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "model_index.json").read_text()) == \
        json.loads((base / "model_index.json").read_text())
    pipeline_class, scheduler_class, shift = PIPELINES[task]
    scheduler = json.loads((tmp_path / "out" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == scheduler_class and scheduler[shift] == 8.0
    pipe = getattr(diffusers, pipeline_class).from_pretrained(tmp_path / "out")
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    for name, tensor in pipe.transformer.state_dict().items():
        source = model.state_dict()[name]
        assert torch.equal(tensor, source.to(policy.target_dtype(name, source.dtype))), name
    pipe.transformer.to(torch.float32)
    image = {"image": Image.fromarray(torch.arange(32 * 32 * 3, dtype=torch.uint8).reshape(32, 32, 3).numpy())} \
        if task == "i2v" else {}
    # resolution binning would snap 32x32 to the 480p model's aspect-ratio table
    frames = pipe(prompt="a cat playing guitar", height=32, width=32, frames=5, num_inference_steps=2,
                  output_type="np", use_resolution_binning=False, generator=torch.Generator().manual_seed(0),
                  **image).frames
    assert frames.shape == (1, 5, 32, 32, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())
    assert frames.std() > 0


def test_the_720p_pipeline_over_ltx2s_vae(tmp_path):
    """The 720p model's pipeline (LTX-2's VAE, latents patched (1, 1, 1)) at toy size, --base such a
    SanaVideoPipeline: the export is that pipeline (its model_index.json: AutoencoderKLLTX2Video) built like the 720p
    release; --vae the LTX-2 repository's own tiny release's VAE (its names under vae.) gives the VAE Diffusers'
    converter makes of it, and the pipeline renders nine frames through it."""
    from diffusers import SanaVideoPipeline
    from ltx2_fixtures import judged, release_tensors, split
    from safetensors.torch import save_file
    from sana_video_fixtures import build_720p_pipeline

    from cogexport.exporter import export

    base, out = tmp_path / "base", tmp_path / "out"
    build_720p_pipeline(seed=0).save_pretrained(base)
    model = SanaVideoTransformer3DModel.from_pretrained(base / "transformer")
    release = write_release(tmp_path / "release", model)["pth"]
    vae_file = tmp_path / "ltx-2-vae.safetensors"
    save_file(split(release_tensors(), "vae."), vae_file)
    result = export(release, out, base=base, vae=vae_file, dtype="fp32", progress=False)
    assert "SANA-Video_2B_720p layout" in result.model and not result.ignored
    index = json.loads((out / "model_index.json").read_text())
    assert index == json.loads((base / "model_index.json").read_text())
    assert index["vae"] == ["diffusers", "AutoencoderKLLTX2Video"]
    assert_same_tensors(load_file(out / "vae" / WEIGHTS), judged("vae", release_tensors()))
    assert_same_tensors(load_file(out / "transformer" / WEIGHTS), model.state_dict())
    pipe = SanaVideoPipeline.from_pretrained(out)
    # 64 pixels: two latent rows at the VAE's 32x (its decoder pads each side by reflection, which one row cannot)
    frames = pipe(prompt="a cat playing guitar", height=64, width=64, frames=9, num_inference_steps=2,
                  output_type="np", use_resolution_binning=False, generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape == (1, 9, 64, 64, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())
    assert frames.std() > 0


@pytest.mark.skipif(not DIFFUSERS_SCRIPTS, reason="set COGEXPORT_DIFFUSERS_SCRIPTS to huggingface/diffusers' scripts/")
def test_diffusers_conversion_script_agrees(tiny, tmp_path):
    """Diffusers' own scripts/convert_sana_video_to_diffusers.py, run from its source with the 2B sizes replaced by
    the tiny config's: its strict load and its empty-state-dict check pass, and it makes the model's tensors."""
    sys.path.insert(0, str(SCRIPTS))
    from sana_video_judge import convert

    script = Path(DIFFUSERS_SCRIPTS) / "convert_sana_video_to_diffusers.py"
    folder = convert(script, tiny["pth"], dict(tiny["model"].config), tmp_path / "judged")
    assert_same_tensors(load_file(folder / WEIGHTS), tiny["model"].state_dict())


def test_dcp_finetune_exports_exactly(cli, tmp_path):
    """FSDP2 over 2 ranks, DCP saves (SimpleTuner's sanavideo under FSDP2): the full state dict gathered in training."""
    run = dcp_finetune()
    base = tmp_path / "base"
    build_transformer(seed=0).save_pretrained(base)
    result = cli(run.root / "run" / "checkpoint", tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), run.tensors)


def test_deepspeed_finetune_exports_exactly(cli, tmp_path):
    """DeepSpeed ZeRO-2 over 2 CPU ranks in bf16 (SimpleTuner's sanavideo under DeepSpeed): the fp32 masters taken
    from the live engine, every one, exactly; the bf16 module copies are not what is exported."""
    run = deepspeed_finetune()
    base = tmp_path / "base"
    build_transformer(seed=0).save_pretrained(base)
    result = cli(run.checkpoint, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / WEIGHTS)
    assert set(written) == set(run.truth["order"]) and run.truth["trainable"] and not run.truth["frozen"]
    assert_same_tensors(written, run.expected_state_dict())
    before = load_file(base / WEIGHTS)
    assert any(not torch.equal(written[name], before[name]) for name in before), "training changed the weights"


# -- the published variant, from full-size shapes (meta tensors: nothing allocated) -------------------------------
def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


@pytest.mark.parametrize("name", ["SANA-Video_2B_480p", "SANA-Video_2B_720p"])
def test_published_variant_is_read_off_the_release_shapes(name):
    """480p (Wan 2.1's 16 latent channels, patched (1, 2, 2)) and 720p (LTX-2's 128, patched (1, 1, 1)) told apart
    by the input projection; each variant's VAE reads the latents its transformer makes."""
    variant = FAMILY.variant_named(name)
    config = FAMILY.transformer_config(variant)
    with torch.device("meta"):
        model = SanaVideoTransformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    shapes = {name: t.shape for name, t in release_state_dict(model).items() if name not in
              release_buffers(dict(model.config))}
    checkpoint = {name: LazyTensor(shape, torch.bfloat16, _never_read) for name, shape in shapes.items()}
    transformer = plan_transformer(checkpoint, ExportOptions(), "meta")
    assert transformer.variant.name == variant.name and transformer.published
    assert transformer.target.config["mlp_ratio"] == 3.0 and len(transformer.tensors) == len(model.state_dict())
    assert FAMILY.scheduler_class_for(variant) == "DPMSolverMultistepScheduler"
    vae = build_target(FAMILY.component_class("vae", variant), FAMILY.vae_config(variant)).config
    assert vae.get("z_dim", vae.get("latent_channels")) == config["in_channels"]


def test_no_tensor_is_kept_in_fp32():
    """The class declares no _keep_in_fp32_modules and Diffusers' script casts the whole model to one dtype."""
    assert SanaVideoTransformer3DModel._keep_in_fp32_modules is None and FAMILY.transformer.keep_fp32 == ()


def _keys_of(family) -> dict[str, list[str]]:
    spec = family.transformer
    target = build_target(spec.class_name, family.transformer_config(family.variants[0]))
    return {name: [*translate_shapes(load_table(name).inverted(), target.schema, target.counts)]
            for name in spec.tables if name.startswith(f"{family.key}/")}


def test_tables_never_match_another_familys_keys():
    ours = _keys_of(FAMILY)
    for other in families():
        if other.key == FAMILY.key:
            continue
        for name, keys in _keys_of(other).items():
            assert fitting_tables(keys, component_tables("transformer", FAMILY)) == [], name
        for name, keys in ours.items():
            assert fitting_tables(keys, component_tables("transformer", other)) == [], (name, other.name)
    for name, keys in ours.items():
        assert {table.name for _, table in fitting_tables(keys, component_tables("transformer"))} == {name}


# -- bad input -------------------------------------------------------------------------------------------------------
def test_bad_sana_video_input(tiny, cli, tmp_path):
    release = tiny["pth"]
    other_patch = tmp_path / "other-patch"
    build_transformer(seed=0, patch_size=(1, 1, 1), in_channels=1, out_channels=4).save_pretrained(other_patch)
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--base", other_patch], "patches (1, 2, 2)",
                   "patch_size (1, 1, 1)", inputs=[release])
    other_ratio = tmp_path / "other-ratio"
    build_transformer(seed=0, mlp_ratio=2.5).save_pretrained(other_ratio)
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--base", other_ratio], "feed-forward of 48 channels",
                   "makes 40 (mlp_ratio 2.5)", inputs=[release])
    assert_refused(cli, tmp_path, [release, tmp_path / "out"], "not a published SanaVideo size", "--base",
                   inputs=[release])
