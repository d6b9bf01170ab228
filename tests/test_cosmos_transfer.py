"""NVIDIA Cosmos Transfer 2.5: NVIDIA's one state dict (the base, Predict 2.5's network with a reference image's
context, and the control branch, control_embedder. / control_blocks.) into Diffusers' CosmosTransformer3DModel and
CosmosControlNetModel, and back into one model.pt. Judged by an independent writer of the layout
(scripts/make_tiny_cosmos_transfer.py), Diffusers' own conversion script run from its source at toy size
(COGEXPORT_DIFFUSERS_SCRIPTS: Diffusers has no single-file converter for the control net), and the Diffusers models'
forward; a tiny Cosmos2_5_TransferPipeline folder as --base renders."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from fixtures import SCRIPTS
from PIL import Image
from safetensors.torch import load_file, save_file
from test_cosmos_pipeline import (PassingSafetyChecker, build_latent16_vae, build_qwen_text_encoder,
                                  nearest_resize_without_torchvision)

from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_component, plan_transformer
from cogexport.lazy import LazyTensor
from cogexport.models.family import family_named
from cogexport.models.recognize import component_tables, fitting_tables

sys.path.insert(0, str(SCRIPTS))
from make_tiny_cosmos_transfer import build_models, control_name, release_state_dict, write_release  # noqa: E402
from tiny_models import build_qwen_tokenizer  # noqa: E402

FAMILY = family_named("cosmos")
WEIGHTS = "diffusion_pytorch_model.safetensors"
BUFFERS = "original_buffers.safetensors"
# huggingface/diffusers' scripts folder (a clone): its convert_cosmos_to_diffusers.py is the layout's judge
DIFFUSERS_SCRIPTS = os.environ.get("COGEXPORT_DIFFUSERS_SCRIPTS")


def load_release(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny base and control net (seed 0), their save_pretrained folders in fp32 (the --base configs and the
    truth), and the release files written from them."""
    folder = tmp_path_factory.mktemp("cosmos-transfer")
    transformer, controlnet = build_models(seed=0)
    transformer.save_pretrained(folder / "transformer")
    controlnet.save_pretrained(folder / "controlnet")
    return {"transformer": transformer, "controlnet": controlnet, "folder": folder,
            **write_release(folder / "release", transformer, controlnet)}


@pytest.mark.skipif(not DIFFUSERS_SCRIPTS, reason="set COGEXPORT_DIFFUSERS_SCRIPTS to huggingface/diffusers' scripts/")
def test_diffusers_conversion_script_agrees_with_the_independent_writer(tiny, tmp_path):
    """The script's own split, convert_transformer and convert_controlnet (strict loads) read the independently
    written file back to exactly both models."""
    from cosmos_transfer_judge import convert

    configs = [{k: v for k, v in tiny[name].config.items() if not k.startswith("_")}
               for name in ("transformer", "controlnet")]
    out = convert(Path(DIFFUSERS_SCRIPTS) / "convert_cosmos_to_diffusers.py", tiny["model_ema_fp32.pt"], *configs,
                  tmp_path / "judged")
    for name in ("transformer", "controlnet"):
        assert_same_tensors(load_file(out / name / WEIGHTS), tiny[name].state_dict())


def _export_both(tiny, cli, out: Path, release: str = "model_ema_fp32.pt") -> None:
    for name in ("transformer", "controlnet"):
        result = cli(tiny[release], out / name, "--base", tiny["folder"] / name, "--component", name,
                     "--dtype", "fp32")
        assert result.exit_code == 0, result.stderr


def test_release_exports_both_models_as_save_pretrained_does_and_keeps_what_diffusers_drops(tiny, cli, tmp_path):
    """Each model from the one file: save_pretrained's own files byte for byte (config included); the buffers
    Diffusers has no place for kept beside the model that had them (the control blocks' Transformer Engine state
    beside the control net)."""
    _export_both(tiny, cli, tmp_path)
    for name in ("transformer", "controlnet"):
        for path in (tiny["folder"] / name).iterdir():
            assert (tmp_path / name / path.name).read_bytes() == path.read_bytes(), f"{name}/{path.name}"
    kept = load_file(tmp_path / "controlnet" / BUFFERS)
    assert sorted(kept) == ["control_blocks.0.cross_attn.attn_op._extra_state",
                            "control_blocks.1.cross_attn.attn_op._extra_state"]
    assert not [name for name in load_file(tmp_path / "transformer" / BUFFERS) if name.startswith("control_")]
    # verify passes for both; Diffusers' single-file converter, which would rename the branch's blocks too, is not
    # asked for the base of a file holding the branch
    for name in ("transformer", "controlnet"):
        verified = cli("verify", tmp_path / name, "--against", tiny["model_ema_fp32.pt"])
        assert verified.exit_code == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr


def resize_without_torchvision(monkeypatch) -> None:
    """The control net resizes its padding mask with torchvision as the transformer does: the same stand-in for
    both (test_cosmos_pipeline.nearest_resize_without_torchvision says why it is exact)."""
    nearest_resize_without_torchvision(monkeypatch)
    from diffusers.models.controlnets import controlnet_cosmos
    from diffusers.models.transformers import transformer_cosmos

    monkeypatch.setattr(controlnet_cosmos, "transforms", transformer_cosmos.transforms, raising=False)


def _forward(transformer, controlnet) -> torch.Tensor:
    """The control branch's residuals fed into the base, as Cosmos2_5_TransferPipeline runs them."""
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 16, 2, 4, 4, generator=generator)
    controls = torch.randn(1, 16, 2, 4, 4, generator=generator)
    condition = torch.zeros(1, 1, 2, 4, 4)
    text = torch.randn(1, 3, controlnet.config.crossattn_proj_in_channels, generator=generator)
    image = torch.randn(1, 4, controlnet.config.img_context_dim_in, generator=generator)
    padding = torch.zeros(1, 1, 4, 4)
    timestep = torch.tensor([0.5])
    with torch.no_grad():
        residuals = controlnet(controls, latents, timestep, (text, image), condition, padding_mask=padding,
                               return_dict=False)[0]
        hidden = torch.cat([latents, condition], dim=1)
        return transformer(hidden, timestep, (text, image), block_controlnet_hidden_states=residuals,
                           padding_mask=padding, return_dict=False)[0]


def test_exported_models_run_as_the_source_models(tiny, cli, tmp_path, monkeypatch):
    """The Diffusers models loaded from the export compute exactly what the models the file was written from do."""
    from diffusers import CosmosControlNetModel, CosmosTransformer3DModel

    _export_both(tiny, cli, tmp_path)
    resize_without_torchvision(monkeypatch)
    exported = (CosmosTransformer3DModel.from_pretrained(tmp_path / "transformer").eval(),
                CosmosControlNetModel.from_pretrained(tmp_path / "controlnet").eval())
    expected = _forward(tiny["transformer"], tiny["controlnet"])
    assert torch.isfinite(expected).all() and expected.abs().sum() > 0
    assert torch.equal(_forward(*exported), expected)


def _transfer_base(path: Path) -> None:
    """A tiny Cosmos2_5_TransferPipeline saved without its safety checker (other weights: seed 5)."""
    from diffusers import Cosmos2_5_TransferPipeline, UniPCMultistepScheduler

    tokenizer = build_qwen_tokenizer()
    transformer, controlnet = build_models(seed=5)
    pipe = Cosmos2_5_TransferPipeline(
        text_encoder=build_qwen_text_encoder(len(tokenizer)), tokenizer=tokenizer, transformer=transformer,
        vae=build_latent16_vae(), scheduler=UniPCMultistepScheduler(), controlnet=controlnet,
        safety_checker=PassingSafetyChecker())
    pipe.register_modules(safety_checker=None)
    pipe.save_pretrained(path)


def test_bf16_release_into_a_transfer_pipeline_renders_and_goes_back_to_the_same_file(tiny, cli, tmp_path,
                                                                                       monkeypatch):
    """The release (bf16, as NVIDIA ships it) with a Transfer pipeline as --base: both models from the file, the
    task's scheduler, the base's model_index.json; the folder renders from a control video; --to original gives
    back one model.pt holding every tensor of the release under its name, in its dtype, to the bit."""
    from diffusers import Cosmos2_5_TransferPipeline

    _transfer_base(tmp_path / "base")
    result = cli(tiny["model_ema_bf16.pt"], tmp_path / "pipe", "--base", tmp_path / "base")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "pipe" / "model_index.json").read_text()) == \
        json.loads((tmp_path / "base" / "model_index.json").read_text())
    scheduler = json.loads((tmp_path / "pipe" / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "UniPCMultistepScheduler" and scheduler["use_flow_sigmas"]
    back = cli("--to", "original", tmp_path / "pipe", tmp_path / "back")
    assert back.exit_code == 0, back.stderr
    assert_same_tensors(load_release(tmp_path / "back" / "model.pt"), load_release(tiny["model_ema_bf16.pt"]))

    resize_without_torchvision(monkeypatch)
    pipe = Cosmos2_5_TransferPipeline.from_pretrained(tmp_path / "pipe", safety_checker=PassingSafetyChecker())
    # five frames: one chunk of the autoregressive loop, its first frame the conditioning one
    controls = [Image.fromarray((torch.arange(16 * 16 * 3).reshape(16, 16, 3) * (i + 1) % 256).to(torch.uint8).numpy())
                for i in range(5)]
    frames = pipe(controls=controls, prompt="a robot arm", height=16, width=16, num_frames=5, num_frames_per_chunk=5,
                  num_inference_steps=2, max_sequence_length=16, output_type="np",
                  generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape[1:] == (5, 16, 16, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())


def test_a_control_net_whose_copy_of_the_base_embedders_differs_is_refused(tiny, cli, tmp_path):
    """NVIDIA's file has one patch embedding for both models: a control net whose copy differs would lose one."""
    _export_both(tiny, cli, tmp_path / "pipe")
    (tmp_path / "pipe" / "model_index.json").write_text(json.dumps(
        {"_class_name": "Cosmos2_5_TransferPipeline", "transformer": ["diffusers", "CosmosTransformer3DModel"],
         "controlnet": ["diffusers", "CosmosControlNetModel"]}))
    weights = tmp_path / "pipe" / "controlnet" / WEIGHTS
    tensors = load_file(weights)
    tensors["patch_embed_base.proj.weight"] = tensors["patch_embed_base.proj.weight"] + 1
    save_file(tensors, weights)
    assert_refused(cli, tmp_path, ["--to", "original", tmp_path / "pipe", tmp_path / "out"],
                   "holds its own copy of net.x_embedder.proj.1.weight, which differs from the transformer's")


def test_imaginaire_run_gives_the_newest_iterations_ema_for_both_models(tiny, cli, tmp_path):
    """A Transfer run's iteration (model/ with net.* and net_ema.*, saved here by dcp.save in one process; an older
    iteration beside it): --ema reads the EMA of the iteration latest_checkpoint.txt names, for the base and for the
    control branch alike."""
    import torch.distributed.checkpoint as dcp

    checkpoints = tmp_path / "job" / "checkpoints"
    older, ema = build_models(seed=2), build_models(seed=1)
    newest = (tiny["transformer"], tiny["controlnet"])
    for iteration, (net, net_ema) in (("iter_000000001", (older, older)), ("iter_000000002", (newest, ema))):
        weights = {**release_state_dict(*net), **release_state_dict(*net_ema, prefix="net_ema.")}
        dcp.save(weights, checkpoint_id=str(checkpoints / iteration / "model"))
    (checkpoints / "latest_checkpoint.txt").write_text("iter_000000002\n")
    for index, name in enumerate(("transformer", "controlnet")):
        result = cli(tmp_path / "job", tmp_path / name, "--base", tiny["folder"] / name, "--component", name,
                     "--ema", "--dtype", "fp32")
        assert result.exit_code == 0, result.stderr
        assert_same_tensors(load_file(tmp_path / name / WEIGHTS), ema[index].state_dict())


def test_transfer_and_predict_are_never_taken_for_each_other(tiny, cli, tmp_path):
    """A Transfer file with a Predict 2.5 model as --base, and a control net asked of a Predict file: one line each,
    nothing written."""
    from make_tiny_cosmos import build_transformer, write_release_files

    build_transformer("2.5", seed=0).save_pretrained(tmp_path / "predict")
    predict = write_release_files(tmp_path / "predict-release", *(build_transformer("2.5", seed=s) for s in (0, 1)))
    assert_refused(cli, tmp_path, [tiny["model_ema_fp32.pt"], tmp_path / "out", "--base", tmp_path / "predict"],
                   "is a Cosmos TRANSFER model", "is a Cosmos-Predict2.5-2B-layout WORLD model")
    assert_refused(cli, tmp_path, [predict["model_ema_fp32.pt"], tmp_path / "out", "--component", "controlnet",
                                   "--base", tiny["folder"] / "controlnet"],
                   "holds a transformer (Cosmos), not a controlnet")


def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


def test_published_transfer_is_read_off_the_release_shapes():
    """Full size on the meta device (nothing allocated): the base is Cosmos-Transfer2.5-2B without --base, and the
    control net takes that variant's published config."""
    from diffusers import CosmosControlNetModel, CosmosTransformer3DModel

    variant = FAMILY.variant_named("Cosmos-Transfer2.5-2B")
    with torch.device("meta"):
        transformer = CosmosTransformer3DModel(**FAMILY.transformer_config(variant))
        controlnet = CosmosControlNetModel(**FAMILY.component_config("controlnet", variant))
    checkpoint = {name: LazyTensor(t.shape, torch.bfloat16, _never_read)
                  for name, t in release_state_dict(transformer, controlnet).items() if t.is_floating_point()}
    base = plan_transformer(checkpoint, ExportOptions(), "meta")
    assert base.variant.name == variant.name and base.published
    assert len(base.tensors) == len(transformer.state_dict())
    branch = plan_component(checkpoint, "controlnet", FAMILY, base.variant, None, ExportOptions(), "meta")
    assert len(branch.tensors) == len(controlnet.state_dict()) == \
        len([n for n in controlnet.state_dict() if control_name(n)]) + 8  # the base's embedders it copies
    assert FAMILY.task(variant.task).pipeline == "Cosmos2_5_TransferPipeline"
    # the fp32 allowlist is the class's own (the learnable embedding, which no release has)
    assert FAMILY.components["controlnet"].keep_fp32 == tuple(CosmosControlNetModel._keep_in_fp32_modules)


def test_each_layout_is_recognised_by_its_own_table_alone(tiny):
    """NVIDIA's file: the base's table among every family's transformer tables, the control net's among every
    controlnet table; the control net's Diffusers names by its Diffusers table alone, and the base's by none of
    them."""
    release = list(release_state_dict(tiny["transformer"], tiny["controlnet"]))

    def fitting(keys, component):
        return {table.name for _, table in fitting_tables(keys, component_tables(component))}

    assert fitting(release, "transformer") == {"cosmos/original_transformer"}
    assert fitting(release, "controlnet") == {"cosmos/original_controlnet"}
    assert fitting(list(tiny["controlnet"].state_dict()), "controlnet") == {"cosmos/diffusers_controlnet"}
    assert fitting(list(tiny["transformer"].state_dict()), "controlnet") == set()
