"""Tiny NVIDIA Cosmos Predict 2 / 2.5 transformers and their release files, made in-process (tests, docs):

- ``build_transformer(version, seed)``: a real Diffusers CosmosTransformer3DModel at toy size (2 layers, 2 heads of
  12), every tensor seeded noise;
- ``release_state_dict(model)``: the same weights as NVIDIA's MiniTrainDIT holds them (``net.`` names), with the
  tensors a release carries beside the weights (the training counters, the RoPE buffers, Transformer Engine's
  5-byte extra state), written here from the layout's facts with plain string rules (no key map): the ground truth
  the key map is checked against, before Diffusers' own converter judges it;
- ``convert_distcp_to_pt``-style files: ``model.pt`` (``net.*`` and ``net_ema.*``), ``model_ema_fp32.pt`` and
  ``model_ema_bf16.pt`` (every fp32 tensor cast to bf16), as NVIDIA's script writes them.

    python scripts/make_tiny_cosmos.py OUT [--version 2.5]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import randomize_  # noqa: E402

LAYERS = 2
HEADS, HEAD_DIM = 2, 12  # RoPE splits a head 4 / 4 / 4 (h, w, t)
TEXT_WIDTH = 16
MAX_SIZE = (8, 16, 16)  # latent frames, height, width: positions 8 long on every axis after the (1, 2, 2) patch

# Transformer Engine serialises its (empty) attention-operator state as a pickle in a uint8 tensor: 5 bytes
EXTRA_STATE = torch.tensor(list(pickle.dumps({}, protocol=4)), dtype=torch.uint8)


def tiny_config(version: str = "2") -> dict[str, Any]:
    """A Predict 2 Video2World (``"2"``) or Predict 2.5 (``"2.5"``) config at toy size."""
    config = dict(in_channels=17, out_channels=16, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM,
                  num_layers=LAYERS, text_embed_dim=TEXT_WIDTH, adaln_lora_dim=8, max_size=MAX_SIZE,
                  rope_scale=(1.0, 3.0, 3.0), extra_pos_embed_type=None)
    if version == "2.5":
        config.update(use_crossattn_projection=True, crossattn_proj_in_channels=40,
                      encoder_hidden_states_channels=TEXT_WIDTH)
    return config


def build_transformer(version: str = "2", seed: int = 0):
    from diffusers import CosmosTransformer3DModel

    torch.manual_seed(seed)
    return randomize_(CosmosTransformer3DModel(**tiny_config(version)), seed).eval()


# Diffusers' module names -> MiniTrainDIT's, applied in order to each dotted name (the layout's facts, issue 38)
_BLOCK_PARTS = (("attn1.", "self_attn."), ("attn2.", "cross_attn."), ("to_out.0.", "output_proj."),
                ("norm_q.", "q_norm."), ("norm_k.", "k_norm."), ("ff.net.0.proj.", "mlp.layer1."),
                ("ff.net.2.", "mlp.layer2."), ("norm1.", "adaln_modulation_self_attn."),
                ("norm2.", "adaln_modulation_cross_attn."), ("norm3.", "adaln_modulation_mlp."))
_TOP = {"patch_embed.proj.weight": "x_embedder.proj.1.weight", "time_embed.norm.weight": "t_embedding_norm.weight",
        "norm_out.linear_1.weight": "final_layer.adaln_modulation.1.weight",
        "norm_out.linear_2.weight": "final_layer.adaln_modulation.2.weight",
        "proj_out.weight": "final_layer.linear.weight"}


def original_name(name: str) -> str:
    if name in _TOP:
        return _TOP[name]
    if name.startswith("time_embed.t_embedder."):
        return "t_embedder.1." + name.removeprefix("time_embed.t_embedder.")
    if not name.startswith("transformer_blocks."):
        return name  # crossattn_proj.0.* is named alike
    name = "blocks." + name.removeprefix("transformer_blocks.")
    for diffusers, nvidia in _BLOCK_PARTS:
        name = name.replace(diffusers, nvidia)
    for projection in "qkv":  # to_q -> q_proj
        name = name.replace(f".to_{projection}.", f".{projection}_proj.")
    return name.replace(".linear_1.", ".1.").replace(".linear_2.", ".2.")  # adaLN-LoRA's Sequential indices


def release_buffers(config: dict[str, Any], counters: tuple[int, int, int, float] = (1200, 300, 150, 2.5)
                    ) -> dict[str, torch.Tensor]:
    """What MiniTrainDIT's state dict holds beside the weights: WeightTrainingStat's counters, the RoPE's buffers
    (VideoRopePosition3DEmb: seq over the longest patched axis, the frequency exponents of the h/w and t shares of
    a head), and Transformer Engine's extra state of each cross-attention operator."""
    head = config["attention_head_dim"]
    dim_h = head // 6 * 2
    dim_t = head - 2 * dim_h
    longest = max(size // patch for size, patch in zip(config["max_size"], (1, 2, 2)))
    buffers = {
        "accum_video_sample_counter": torch.tensor(counters[0], dtype=torch.int64),
        "accum_image_sample_counter": torch.tensor(counters[1], dtype=torch.int64),
        "accum_iteration": torch.tensor(counters[2], dtype=torch.int64),
        "accum_train_in_hours": torch.tensor(counters[3], dtype=torch.float32),
        "pos_embedder.seq": torch.arange(longest, dtype=torch.float32),
        "pos_embedder.dim_spatial_range": torch.arange(0, dim_h, 2)[: dim_h // 2].float() / dim_h,
        "pos_embedder.dim_temporal_range": torch.arange(0, dim_t, 2)[: dim_t // 2].float() / dim_t,
    }
    for block in range(config["num_layers"]):
        buffers[f"blocks.{block}.cross_attn.attn_op._extra_state"] = EXTRA_STATE.clone()
    return buffers


def release_state_dict(model, prefix: str = "net.") -> dict[str, torch.Tensor]:
    """The model as MiniTrainDIT's state dict under ``prefix``: its weights and the buffers beside them."""
    weights = {original_name(name): tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return {prefix + name: tensor for name, tensor in {**weights, **release_buffers(dict(model.config))}.items()}


def bf16_release(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """convert_distcp_to_pt.py's model_ema_bf16.pt: every fp32 tensor cast to bf16, the others as they are."""
    return {name: t.bfloat16() if t.dtype == torch.float32 else t for name, t in state_dict.items()}


def write_release_files(out: Path, trained, ema) -> dict[str, Path]:
    """convert_distcp_to_pt.py's three files for a run whose net is ``trained`` and whose net_ema is ``ema``."""
    out.mkdir(parents=True, exist_ok=True)
    ema_fp32 = release_state_dict(ema)
    files = {"model.pt": {**release_state_dict(trained), **release_state_dict(ema, "net_ema.")},
             "model_ema_fp32.pt": ema_fp32, "model_ema_bf16.pt": bf16_release(ema_fp32)}
    for name, state_dict in files.items():
        torch.save(state_dict, out / name)
    return {name: out / name for name in files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--version", choices=["2", "2.5"], default="2")
    args = parser.parse_args()
    trained, ema = build_transformer(args.version, seed=0), build_transformer(args.version, seed=1)
    ema.save_pretrained(args.out / "transformer")
    write_release_files(args.out, trained, ema)


if __name__ == "__main__":
    main()
