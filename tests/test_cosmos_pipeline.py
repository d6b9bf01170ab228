"""Cosmos pipelines with --base: a tiny Predict 2 Cosmos2VideoToWorldPipeline folder (tiny T5) or Predict 2.5
Cosmos2_5_PredictBasePipeline folder (tiny Qwen2.5-VL), Wan 2.1's tiny VAE, as the base, a tiny NVIDIA release file
exported into it. The export's transformer is judged
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
from tiny_models import build_qwen_tokenizer, build_text_encoder, build_tokenizer, randomize_  # noqa: E402


class PassingSafetyChecker:
    """What the Cosmos pipelines call on their safety checker: every prompt and video passes unchanged."""

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


def build_qwen_text_encoder(vocab_size: int):
    """A 2-layer Qwen2.5-VL of width 20 (1-layer vision tower): Predict 2.5's pipeline stacks its 2 layers' hidden
    states, 40 wide, the tiny transformer's crossattn_proj_in_channels."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(vocab_size=vocab_size, hidden_size=20, intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 1]})
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=20,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0])
    torch.manual_seed(3)
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision)).eval()


def export_into(base_pipe, version: str, cli, tmp_path, scheduler_class: str, scheduler_flag: str):
    """``base_pipe`` saved without its safety checker (model_index.json null for it, no safety_checker/) as --base,
    a tiny release of ``version`` exported into it and judged: the base's model_index.json, the family's scheduler
    for the task, the transformer exactly Diffusers' converter's output. The export's folder."""
    from diffusers.loaders.single_file_utils import convert_cosmos_transformer_checkpoint_to_diffusers

    base_pipe.register_modules(safety_checker=None)
    base_pipe.save_pretrained(tmp_path / "base")
    files = write_release_files(tmp_path / "release", build_transformer(version, seed=0),
                                build_transformer(version, seed=1))
    out = tmp_path / "out"
    result = cli(files["model_ema_fp32.pt"], out, "--base", tmp_path / "base", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "model_index.json").read_text()) == \
        json.loads((tmp_path / "base" / "model_index.json").read_text())
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == scheduler_class and scheduler[scheduler_flag]
    release = torch.load(files["model_ema_fp32.pt"], map_location="cpu", weights_only=True)
    assert_same_tensors(load_file(out / "transformer" / "diffusion_pytorch_model.safetensors"),
                        convert_cosmos_transformer_checkpoint_to_diffusers(dict(release)))
    return out


def assert_renders(frames) -> None:
    assert frames.shape[1:] == (1, 16, 16, 3) and bool(torch.isfinite(torch.from_numpy(frames)).all())


def test_release_exports_into_a_predict25_pipeline_that_renders(cli, tmp_path, monkeypatch):
    """Predict 2.5: Qwen2.5-VL's stacked hidden states, the task's UniPC scheduler with flow sigmas, text to world."""
    from diffusers import Cosmos2_5_PredictBasePipeline, UniPCMultistepScheduler

    tokenizer = build_qwen_tokenizer()
    base = Cosmos2_5_PredictBasePipeline(
        text_encoder=build_qwen_text_encoder(len(tokenizer)), tokenizer=tokenizer,
        transformer=build_transformer("2.5", seed=5), vae=build_latent16_vae(),
        scheduler=UniPCMultistepScheduler(), safety_checker=PassingSafetyChecker())
    out = export_into(base, "2.5", cli, tmp_path, "UniPCMultistepScheduler", "use_flow_sigmas")
    nearest_resize_without_torchvision(monkeypatch)
    pipe = Cosmos2_5_PredictBasePipeline.from_pretrained(out, safety_checker=PassingSafetyChecker())
    assert_renders(pipe(prompt="a cat playing guitar", height=16, width=16, num_frames=1, num_inference_steps=2,
                        max_sequence_length=16, output_type="np", generator=torch.Generator().manual_seed(0)).frames)


def test_release_exports_into_a_video2world_pipeline_that_renders(cli, tmp_path, monkeypatch):
    """Predict 2 Video2World: T5, the family's Euler scheduler with Karras sigmas, one frame from an image."""
    from diffusers import Cosmos2VideoToWorldPipeline, FlowMatchEulerDiscreteScheduler

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    base = Cosmos2VideoToWorldPipeline(
        text_encoder=build_text_encoder(len(tokenizer), TEXT_WIDTH), tokenizer=tokenizer,
        transformer=build_transformer("2", seed=5), vae=build_latent16_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(), safety_checker=PassingSafetyChecker())
    out = export_into(base, "2", cli, tmp_path, "FlowMatchEulerDiscreteScheduler", "use_karras_sigmas")
    nearest_resize_without_torchvision(monkeypatch)
    pipe = Cosmos2VideoToWorldPipeline.from_pretrained(out, safety_checker=PassingSafetyChecker())
    image = Image.fromarray(torch.arange(16 * 16 * 3, dtype=torch.uint8).reshape(16, 16, 3).numpy())
    assert_renders(pipe(image=image, prompt="a cat playing guitar", height=16, width=16, num_frames=1,
                        num_inference_steps=2, max_sequence_length=8, output_type="np",
                        generator=torch.Generator().manual_seed(0)).frames)
