"""Kandinsky 6 inputs for tests: tiny TI2VA and SR transformers built by Diffusers' own classes (whose names the
published -Diffusers folders hold), and the native layout written from ComfyUI's published rename list
(comfy.ldm.kandinsky6.detection's Diffusers -> native pairs, and the kandinsky-6-sr repository's
checkpoint_keys.native_dit_state), written out here as data, independent of cogexport's tables."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from fixtures import SCRIPTS, cached_fixture
from safetensors.torch import save_file

sys.path.insert(0, str(SCRIPTS))
from tiny_models import randomize_  # noqa: E402

# Two fused blocks, one text block per stream; video heads of 8 (2 of them), audio heads of 8 (1): ca_rope applies
# the video RoPE to the audio keys, so the two head sizes must agree, as in every release.
TINY_CONFIG = {"in_visual_dim": 4, "out_visual_dim": 4, "in_text_dim": 8, "in_text_dim2": 6, "time_dim": 16,
               "model_dim": 16, "ff_dim": 32, "num_text_blocks": 1, "num_visual_blocks": 2, "axes_dims": [2, 2, 4],
               "in_audio_dim": 6, "out_audio_dim": 6, "model_dim_a": 8, "time_dim_a": 16, "ff_dim_a": 16,
               "axes_dims_a": [2, 2, 4], "audio_freqs_scaling": 0.144, "text_token_padding": True, "ca_rope": True,
               "cross_gates": True, "fix_modulation": True, "visual_token_type_num_embeddings": 2}
TINY_SR_CONFIG = {"in_visual_dim": 4, "out_visual_dim": 4, "time_dim": 16, "model_dim": 16, "ff_dim": 32,
                  "num_visual_blocks": 2, "axes_dims": [2, 2, 4]}

# ComfyUI's Diffusers -> native pairs for the TI2VA model, applied as it applies them: the two block-list prefixes at
# the start of a name, then every inner pair anywhere in it.
_NATIVE_PREFIXES = (("visual_transformer_blocks.", "visual_blocks."), ("audio_out_layer.", "audio_outLayer."))
_NATIVE_INNER = ((".timestep_embedder.linear_1.", ".in_layer."), (".timestep_embedder.linear_2.", ".out_layer."),
                 (".video_dec_block.", ".videoT."), (".audio_dec_block.", ".audioT."),
                 (".feed_forward.net.0.proj.", ".feed_forward.in_layer."),
                 (".feed_forward.net.2.", ".feed_forward.out_layer."), (".attn.", ".self_attention."))
# the SR repository's native_dit_state pairs (its DiT keeps every other Diffusers name)
_SR_NATIVE = (("time_embeddings.timestep_embedder.linear_1.", "time_embeddings.in_layer."),
              ("time_embeddings.timestep_embedder.linear_2.", "time_embeddings.out_layer."),
              (".feed_forward.net.0.proj.", ".feed_forward.in_layer."),
              (".feed_forward.net.2.", ".feed_forward.out_layer."))


def native_name(name: str) -> str:
    for diffusers, native in _NATIVE_PREFIXES:
        if name.startswith(diffusers):
            name = native + name[len(diffusers):]
            break
    for diffusers, native in _NATIVE_INNER:
        name = name.replace(diffusers, native)
    return name


def sr_native_name(name: str) -> str:
    for diffusers, native in _SR_NATIVE:
        name = name.replace(diffusers, native)
    return name


def tiny_transformer(seed: int = 0, **changes) -> torch.nn.Module:
    from diffusers import Kandinsky6Transformer3DModel

    torch.manual_seed(seed)
    return randomize_(Kandinsky6Transformer3DModel(**{**TINY_CONFIG, **changes}), seed).eval()


def tiny_sr_transformer(seed: int = 0) -> torch.nn.Module:
    from diffusers import Kandinsky6SRTransformer3DModel

    torch.manual_seed(seed)
    return randomize_(Kandinsky6SRTransformer3DModel(**TINY_SR_CONFIG), seed).eval()


def native_file(path: Path, weights: dict[str, torch.Tensor], rename=native_name) -> Path:
    """One safetensors file in the native names, as safetensors' save_file writes a PyTorch state dict."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({rename(name): tensor.detach().clone().contiguous() for name, tensor in weights.items()}, path,
              metadata={"format": "pt"})
    return path


# what make_tiny_kandinsky6.py runs or imports (its cache key)
_PIPELINE_SCRIPTS = ("make_tiny_kandinsky6.py", "make_tiny_kandinsky5.py", "kandinsky5_tiny.py",
                     "make_tiny_hunyuanvideo.py", "hunyuanvideo_tiny.py", "tiny_models.py")


def tiny_pipeline(pipeline: str = "ti2va") -> Path:
    """The tiny Kandinsky6TI2VAPipeline folder (with its audio VAE and vocoder) or Kandinsky6SRPipeline folder (with
    its latent upscaler bank), made once and cached."""
    return cached_fixture(f"kandinsky6-pipeline-{pipeline}", _PIPELINE_SCRIPTS,
                          [str(SCRIPTS / "make_tiny_kandinsky6.py"), "--pipeline", pipeline])


def config_base(folder: Path, model: torch.nn.Module) -> Path:
    """A --base folder holding only the model's config.json."""
    model.save_config(folder)
    return folder
