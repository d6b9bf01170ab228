"""Build a tiny but complete Mochi-1 pipeline folder, fully offline, and write Mochi's original VAE files
(tests, README, benchmark set-up).

    python scripts/make_tiny_mochi.py OUT --seed 0

OUT is what ``MochiPipeline.save_pretrained`` writes: the real classes at toy sizes, every tensor seeded noise, the T5
encoder and tokenizer of make_tiny_cogvideox.py, FlowMatchEulerDiscreteScheduler(invert_sigmas=True).

The transformer keeps the release's 48 layers, thin: Diffusers' single-file converter (the tests' judge) hard-codes
48, and a width of 96 (2 heads of 48) is one where Diffusers' feed-forward (8/3 of the width) and the original's
(the same, rounded up to a multiple of 256) agree: 256 for both streams.

``original_vae_files`` is an independent writer of genmo's encoder.safetensors and decoder.safetensors from
AutoencoderKLMochi weights, written here from the layout's facts with plain loops (no key map): Diffusers ships no
converter for Mochi's VAE, so this is the ground truth the VAE key map is checked against.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import (TINY_TEXT_LENGTH, build_text_encoder, build_tokenizer, pipeline_command,  # noqa: E402
                         randomize_)

RELEASE_LAYERS = 48
# The T5 width: Mochi's attention pooler splits the text features over 8 heads.
TEXT_WIDTH = 32


def tiny_transformer_config(num_layers: int = RELEASE_LAYERS) -> dict[str, Any]:
    return dict(num_attention_heads=2, attention_head_dim=48, num_layers=num_layers, pooled_projection_dim=96,
                in_channels=12, text_embed_dim=TEXT_WIDTH, max_sequence_length=TINY_TEXT_LENGTH)


def original_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """genmo's AsymmDiTJoint constructor kwargs for a MochiTransformer3DModel config (what its fine-tuner saves)."""
    return dict(depth=config["num_layers"], patch_size=config.get("patch_size", 2),
                num_heads=config["num_attention_heads"],
                hidden_size_x=config["num_attention_heads"] * config["attention_head_dim"],
                hidden_size_y=config["pooled_projection_dim"], mlp_ratio_x=4.0, mlp_ratio_y=4.0,
                in_channels=config["in_channels"], qk_norm=True, qkv_bias=False, out_bias=True,
                patch_embed_bias=True, timestep_mlp_bias=True, timestep_scale=1000.0,
                t5_feat_dim=config["text_embed_dim"], t5_token_length=config["max_sequence_length"],
                rope_theta=10000.0)


# The release's block structure (layers_per_block (3, 3, 4, 6, 3)) at the narrowest widths its 32-group norms take.
TINY_VAE = dict(encoder_block_out_channels=(32, 32, 32, 32), decoder_block_out_channels=(32, 32, 32, 32))


def build_transformer(seed: int = 0, num_layers: int = RELEASE_LAYERS):
    from diffusers import MochiTransformer3DModel

    torch.manual_seed(seed)
    return randomize_(MochiTransformer3DModel(**tiny_transformer_config(num_layers)), seed).eval()


def build_vae(seed: int = 0):
    from diffusers import AutoencoderKLMochi

    torch.manual_seed(seed)
    return randomize_(AutoencoderKLMochi(**TINY_VAE), seed + 1).eval()


def build_tiny_pipeline(seed: int = 0):
    from diffusers import FlowMatchEulerDiscreteScheduler, MochiPipeline

    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    return MochiPipeline(tokenizer=tokenizer, text_encoder=build_text_encoder(len(tokenizer), TEXT_WIDTH),
                         vae=build_vae(seed),
                         transformer=build_transformer(seed),
                         scheduler=FlowMatchEulerDiscreteScheduler(invert_sigmas=True))


def render(folder: str | os.PathLike, steps: int = 2, seed: int = 0):
    """Load FOLDER with MochiPipeline and render 7 frames at 32x32: the frames as PIL images."""
    from diffusers import MochiPipeline

    pipeline = MochiPipeline.from_pretrained(str(folder))
    pipeline.set_progress_bar_config(disable=True)
    return pipeline(prompt="a panda playing a guitar", height=32, width=32, num_frames=7, num_inference_steps=steps,
                    max_sequence_length=TINY_TEXT_LENGTH, generator=torch.Generator().manual_seed(seed),
                    output_type="pil").frames[0]


# -- genmo's VAE files, written independently of cogexport's key map --------------------------------------------
_RESNET = {"norm1.norm_layer": "stack.0", "conv1.conv": "stack.2", "norm2.norm_layer": "stack.3",
           "conv2.conv": "stack.5"}


def _resnet(out: dict, source: dict, diffusers_prefix: str, original_prefix: str) -> None:
    for diffusers_part, original_part in _RESNET.items():
        for p in ("weight", "bias"):
            out[f"{original_prefix}.{original_part}.{p}"] = source[f"{diffusers_prefix}.{diffusers_part}.{p}"]


def _attention(out: dict, source: dict, block: str, index: int, original_prefix: str) -> None:
    attention = f"{block}.attentions.{index}"
    out[f"{original_prefix}.attn_block.attn.qkv.weight"] = torch.cat(
        [source[f"{attention}.to_{x}.weight"] for x in ("q", "k", "v")])
    for p in ("weight", "bias"):
        out[f"{original_prefix}.attn_block.attn.out.{p}"] = source[f"{attention}.to_out.0.{p}"]
        out[f"{original_prefix}.attn_block.norm.{p}"] = source[f"{block}.norms.{index}.norm_layer.{p}"]


def _count(source: dict, prefix: str) -> int:
    return len({name[len(prefix):].split(".")[0] for name in source if name.startswith(prefix)})


def original_vae_files(state_dict: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(encoder.safetensors, decoder.safetensors) contents for AutoencoderKLMochi weights, in genmo's names."""
    sd = {name: tensor.contiguous() for name, tensor in state_dict.items()}
    decoder: dict[str, torch.Tensor] = {}
    for p in ("weight", "bias"):
        decoder[f"blocks.0.0.{p}"] = sd[f"decoder.conv_in.{p}"]
        decoder[f"output_proj.{p}"] = sd[f"decoder.proj_out.{p}"]
    for i in range(_count(sd, "decoder.block_in.resnets.")):  # blocks.0: conv_in, then the input residual blocks
        _resnet(decoder, sd, f"decoder.block_in.resnets.{i}", f"blocks.0.{i + 1}")
    for level in range(_count(sd, "decoder.up_blocks.")):
        for i in range(_count(sd, f"decoder.up_blocks.{level}.resnets.")):
            _resnet(decoder, sd, f"decoder.up_blocks.{level}.resnets.{i}", f"blocks.{level + 1}.blocks.{i}")
        for p in ("weight", "bias"):
            decoder[f"blocks.{level + 1}.proj.{p}"] = sd[f"decoder.up_blocks.{level}.proj.{p}"]
    last = _count(sd, "decoder.up_blocks.") + 1
    for i in range(_count(sd, "decoder.block_out.resnets.")):
        _resnet(decoder, sd, f"decoder.block_out.resnets.{i}", f"blocks.{last}.{i}")

    encoder: dict[str, torch.Tensor] = {}
    for p in ("weight", "bias"):
        encoder[f"layers.0.{p}"] = sd[f"encoder.proj_in.{p}"]
        encoder[f"output_norm.{p}"] = sd[f"encoder.norm_out.norm_layer.{p}"]
    encoder["output_proj.weight"] = sd["encoder.proj_out.weight"]
    position = 1  # layers: proj_in, the input residual blocks, the down levels, the output blocks
    for i in range(_count(sd, "encoder.block_in.resnets.")):
        _resnet(encoder, sd, f"encoder.block_in.resnets.{i}", f"layers.{position}")
        position += 1
    for level in range(_count(sd, "encoder.down_blocks.")):
        block = f"encoder.down_blocks.{level}"
        for p in ("weight", "bias"):
            encoder[f"layers.{position}.layers.0.{p}"] = sd[f"{block}.conv_in.conv.{p}"]
        for i in range(_count(sd, f"{block}.resnets.")):
            _resnet(encoder, sd, f"{block}.resnets.{i}", f"layers.{position}.layers.{i + 1}")
            _attention(encoder, sd, block, i, f"layers.{position}.layers.{i + 1}")
        position += 1
    for i in range(_count(sd, "encoder.block_out.resnets.")):
        _resnet(encoder, sd, f"encoder.block_out.resnets.{i}", f"layers.{position}")
        _attention(encoder, sd, "encoder.block_out", i, f"layers.{position}")
        position += 1
    used = len(encoder) + len(decoder) + sum(1 for name in sd if name.endswith((".to_q.weight", ".to_k.weight")))
    if used != len(sd):
        raise ValueError(f"the writer placed {used} of {len(sd)} VAE tensors")
    return encoder, decoder


main = pipeline_command(build_tiny_pipeline, f"Mochi ({RELEASE_LAYERS} thin layers)")


if __name__ == "__main__":
    main()
