"""Tiny NVIDIA Cosmos Transfer 2.5 models and their release file, made in-process (tests, docs):

- ``build_models(seed)``: a real Diffusers CosmosTransformer3DModel (the base: Predict 2.5's model with the image
  context of Transfer's reference image) and CosmosControlNetModel (the control branch) at toy size, every tensor
  seeded noise, the control net's copies of the base's embedders equal to the base's, as they are one module in
  NVIDIA's network;
- ``release_state_dict(transformer, controlnet)``: both as NVIDIA's ``MinimalV4LVGControlVaceDiT`` holds them in one
  state dict (``net.`` names: the base under its Predict names, the control branch under ``control_embedder.`` and
  ``control_blocks.``), with the buffers a release carries beside the weights, written here from the layout's facts
  with plain string rules (no key map).

    python scripts/make_tiny_cosmos_transfer.py OUT
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
from make_tiny_cosmos import EXTRA_STATE, HEAD_DIM, HEADS, MAX_SIZE, TEXT_WIDTH, original_name  # noqa: E402
from make_tiny_cosmos import bf16_release, release_buffers, tiny_config  # noqa: E402
from tiny_models import randomize_  # noqa: E402

IMAGE_WIDTH = 20  # the reference image encoder's width (SigLIP2's 1152 in the release)
MODALITIES = 2  # control inputs the branch takes at once (8 in the release): 16 latent channels each
# the shared modules: the control net's copy of each of the base transformer's (Diffusers' converter copies them)
SHARED = {"patch_embed_base.": "patch_embed.", "time_embed.": "time_embed.", "img_context_proj.": "img_context_proj.",
          "crossattn_proj.": "crossattn_proj."}


def transformer_config() -> dict[str, Any]:
    """Predict 2.5's tiny config with Transfer's image context and a control block feeding every base block."""
    return {**tiny_config("2.5"), "controlnet_block_every_n": 1, "img_context_dim_in": IMAGE_WIDTH,
            "img_context_dim_out": HEADS * HEAD_DIM, "img_context_num_tokens": 4}


def controlnet_config() -> dict[str, Any]:
    base = transformer_config()
    return dict(n_controlnet_blocks=base["num_layers"], in_channels=16 * MODALITIES + 1 + 1,
                latent_channels=base["in_channels"] + 1, model_channels=HEADS * HEAD_DIM,
                num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, text_embed_dim=TEXT_WIDTH, adaln_lora_dim=8,
                max_size=MAX_SIZE, rope_scale=(1.0, 3.0, 3.0), extra_pos_embed_type=None,
                img_context_dim_in=IMAGE_WIDTH, img_context_dim_out=HEADS * HEAD_DIM, use_crossattn_projection=True,
                crossattn_proj_in_channels=base["crossattn_proj_in_channels"],
                encoder_hidden_states_channels=TEXT_WIDTH)


def build_models(seed: int = 0):
    from diffusers import CosmosControlNetModel, CosmosTransformer3DModel

    torch.manual_seed(seed)
    transformer = randomize_(CosmosTransformer3DModel(**transformer_config()), seed).eval()
    controlnet = randomize_(CosmosControlNetModel(**controlnet_config()), seed + 100).eval()
    base = transformer.state_dict()
    shared = {name: base[SHARED[prefix] + name[len(prefix):]] for name in controlnet.state_dict()
              for prefix in SHARED if name.startswith(prefix)}
    controlnet.load_state_dict(shared, strict=False)
    return transformer, controlnet


def control_name(name: str) -> str | None:
    """The control branch's own tensors in NVIDIA's names (None for the base's embedders it shares)."""
    if name == "patch_embed.proj.weight":
        return "control_embedder.proj.1.weight"
    if not name.startswith("control_blocks."):
        return None
    block, rest = name.removeprefix("control_blocks.").split(".", 1)
    if rest.startswith(("before_proj.", "after_proj.")):  # the zero-initialised projections, named alike
        return f"control_blocks.{block}.{rest}"
    return "control_" + original_name(f"transformer_blocks.{block}.{rest}")


def release_state_dict(transformer, controlnet, prefix: str = "net.") -> dict[str, torch.Tensor]:
    """Both models as one MinimalV4LVGControlVaceDiT state dict under ``prefix``, the buffers beside included (the
    control blocks' attention operators carry Transformer Engine's extra state as the base blocks' do)."""
    weights = {original_name(name): t.detach().clone() for name, t in transformer.state_dict().items()}
    for name, tensor in controlnet.state_dict().items():
        if (nvidia := control_name(name)) is not None:
            weights[nvidia] = tensor.detach().clone()
    buffers = release_buffers(dict(transformer.config))
    for block in range(controlnet.config.n_controlnet_blocks):
        buffers[f"control_blocks.{block}.cross_attn.attn_op._extra_state"] = EXTRA_STATE.clone()
    return {prefix + name: tensor for name, tensor in {**weights, **buffers}.items()}


def write_release(out: Path, transformer, controlnet) -> dict[str, Path]:
    """The fp32 state dict (model_ema_fp32.pt) and the release's bf16 one (model_ema_bf16.pt)."""
    out.mkdir(parents=True, exist_ok=True)
    fp32 = release_state_dict(transformer, controlnet)
    files = {"model_ema_fp32.pt": fp32, "model_ema_bf16.pt": bf16_release(fp32)}
    for name, state_dict in files.items():
        torch.save(state_dict, out / name)
    return {name: out / name for name in files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    transformer, controlnet = build_models()
    transformer.save_pretrained(args.out / "transformer")
    controlnet.save_pretrained(args.out / "controlnet")
    write_release(args.out / "release", transformer, controlnet)


if __name__ == "__main__":
    main()
