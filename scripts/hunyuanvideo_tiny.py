"""Tiny HunyuanVideo models for tests and fixtures: one per shape class, the original layout's names and shapes, and
Diffusers' own single-file converter as the independent judge.

Shape classes (the Diffusers config values that differ from the 13B release, which are the class defaults):

    t2v       16 input channels, guidance embedder (cfg-distilled)
    i2v-33ch  33 input channels (latents, image latents, mask), no guidance embedder, image_condition_type
              latent_concat
    i2v-16ch  the T2V shapes, image_condition_type token_replace

``original_shapes`` lists the original HYVideoDiffusionTransformer's tensor names and shapes for a Diffusers config,
written from the model's facts (video-dit-formats.md, section 2) and independent of cogexport's key maps; tests check
that Diffusers' converter turns exactly these names into the Diffusers model's.

The judge: ``diffusers.loaders.single_file_utils.convert_hunyuan_video_transformer_to_diffusers`` hard-codes the
release's hidden size 3072 where it splits the single blocks' linear1 (so does Diffusers' LoRA converter).
``diffusers_converter(hidden)`` runs that function's own source with only this constant changed (``with_hidden``
does it for either), so tiny models can be judged by Diffusers' code.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import random_state_dict, randomize_  # noqa: E402

TINY_HEADS, TINY_HEAD_DIM = 2, 8  # hidden 16
TINY_TEXT_DIM, TINY_POOLED_DIM = 32, 24  # the tiny Llama's and CLIP text model's widths
TINY = {
    "num_attention_heads": TINY_HEADS, "attention_head_dim": TINY_HEAD_DIM, "num_layers": 2, "num_single_layers": 2,
    "num_refiner_layers": 2, "text_embed_dim": TINY_TEXT_DIM, "pooled_projection_dim": TINY_POOLED_DIM,
    "rope_axes_dim": (2, 2, 4),  # sums to the head dimension
}
SHAPE_CLASSES = {
    "t2v": {},
    "i2v-33ch": {"in_channels": 33, "guidance_embeds": False, "image_condition_type": "latent_concat"},
    "i2v-16ch": {"image_condition_type": "token_replace"},
}
MODEL_TYPE = {"t2v": "t2v", "i2v-33ch": "i2v", "i2v-16ch": "i2v"}
JUDGE_HIDDEN = 3072  # the constant in Diffusers' converter
TIMESTEP_CHANNELS = 256  # the sinusoidal timestep (and guidance) embedding width, fixed in both layouts


def tiny_config(shape_class: str, **overrides) -> dict:
    return {**TINY, **SHAPE_CLASSES[shape_class], **overrides}


def build_tiny_transformer(shape_class: str = "t2v", seed: int = 0, **overrides):
    from diffusers import HunyuanVideoTransformer3DModel

    return randomize_(HunyuanVideoTransformer3DModel(**tiny_config(shape_class, **overrides)), seed, scale=0.2,
                      shift=0.1).eval()


def original_shapes(config: dict) -> dict[str, torch.Size]:
    """The original model's state dict names and shapes for a HunyuanVideoTransformer3DModel config."""
    from diffusers import HunyuanVideoTransformer3DModel

    defaults = {name: p.default for name, p in inspect.signature(HunyuanVideoTransformer3DModel).parameters.items()}
    config = {**defaults, **config}
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    head, mlp = config["attention_head_dim"], int(hidden * config["mlp_ratio"])
    patch, patch_t = config["patch_size"], config["patch_size_t"]
    shapes: dict[str, tuple] = {}

    def linear(name: str, out_features: int, in_features: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out_features, in_features), (out_features,)

    def layer_norm(name: str) -> None:
        shapes[f"{name}.weight"] = shapes[f"{name}.bias"] = (hidden,)

    shapes["img_in.proj.weight"] = (hidden, config["in_channels"], patch_t, patch, patch)
    shapes["img_in.proj.bias"] = (hidden,)
    linear("txt_in.input_embedder", hidden, config["text_embed_dim"])
    linear("txt_in.t_embedder.mlp.0", hidden, TIMESTEP_CHANNELS)
    linear("txt_in.t_embedder.mlp.2", hidden, hidden)
    linear("txt_in.c_embedder.linear_1", hidden, config["text_embed_dim"])
    linear("txt_in.c_embedder.linear_2", hidden, hidden)
    for r in range(config["num_refiner_layers"]):
        block = f"txt_in.individual_token_refiner.blocks.{r}"
        layer_norm(f"{block}.norm1")
        linear(f"{block}.self_attn_qkv", 3 * hidden, hidden)
        linear(f"{block}.self_attn_proj", hidden, hidden)
        layer_norm(f"{block}.norm2")
        linear(f"{block}.mlp.fc1", 4 * hidden, hidden)
        linear(f"{block}.mlp.fc2", hidden, 4 * hidden)
        linear(f"{block}.adaLN_modulation.1", 2 * hidden, hidden)
    linear("time_in.mlp.0", hidden, TIMESTEP_CHANNELS)
    linear("time_in.mlp.2", hidden, hidden)
    linear("vector_in.in_layer", hidden, config["pooled_projection_dim"])
    linear("vector_in.out_layer", hidden, hidden)
    if config["guidance_embeds"]:
        linear("guidance_in.mlp.0", hidden, TIMESTEP_CHANNELS)
        linear("guidance_in.mlp.2", hidden, hidden)
    for i in range(config["num_layers"]):
        for stream in ("img", "txt"):
            block = f"double_blocks.{i}.{stream}"
            linear(f"{block}_mod.linear", 6 * hidden, hidden)
            linear(f"{block}_attn_qkv", 3 * hidden, hidden)
            shapes[f"{block}_attn_q_norm.weight"] = shapes[f"{block}_attn_k_norm.weight"] = (head,)
            linear(f"{block}_attn_proj", hidden, hidden)
            linear(f"{block}_mlp.fc1", mlp, hidden)
            linear(f"{block}_mlp.fc2", hidden, mlp)
    for j in range(config["num_single_layers"]):
        block = f"single_blocks.{j}"
        linear(f"{block}.linear1", 3 * hidden + mlp, hidden)
        linear(f"{block}.linear2", hidden, hidden + mlp)
        shapes[f"{block}.q_norm.weight"] = shapes[f"{block}.k_norm.weight"] = (head,)
        linear(f"{block}.modulation.linear", 3 * hidden, hidden)
    linear("final_layer.linear", patch_t * patch * patch * config["out_channels"], hidden)
    linear("final_layer.adaLN_modulation.1", 2 * hidden, hidden)
    return {name: torch.Size(shape) for name, shape in shapes.items()}


def random_original_state_dict(config: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    return random_state_dict(original_shapes(config), seed, dtype)


def diffusers_converter(hidden: int) -> Callable[[dict], dict]:
    """Diffusers' HunyuanVideo single-file converter, its hard-coded hidden size replaced by ``hidden``."""
    from diffusers.loaders import single_file_utils

    return with_hidden(single_file_utils.convert_hunyuan_video_transformer_to_diffusers, hidden)


def with_hidden(function: Callable, hidden: int) -> Callable:
    """A function of Diffusers that hard-codes the release's hidden size (the single-file converter, the LoRA
    converter), run from its own source with only that constant replaced by ``hidden``."""
    if hidden == JUDGE_HIDDEN:
        return function
    source = textwrap.dedent(inspect.getsource(function))
    constant = f"hidden_size = {JUDGE_HIDDEN}"
    if source.count(constant) != 1:
        raise RuntimeError(f"{function.__name__} no longer reads {constant!r}; re-check the judge")
    namespace = dict(vars(inspect.getmodule(function)))  # its own module globals (torch, ...)
    exec(compile(source.replace(constant, f"hidden_size = {hidden}"), inspect.getsourcefile(function), "exec"),
         namespace)
    return namespace[function.__name__]


def judge(original: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    """Diffusers' conversion of an original-layout state dict (the input is left as it was)."""
    return diffusers_converter(hidden)(dict(original))
