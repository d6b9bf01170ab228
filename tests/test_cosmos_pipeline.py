"""A Cosmos Predict 2 pipeline with --base: a tiny Cosmos2VideoToWorldPipeline folder (tiny T5, Wan 2.1's tiny VAE,
the family's scheduler) as the base, a tiny NVIDIA release file exported into it. The export's transformer is judged
by Diffusers' own single-file converter (fp32, torch.equal); the folder loads with the pipeline class and renders.
cosmos_guardrail (the safety checker) is not installed: a stand-in with the two checks the pipeline calls is passed
at load time (the export leaves it null in model_index.json, which the pipeline fills with the real one)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import torch
from conftest import assert_same_tensors
from fixtures import SCRIPTS
from PIL import Image
from safetensors.torch import load_file
from wan_fixtures import TINY_VAE21

sys.path.insert(0, str(SCRIPTS))
from make_tiny_cosmos import TEXT_WIDTH, build_transformer, write_release_files  # noqa: E402
from tiny_models import build_text_encoder, build_tokenizer, randomize_  # noqa: E402


class PassingSafetyChecker:
    """What Cosmos2VideoToWorldPipeline calls on its safety checker: every prompt and video passes unchanged."""

    def to(self, device):
        return self

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, video):
        return video


def nearest_resize_without_torchvision(monkeypatch):
    """CosmosTransformer3DModel resizes its padding mask with torchvision's transforms, which the test set-up does
    not install (the module's import skips it, the forward then fails). torchvision's tensor resize with NEAREST is
    torch's interpolate in "nearest" mode; the mask the pipeline passes is all zeros, so any nearest resize is exact."""
    if importlib.util.find_spec("torchvision") is not None:
        return
    from diffusers.models.transformers import transformer_cosmos

    def resize(tensor, size, interpolation):
        return torch.nn.functional.interpolate(tensor, size=size, mode="nearest")

    stand_in = types.SimpleNamespace(functional=types.SimpleNamespace(resize=resize),
                                     InterpolationMode=types.SimpleNamespace(NEAREST="nearest"))
    monkeypatch.setattr(transformer_cosmos, "transforms", stand_in, raising=False)


def build_latent16_vae():
    """Wan 2.1's tiny VAE with the 16 latent channels Cosmos' transformer takes (the pipeline reads them off its
    in_channels, less the condition mask)."""
    from diffusers import AutoencoderKLWan

    config = {**TINY_VAE21, "z_dim": 16, "latents_mean": [0.05 * i - 0.4 for i in range(16)],
              "latents_std": [0.5 + 0.1 * i for i in range(16)]}
    torch.manual_seed(7)
    return randomize_(AutoencoderKLWan(**config), 7).eval()


def build_base(folder):
    """The tiny pipeline saved without its safety checker (model_index.json says null for it, no safety_checker/)."""
    from diffusers import Cosmos2VideoToWorldPipeline, FlowMatchEulerDiscreteScheduler

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    pipe = Cosmos2VideoToWorldPipeline(
        text_encoder=build_text_encoder(len(tokenizer), TEXT_WIDTH), tokenizer=tokenizer,
        transformer=build_transformer("2", seed=5), vae=build_latent16_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True), safety_checker=PassingSafetyChecker())
    pipe.register_modules(safety_checker=None)
    pipe.save_pretrained(folder)
    return folder


def test_release_exports_into_a_video2world_pipeline_that_renders(cli, tmp_path, monkeypatch):
    from diffusers import Cosmos2VideoToWorldPipeline
    from diffusers.loaders.single_file_utils import convert_cosmos_transformer_checkpoint_to_diffusers

    base = build_base(tmp_path / "base")
    files = write_release_files(tmp_path / "release", build_transformer("2", seed=0), build_transformer("2", seed=1))
    result = cli(files["model_ema_fp32.pt"], tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    assert json.loads((out / "model_index.json").read_text()) == json.loads((base / "model_index.json").read_text())
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "FlowMatchEulerDiscreteScheduler" and scheduler["use_karras_sigmas"]
    release = torch.load(files["model_ema_fp32.pt"], map_location="cpu", weights_only=True)
    judged = convert_cosmos_transformer_checkpoint_to_diffusers(dict(release))
    assert_same_tensors(load_file(out / "transformer" / "diffusion_pytorch_model.safetensors"), judged)

    nearest_resize_without_torchvision(monkeypatch)
    pipe = Cosmos2VideoToWorldPipeline.from_pretrained(out, safety_checker=PassingSafetyChecker())
    image = Image.fromarray(torch.arange(16 * 16 * 3, dtype=torch.uint8).reshape(16, 16, 3).numpy())
    frames = pipe(image=image, prompt="a cat playing guitar", height=16, width=16, num_frames=1,
                  num_inference_steps=2, max_sequence_length=8, output_type="np",
                  generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape[1:] == (1, 16, 16, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())
