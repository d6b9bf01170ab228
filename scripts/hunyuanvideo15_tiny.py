"""Tiny HunyuanVideo 1.5 models for tests and fixtures: one per shape class, the original layout's names and shapes,
and the original -> Diffusers conversion written from the facts of Diffusers' repository script
(scripts/convert_hunyuan_video1_5_to_diffusers.py), as the independent reference for sizes the original-code fixture
(../shared/fixtures/hunyuanvideo15) does not cover.

Shape classes (the Diffusers config values that differ from the tiny base config):

    t2v       the 480p T2V model's layout (the T2V, I2V, 720p and cfg-distilled releases all have these tensors)
    i2v       the same tensors, task_type i2v
    meanflow  the step-distilled 480p I2V model: MeanFlow's second timestep embedder (time_r_in)

``original_shapes`` lists the original HunyuanVideo_1_5_DiffusionTransformer's tensor names and shapes for a Diffusers
config, and ``reference_to_diffusers`` renames an original state dict the way the script does (its 54-layer and
2-refiner-block loops made to follow the state dict's depth), both written out here from the script's facts and
independent of cogexport's key maps. The original-code fixture checks both: its original names are
``original_shapes`` of its config, and ``reference_to_diffusers`` of its weights is its ground truth.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import random_state_dict, randomize_  # noqa: E402

LATENT = 4  # the tiny VAE's latent channels: the transformer takes 2 x 4 + 1 (latents, condition latents, mask)
TINY_TEXT_DIM, TINY_GLYPH_DIM, TINY_IMAGE_DIM = 24, 8, 16  # the tiny Qwen2.5-VL's, ByT5's and SigLIP's widths
TINY = {
    "num_attention_heads": 2, "attention_head_dim": 16, "num_layers": 2, "num_refiner_layers": 2,
    "in_channels": 2 * LATENT + 1, "out_channels": LATENT, "text_embed_dim": TINY_TEXT_DIM,
    "text_embed_2_dim": TINY_GLYPH_DIM, "image_embed_dim": TINY_IMAGE_DIM, "rope_axes_dim": (4, 6, 6),
}
SHAPE_CLASSES = {
    "t2v": {"task_type": "t2v"},
    "i2v": {"task_type": "i2v"},
    "meanflow": {"task_type": "i2v", "use_meanflow": True},
}
MODEL_TYPE = {"t2v": "t2v", "i2v": "i2v", "meanflow": "i2v"}
TIMESTEP_CHANNELS = 256  # the sinusoidal timestep embedding width, fixed in both layouts
GLYPH_HIDDEN = 2048  # the ByT5 projection's hidden width, fixed in both classes


def tiny_config(shape_class: str, **overrides) -> dict:
    return {**TINY, **SHAPE_CLASSES[shape_class], **overrides}


def build_tiny_transformer(shape_class: str = "t2v", seed: int = 0, **overrides):
    from diffusers import HunyuanVideo15Transformer3DModel

    return randomize_(HunyuanVideo15Transformer3DModel(**tiny_config(shape_class, **overrides)), seed, scale=0.2,
                      shift=0.1).eval()


def _full_config(config: dict) -> dict:
    from diffusers import HunyuanVideo15Transformer3DModel

    defaults = {name: p.default for name, p in inspect.signature(HunyuanVideo15Transformer3DModel).parameters.items()}
    return {**defaults, **config}


def _refiner_shapes(shapes: dict, hidden: int, config: dict) -> None:
    def linear(name: str, out_features: int, in_features: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out_features, in_features), (out_features,)

    linear("txt_in.input_embedder", hidden, config["text_embed_dim"])
    linear("txt_in.t_embedder.mlp.0", hidden, TIMESTEP_CHANNELS)
    linear("txt_in.t_embedder.mlp.2", hidden, hidden)
    linear("txt_in.c_embedder.linear_1", hidden, config["text_embed_dim"])
    linear("txt_in.c_embedder.linear_2", hidden, hidden)
    for r in range(config["num_refiner_layers"]):
        block = f"txt_in.individual_token_refiner.blocks.{r}"
        for norm in ("norm1", "norm2"):
            shapes[f"{block}.{norm}.weight"] = shapes[f"{block}.{norm}.bias"] = (hidden,)
        linear(f"{block}.self_attn_qkv", 3 * hidden, hidden)
        linear(f"{block}.self_attn_proj", hidden, hidden)
        linear(f"{block}.mlp.fc1", 4 * hidden, hidden)
        linear(f"{block}.mlp.fc2", hidden, 4 * hidden)
        linear(f"{block}.adaLN_modulation.1", 2 * hidden, hidden)


def _embedder_shapes(shapes: dict, hidden: int, config: dict) -> None:
    def linear(name: str, out_features: int, in_features: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out_features, in_features), (out_features,)

    patch, patch_t = config["patch_size"], config["patch_size_t"]
    shapes["img_in.proj.weight"] = (hidden, config["in_channels"], patch_t, patch, patch)
    shapes["img_in.proj.bias"] = (hidden,)
    for embedder in ("time_in", "time_r_in") if config["use_meanflow"] else ("time_in",):
        linear(f"{embedder}.mlp.0", hidden, TIMESTEP_CHANNELS)
        linear(f"{embedder}.mlp.2", hidden, hidden)
    glyph, image = config["text_embed_2_dim"], config["image_embed_dim"]
    shapes["byt5_in.layernorm.weight"] = shapes["byt5_in.layernorm.bias"] = (glyph,)
    linear("byt5_in.fc1", GLYPH_HIDDEN, glyph)
    linear("byt5_in.fc2", GLYPH_HIDDEN, GLYPH_HIDDEN)
    linear("byt5_in.fc3", hidden, GLYPH_HIDDEN)
    shapes["vision_in.proj.0.weight"] = shapes["vision_in.proj.0.bias"] = (image,)
    linear("vision_in.proj.1", image, image)
    linear("vision_in.proj.3", hidden, image)
    shapes["vision_in.proj.4.weight"] = shapes["vision_in.proj.4.bias"] = (hidden,)
    shapes["cond_type_embedding.weight"] = (3, hidden)


def original_shapes(config: dict) -> dict[str, torch.Size]:
    """The original model's state dict names and shapes for a HunyuanVideo15Transformer3DModel config."""
    config = _full_config(config)
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    head, mlp = config["attention_head_dim"], int(hidden * config["mlp_ratio"])
    shapes: dict[str, tuple] = {}

    def linear(name: str, out_features: int, in_features: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (out_features, in_features), (out_features,)

    _embedder_shapes(shapes, hidden, config)
    _refiner_shapes(shapes, hidden, config)
    for i in range(config["num_layers"]):
        for stream in ("img", "txt"):
            block = f"double_blocks.{i}.{stream}"
            linear(f"{block}_mod.linear", 6 * hidden, hidden)
            for part in ("q", "k", "v", "proj"):
                linear(f"{block}_attn_{part}", hidden, hidden)
            shapes[f"{block}_attn_q_norm.weight"] = shapes[f"{block}_attn_k_norm.weight"] = (head,)
            linear(f"{block}_mlp.fc1", mlp, hidden)
            linear(f"{block}_mlp.fc2", hidden, mlp)
    patch_volume = config["patch_size_t"] * config["patch_size"] ** 2
    linear("final_layer.linear", patch_volume * config["out_channels"], hidden)
    linear("final_layer.adaLN_modulation.1", 2 * hidden, hidden)
    return {name: torch.Size(shape) for name, shape in shapes.items()}


def random_original_state_dict(config: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    return random_state_dict(original_shapes(config), seed, dtype)


# -- the conversion script's facts, written out (original name -> Diffusers name, and the one half swap) ----------
_EMBEDDERS = {"time_in.mlp.0": "time_embed.timestep_embedder.linear_1",
              "time_in.mlp.2": "time_embed.timestep_embedder.linear_2",
              "time_r_in.mlp.0": "time_embed.timestep_embedder_r.linear_1",
              "time_r_in.mlp.2": "time_embed.timestep_embedder_r.linear_2",
              "txt_in.t_embedder.mlp.0": "context_embedder.time_text_embed.timestep_embedder.linear_1",
              "txt_in.t_embedder.mlp.2": "context_embedder.time_text_embed.timestep_embedder.linear_2",
              "txt_in.c_embedder.linear_1": "context_embedder.time_text_embed.text_embedder.linear_1",
              "txt_in.c_embedder.linear_2": "context_embedder.time_text_embed.text_embedder.linear_2",
              "txt_in.input_embedder": "context_embedder.proj_in",
              "byt5_in.layernorm": "context_embedder_2.norm", "byt5_in.fc1": "context_embedder_2.linear_1",
              "byt5_in.fc2": "context_embedder_2.linear_2", "byt5_in.fc3": "context_embedder_2.linear_3",
              "vision_in.proj.0": "image_embedder.norm_in", "vision_in.proj.1": "image_embedder.linear_1",
              "vision_in.proj.3": "image_embedder.linear_2", "vision_in.proj.4": "image_embedder.norm_out",
              "img_in.proj": "x_embedder.proj", "final_layer.linear": "proj_out"}
_REFINER = {"norm1": "norm1", "norm2": "norm2", "self_attn_proj": "attn.to_out.0", "mlp.fc1": "ff.net.0.proj",
            "mlp.fc2": "ff.net.2", "adaLN_modulation.1": "norm_out.linear"}
_DOUBLE = {"img_mod.linear": "norm1.linear", "txt_mod.linear": "norm1_context.linear",
           "img_attn_q": "attn.to_q", "img_attn_k": "attn.to_k", "img_attn_v": "attn.to_v",
           "img_attn_q_norm": "attn.norm_q", "img_attn_k_norm": "attn.norm_k", "img_attn_proj": "attn.to_out.0",
           "txt_attn_q": "attn.add_q_proj", "txt_attn_k": "attn.add_k_proj", "txt_attn_v": "attn.add_v_proj",
           "txt_attn_q_norm": "attn.norm_added_q", "txt_attn_k_norm": "attn.norm_added_k",
           "txt_attn_proj": "attn.to_add_out", "img_mlp.fc1": "ff.net.0.proj", "img_mlp.fc2": "ff.net.2",
           "txt_mlp.fc1": "ff_context.net.0.proj", "txt_mlp.fc2": "ff_context.net.2"}


def _blocks(original: dict, prefix: str) -> int:
    return len({name[len(prefix):].split(".")[0] for name in original if name.startswith(prefix)})


def reference_to_diffusers(original: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The original state dict in Diffusers names, as the script converts it (every original tensor must be used)."""
    left = dict(original)
    out: dict[str, torch.Tensor] = {}

    def move(source: str, target: str) -> None:
        for p in ("weight", "bias"):
            if f"{source}.{p}" in left:
                out[f"{target}.{p}"] = left.pop(f"{source}.{p}")

    for source, target in _EMBEDDERS.items():
        move(source, target)
    out["cond_type_embed.weight"] = left.pop("cond_type_embedding.weight")
    for r in range(_blocks(original, "txt_in.individual_token_refiner.blocks.")):
        source = f"txt_in.individual_token_refiner.blocks.{r}"
        target = f"context_embedder.token_refiner.refiner_blocks.{r}"
        for p in ("weight", "bias"):
            q, k, v = torch.chunk(left.pop(f"{source}.self_attn_qkv.{p}"), 3, dim=0)
            out.update({f"{target}.attn.to_q.{p}": q, f"{target}.attn.to_k.{p}": k, f"{target}.attn.to_v.{p}": v})
        for name, renamed in _REFINER.items():
            move(f"{source}.{name}", f"{target}.{renamed}")
    for i in range(_blocks(original, "double_blocks.")):
        for name, renamed in _DOUBLE.items():
            move(f"double_blocks.{i}.{name}", f"transformer_blocks.{i}.{renamed}")
    for p in ("weight", "bias"):
        shift, scale = left.pop(f"final_layer.adaLN_modulation.1.{p}").chunk(2, dim=0)
        out[f"norm_out.linear.{p}"] = torch.cat([scale, shift], dim=0)
    if left:
        raise KeyError(f"the script's conversion leaves {sorted(left)[:3]} unused")
    return out


# -- the VAE: the script's convert_hunyuan_video_15_vae_checkpoint_to_diffusers facts -------------------------------
_VAE_RESNET = ("norm1.gamma", "conv1.conv.weight", "conv1.conv.bias", "norm2.gamma", "conv2.conv.weight",
               "conv2.conv.bias")
_VAE_ATTENTION = {"norm.gamma": "norm.gamma", "q.weight": "to_q.weight", "q.bias": "to_q.bias",
                  "k.weight": "to_k.weight", "k.bias": "to_k.bias", "v.weight": "to_v.weight", "v.bias": "to_v.bias",
                  "proj_out.weight": "proj_out.weight", "proj_out.bias": "proj_out.bias"}


def _vae_pairs(config: dict) -> list[tuple[str, str]]:
    """(original name, Diffusers name) for every VAE tensor, as the script's loops name them."""
    pairs = []
    for coder in ("encoder", "decoder"):
        pairs += [(f"{coder}.{edge}.conv.{p}",) * 2 for edge in ("conv_in", "conv_out") for p in ("weight", "bias")]
        pairs.append((f"{coder}.norm_out.gamma",) * 2)
        for block, resnets in (("block_1", "resnets.0"), ("block_2", "resnets.1")):
            pairs += [(f"{coder}.mid.{block}.{part}", f"{coder}.mid_block.{resnets}.{part}") for part in _VAE_RESNET]
        pairs += [(f"{coder}.mid.attn_1.{a}", f"{coder}.mid_block.attentions.0.{b}") for a, b in _VAE_ATTENTION.items()]
    for i in range(len(config["block_out_channels"])):
        pairs += [(f"encoder.down.{i}.block.{j}.{part}", f"encoder.down_blocks.{i}.resnets.{j}.{part}")
                  for j in range(config["layers_per_block"]) for part in _VAE_RESNET]
        pairs += [(f"encoder.down.{i}.downsample.conv.conv.{p}",
                   f"encoder.down_blocks.{i}.downsamplers.0.conv.conv.{p}") for p in ("weight", "bias")]
        pairs += [(f"decoder.up.{i}.block.{j}.{part}", f"decoder.up_blocks.{i}.resnets.{j}.{part}")
                  for j in range(config["layers_per_block"] + 1) for part in _VAE_RESNET]
        pairs += [(f"decoder.up.{i}.upsample.conv.conv.{p}", f"decoder.up_blocks.{i}.upsamplers.0.conv.conv.{p}")
                  for p in ("weight", "bias")]
    return pairs


def original_vae_state_dict(vae) -> dict[str, torch.Tensor]:
    """An AutoencoderKLHunyuanVideo15's weights under the release's original names (the script's pairs, backwards;
    the last stages have no down/up sampler, so those names are skipped)."""
    weights = vae.state_dict()
    return {original: weights[name] for original, name in _vae_pairs(dict(vae.config)) if name in weights}


def reference_vae_to_diffusers(original: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """The release VAE in Diffusers names, as the script converts it (every original tensor must be used)."""
    left = dict(original)
    out = {name: left.pop(source) for source, name in _vae_pairs(config) if source in left}
    if left:
        raise KeyError(f"the script's VAE conversion leaves {sorted(left)[:3]} unused")
    return out
