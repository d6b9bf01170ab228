"""MiniMax-H3's two VAEs for tests, written by the original code at a tiny size: DiffSynth-Studio's MiniMaxH3VideoVAE
(its port of the release's module tree) saved under the release's names, and Diffusers' AutoencoderKLMiniMaxH3Audio,
whose names are the release's own (Diffusers' conversion script copies them unchanged).

The release's video VAE names differ from DiffSynth-Studio's module in three places, which its state dict converter
(diffsynth/utils/state_dict_converters/minimax_h3_video_vae.py) undoes when it loads the release: register_tokens,
scale1 and scale2 carry no ``.weight`` (DiffSynth wraps them in a module), and the release holds the decoder's
mask_token, a zero buffer of the training objective both ports leave out."""

from __future__ import annotations

import sys
import types

import torch
from diffsynth_models import diffsynth_module

# the tiny video VAE: two encoder levels of 32 and 64 channels (GroupNorm's 32 groups), 4 latent channels, a ViT
# decoder of one layer, 2 heads of 32; the release's temporal geometry (clip_length 17, token_drop 3) as it is
VIDEO_VAE = {"block_out_channels": [32, 64], "layers_per_block": 1, "spatial_downsample_factors": [2, 2],
             "temporal_downsample_factors": [2, 2], "latent_channels": 4, "decoder_num_layers": 1,
             "decoder_num_attention_heads": 2, "decoder_attention_head_dim": 32,
             "latents_mean": [0.1, -0.2, 0.3, 0.0], "latents_std": [1.5, 0.5, 1.0, 2.0]}
# the names DiffSynth-Studio's module adds .weight to
_WRAPPED = ("decoder.register_tokens", ".scale1", ".scale2")
# the release's mask token: shaped as one decoder token (only its name matters to the export, which keeps it aside)
MASK_TOKEN = "decoder.mask_token"


def _video_vae_module() -> types.ModuleType:
    """diffsynth.models.minimax_h3_video_vae. It imports torchvision's Normalize for its pixel processor, which the
    tests never call and the venv does not install: a stand-in is there only while the file is imported."""
    if "torchvision" in sys.modules:
        return diffsynth_module("minimax_h3_video_vae")
    transforms = types.ModuleType("torchvision.transforms")
    transforms.Normalize = lambda *args, **kwargs: None
    sys.modules["torchvision"], sys.modules["torchvision.transforms"] = types.ModuleType("torchvision"), transforms
    try:
        return diffsynth_module("minimax_h3_video_vae")
    finally:
        del sys.modules["torchvision"], sys.modules["torchvision.transforms"]


def diffsynth_video_vae(seed: int) -> torch.nn.Module:
    """DiffSynth-Studio's MiniMaxH3VideoVAE at VIDEO_VAE's size, every parameter seeded noise (fp32). Its constructor
    fixes the decoder at the release's width (36 layers of 32 heads of 64): its ViT3DDecoder is built at the tiny
    width instead, from the arguments the constructor passes."""
    module = _video_vae_module()
    levels = VIDEO_VAE["block_out_channels"]
    full_decoder = module.ViT3DDecoder

    def tiny_decoder(**arguments):
        return full_decoder(**{**arguments, "num_layers": VIDEO_VAE["decoder_num_layers"],
                               "heads": VIDEO_VAE["decoder_num_attention_heads"],
                               "dim_head": VIDEO_VAE["decoder_attention_head_dim"]})

    module.ViT3DDecoder = tiny_decoder  # only while the constructor runs: a full-width decoder takes minutes to make
    try:
        model = module.MiniMaxH3VideoVAE(ch=levels[0], ch_mult=[c // levels[0] for c in levels], num_res_blocks=1,
                                         space_down=VIDEO_VAE["spatial_downsample_factors"],
                                         time_down=VIDEO_VAE["temporal_downsample_factors"],
                                         embed_dim=VIDEO_VAE["latent_channels"],
                                         z_channels=VIDEO_VAE["latent_channels"])
    finally:
        module.ViT3DDecoder = full_decoder
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return model.eval()


def release_video_vae_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's tensors under the release's names (what DiffSynth-Studio's converter reads), mask token too."""
    state = {}
    for name, tensor in model.state_dict().items():
        bare = name.removesuffix(".weight")
        state[bare if bare.endswith(_WRAPPED) else name] = tensor.clone()
    width = VIDEO_VAE["decoder_num_attention_heads"] * VIDEO_VAE["decoder_attention_head_dim"]
    state[MASK_TOKEN] = torch.zeros(1, 1, width)
    return state


def video_clip(seed: int, frames: int = 5, size: int = 16) -> torch.Tensor:
    return torch.randn(1, 3, frames, size, size, generator=torch.Generator().manual_seed(seed))


# the tiny audio VAE: two encoder and two decoder rates of 2, one resblock kernel
AUDIO_VAE = {"encoder_dim": 4, "encoder_rates": [2, 2], "latent_dim": 16, "latent_channels": 4,
             "num_attention_heads": 2, "decoder_dim": 16, "decoder_rates": [2, 2], "decoder_kernel_sizes": [4, 4],
             "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3]], "sampling_rate": 16000,
             "latents_mean": [0.0, 0.1, -0.1, 0.2], "latents_std": [1.0, 2.0, 0.5, 1.5]}


def audio_vae(seed: int) -> torch.nn.Module:
    """Diffusers' AutoencoderKLMiniMaxH3Audio at AUDIO_VAE's size, every parameter seeded noise (fp32)."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    model = AutoencoderKLMiniMaxH3Audio(**AUDIO_VAE)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return model.eval()
