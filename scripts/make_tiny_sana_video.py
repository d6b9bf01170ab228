"""Tiny SanaVideo transformers and NVlabs' release file, made in-process (tests, docs):

- ``build_transformer(seed)``: a real Diffusers SanaVideoTransformer3DModel at toy size (2 layers, 2 heads of 8),
  every tensor seeded noise, built like SANA-Video_2B_480p (Wan VAE latents, patch (1, 2, 2), mlp_ratio 3);
- ``release_state_dict(model)``: the same weights as NVlabs' SanaMSVideo holds them (self-attention's q, k, v fused
  into ``attn.qkv``, cross-attention's k, v into ``kv_linear``, the feed-forward's convolutions under
  ``mlp.*_conv.conv``), with the tensors the release carries beside them that Diffusers' class has no place for (the
  null caption ``y_embedder.y_embedding``, the unused ``pos_embed`` buffer, the ``logvar_linear`` head), written here
  from the layout's facts with plain string rules (no key map): the ground truth the key map is checked against;
- ``write_release(out, model)``: ``SANA_Video_2B_480p.pth`` as the release ships it (torch.save of
  ``{"state_dict": ...}``, which Diffusers' conversion script pops) and a safetensors copy of that state dict;
- ``build_tiny_pipeline(seed)``: a SanaVideoPipeline of tiny parts: a 2-layer Gemma2Model (the release's text encoder
  is gemma-2-2b-it's decoder) whose width is the transformer's caption_channels, a Gemma BPE tokenizer over a
  written-out vocabulary (Gemma's specials pad 0, eos 1, bos 2, unk 3; byte fallback), Wan 2.1's VAE at toy size and
  the conversion script's default scheduler (flow DPM-Solver, shift 8).

    python scripts/make_tiny_sana_video.py OUT     # OUT/transformer, OUT/release/, OUT/pipeline/
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import CHARACTERS, TOKENIZER_WORDS, randomize_, spelling_merges  # noqa: E402
from wan_tiny_configs import build_tiny_vae  # noqa: E402

RELEASE = "SANA_Video_2B_480p.pth"
SAFETENSORS_COPY = "SANA_Video_2B_480p.safetensors"
CAPTION_WIDTH = 24  # the tiny Gemma's hidden size
CAPTION_TOKENS = 8  # the release's model_max_length (300) at toy size: y_embedding's rows
POSITIONS = 16  # the release's pos_embed patches at toy size (a zero buffer its RoPE never reads)


def tiny_config(**overrides: Any) -> dict[str, Any]:
    """The 480p release's config (Diffusers' conversion script's transformer_kwargs) at toy size."""
    return dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
                caption_channels=CAPTION_WIDTH, mlp_ratio=3.0, attention_bias=False, sample_size=30,
                patch_size=(1, 2, 2), norm_elementwise_affine=False, norm_eps=1e-6,
                qk_norm="rms_norm_across_heads", rope_max_seq_len=1024) | overrides


def build_transformer(seed: int = 0, **overrides: Any):
    from diffusers import SanaVideoTransformer3DModel

    torch.manual_seed(seed)
    return randomize_(SanaVideoTransformer3DModel(**tiny_config(**overrides)), seed).eval()


# Diffusers' names -> SanaMSVideo's (the layout's facts: NVlabs' sana_multi_scale_video.py module tree)
_TOP = {"patch_embedding.": "x_embedder.proj.", "caption_projection.linear_1.": "y_embedder.y_proj.fc1.",
        "caption_projection.linear_2.": "y_embedder.y_proj.fc2.",
        "time_embed.emb.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
        "time_embed.emb.timestep_embedder.linear_2.": "t_embedder.mlp.2.", "time_embed.linear.": "t_block.1.",
        "caption_norm.": "attention_y_norm.", "proj_out.": "final_layer.linear.",
        "scale_shift_table": "final_layer.scale_shift_table"}
_BLOCK = {"attn1.norm_q.": "attn.q_norm.", "attn1.norm_k.": "attn.k_norm.", "attn1.to_out.0.": "attn.proj.",
          "attn2.to_q.": "cross_attn.q_linear.", "attn2.norm_q.": "cross_attn.q_norm.",
          "attn2.norm_k.": "cross_attn.k_norm.", "attn2.to_out.0.": "cross_attn.proj.",
          "ff.conv_inverted.": "mlp.inverted_conv.conv.", "ff.conv_depth.": "mlp.depth_conv.conv.",
          "ff.conv_point.": "mlp.point_conv.conv.", "ff.conv_temp.": "mlp.t_conv.",
          "scale_shift_table": "scale_shift_table"}


def original_name(name: str) -> str:
    if name.startswith("transformer_blocks."):
        _, block, rest = name.split(".", 2)
        part = next(p for p in _BLOCK if rest.startswith(p))
        return f"blocks.{block}.{_BLOCK[part]}{rest[len(part):]}"
    part = next(p for p in _TOP if name.startswith(p))
    return _TOP[part] + name[len(part):]


def release_buffers(config: dict[str, Any], seed: int = 7) -> dict[str, torch.Tensor]:
    """What SanaMSVideo's state dict holds beside the weights Diffusers takes: the learned null caption (classifier-
    free guidance's empty prompt), the zero sin-cos pos_embed buffer (the video model uses RoPE), the logvar head."""
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    generator = torch.Generator().manual_seed(seed)
    return {"y_embedder.y_embedding": torch.randn(CAPTION_TOKENS, config["caption_channels"], generator=generator),
            "pos_embed": torch.zeros(1, POSITIONS, hidden),
            "logvar_linear.weight": torch.randn(1, hidden, generator=generator),
            "logvar_linear.bias": torch.randn(1, generator=generator)}


def release_state_dict(model) -> dict[str, torch.Tensor]:
    """The model as SanaMSVideo's state dict: fused projections, its own names, and the buffers beside them."""
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    fused: dict[str, torch.Tensor] = {}
    for block in range(model.config.num_layers):
        attn1, attn2 = f"transformer_blocks.{block}.attn1.", f"transformer_blocks.{block}.attn2."
        fused[f"blocks.{block}.attn.qkv.weight"] = torch.cat([weights.pop(f"{attn1}to_{p}.weight") for p in "qkv"])
        for kind in ("weight", "bias"):
            fused[f"blocks.{block}.cross_attn.kv_linear.{kind}"] = torch.cat(
                [weights.pop(f"{attn2}to_{p}.{kind}") for p in "kv"])
    renamed = {original_name(name): tensor for name, tensor in weights.items()}
    return {**renamed, **fused, **release_buffers(dict(model.config))}


def write_release(out: Path, model) -> dict[str, Path]:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state_dict = release_state_dict(model)
    torch.save({"state_dict": state_dict}, out / RELEASE)
    save_file(state_dict, out / SAFETENSORS_COPY)
    return {"pth": out / RELEASE, "safetensors": out / SAFETENSORS_COPY}


def build_gemma_tokenizer():
    """Gemma's BPE tokenizer (transformers' GemmaTokenizer: spaces as ▁, byte fallback) over Gemma's specials, the
    letters and TOKENIZER_WORDS merged whole with their leading ▁, so a short prompt is a few tokens."""
    from transformers import GemmaTokenizer

    vocabulary = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    for piece in ["▁", *CHARACTERS]:
        vocabulary.setdefault(piece, len(vocabulary))
    merges = spelling_merges(vocabulary, [["▁", *word] for word in sorted(set(TOKENIZER_WORDS))])
    return GemmaTokenizer(vocab=vocabulary, merges=merges)


def build_gemma_text_encoder(vocab_size: int, width: int = CAPTION_WIDTH):
    """A 2-layer Gemma2Model (the decoder the conversion script takes from gemma-2-2b-it) of ``width``."""
    from transformers import Gemma2Config, Gemma2Model

    config = Gemma2Config(vocab_size=vocab_size, hidden_size=width, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=12, max_position_embeddings=1024,
                          pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    return Gemma2Model(config).eval()


def build_tiny_pipeline(seed: int = 0, task: str = "t2v"):
    """SanaVideoPipeline with the script's default scheduler, or (``i2v``) SanaImageToVideoPipeline with the only one
    the script allows it (flow Euler, shift 8)."""
    from diffusers import (DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler, SanaImageToVideoPipeline,
                           SanaVideoPipeline)

    tokenizer = build_gemma_tokenizer()
    if task == "i2v":
        pipeline_class, scheduler = SanaImageToVideoPipeline, FlowMatchEulerDiscreteScheduler(shift=8.0)
    else:
        pipeline_class = SanaVideoPipeline
        scheduler = DPMSolverMultistepScheduler(flow_shift=8.0, use_flow_sigmas=True, prediction_type="flow_prediction")
    return pipeline_class(tokenizer=tokenizer, text_encoder=build_gemma_text_encoder(len(tokenizer)),
                          vae=build_tiny_vae("2.1", seed), transformer=build_transformer(seed), scheduler=scheduler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    model = build_transformer(seed=0)
    model.save_pretrained(args.out / "transformer")
    write_release(args.out / "release", model)
    build_tiny_pipeline(seed=0).save_pretrained(args.out / "pipeline")


if __name__ == "__main__":
    main()
