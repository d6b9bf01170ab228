"""MiniMax-H3 inputs for tests, written by the original code: DiffSynth-Studio's MiniMaxH3DiT (its port of the
release's module tree, the names and the per-head qkv row order the release's shards hold) at a tiny size, saved as a
release partition (huggingface_hub's sharded save beside a MiniMaxH3DiTModel config.json) and as a Comfy-Org-style
single file (the same tensors, qkv_proj's rows stacked [q; k; v] as DiffSynth-Studio's MiniMaxH3DiTComfy reads them).

DiffSynth-Studio's package import needs torchvision and more; its model file is loaded alone (diffsynth_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from diffsynth_models import diffsynth_module
from safetensors.torch import save_file

CLASS = "MiniMaxH3DiTModel"
# DiffSynth-Studio's MiniMaxH3DiT arguments as the release's config.json names them, at a tiny size (2 heads of 16,
# 2 rotary frequencies per axis: 12 of the 16 head channels rotated)
ORIGINAL_CONFIG = {
    "architectures": [CLASS], "num_layers": 2, "token_refiner_num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
    "attention_head_dim": 16, "ffn_hidden_size": 48, "latents_dim": 4, "audio_latents_dim": 8, "patch_size": [1, 2, 2],
    "text_dim": 24, "timestep_input_dim": 16, "time_embed_hidden_size": 32, "time_embed_dim": 16,
    "adaln_out_features": 6 * 32 * 3, "final_adaln_out_features": 2 * 32, "rope_inv_freq_len": 2, "norm_eps": 1e-5,
    "qk_norm_eps": 1e-5, "final_norm_eps": 1e-5,
}
# the release's fp32 modules (the patch projections, the timestep MLP, the output heads, the rotary buffer)
RELEASE_FP32 = ("video_patch_proj.", "audio_patch_proj.", "time_embedder.", "final_layer.video_out.",
                "final_layer.audio_out.", "rope.")


def diffsynth_model(seed: int, config: dict = ORIGINAL_CONFIG) -> torch.nn.Module:
    """DiffSynth-Studio's MiniMaxH3DiT from the release's config, every parameter seeded noise (fp32)."""
    module = diffsynth_module("minimax_h3_dit")
    model = module.MiniMaxH3DiT(**{k: v for k, v in config.items() if k != "architectures"})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name != "rope.inv_freq":  # the rotary frequencies are the module's own
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model.eval()


def release_dtypes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The release's mixed precision: bf16 but for its fp32 modules."""
    return {name: tensor if name.startswith(RELEASE_FP32) else tensor.to(torch.bfloat16) for name, tensor in state.items()}


def release_partition(folder: Path, state: dict[str, torch.Tensor], max_shard_size: str = "20kB",
                      config: dict | None = ORIGINAL_CONFIG) -> Path:
    """A release partition: huggingface_hub's sharded save of the module's state dict (model-0000i-of-0000n and the
    index), and the MiniMaxH3DiTModel config.json beside it (left out with ``config=None``)."""
    from huggingface_hub import save_torch_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict({n: t.contiguous() for n, t in state.items()}, folder, max_shard_size=max_shard_size)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def stacked_qkv(state: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    """The same model with every qkv_proj's rows stacked [q; k; v] (Comfy-Org's order) instead of per head."""
    def restack(weight: torch.Tensor) -> torch.Tensor:
        return weight.unflatten(0, (heads, 3, -1)).transpose(0, 1).flatten(0, 2).contiguous()

    return {name: restack(tensor) if name.endswith("attn.qkv_proj.weight") else tensor for name, tensor in state.items()}


def comfy_file(path: Path, state: dict[str, torch.Tensor], heads: int = ORIGINAL_CONFIG["num_attention_heads"]) -> Path:
    """A Comfy-Org-style single file of the module's tensors, qkv stacked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(stacked_qkv(state, heads), path)
    return path


def packed_inputs(seed: int, video_rows: int = 4, audio_rows: int = 2, text_rows: int = 3) -> dict:
    """One packed sequence (text rows, then video, then audio) at two noise levels, as both forwards take it."""
    generator = torch.Generator().manual_seed(seed)
    total = text_rows + video_rows + audio_rows
    text = torch.arange(text_rows)
    video = torch.arange(text_rows, text_rows + video_rows)
    audio = torch.arange(text_rows + video_rows, total)
    tags = torch.zeros(total, dtype=torch.long)
    tags[text], tags[audio] = 1, 2
    timestep_indices = torch.zeros(total, dtype=torch.long)
    timestep_indices[video[: video_rows // 2]] = 1  # conditioning rows at another noise level
    return {
        "video": torch.randn(video_rows, 16, generator=generator), "audio": torch.randn(audio_rows, 8, generator=generator),
        "text": torch.randn(text_rows, 24, generator=generator), "timesteps": torch.tensor([0.7, 0.0]),
        "timestep_indices": timestep_indices, "tags": tags,
        "positions": torch.randint(0, 5, (total, 3), generator=generator),
        "video_indices": video, "audio_indices": audio, "text_indices": text,
    }


def diffsynth_forward(model: torch.nn.Module, given: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """DiffSynth-Studio's forward on the packed inputs: (video rows, audio rows)."""
    total = given["tags"].shape[0]
    video = torch.zeros(1, total, 16).index_copy(1, given["video_indices"], given["video"][None])
    audio = torch.zeros(1, total, 8).index_copy(1, given["audio_indices"], given["audio"][None])
    text_rows = given["text_indices"].shape[0]
    with torch.no_grad():
        return model(
            video, audio, given["positions"][None], given["timesteps"], given["timestep_indices"], None,
            given["tags"], given["text"], {"position_ids": given["video_indices"]},
            {"position_ids": given["audio_indices"]}, {"position_ids": given["text_indices"]},
            {"position_ids": given["video_indices"]}, {"cu_seqlens_q": torch.tensor([0, total]), "max_seqlen_q": total},
            {"cu_seqlens_q": torch.tensor([0, text_rows]), "max_seqlen_q": text_rows}, skip_mask_out_condition=True)


def diffusers_forward(model: torch.nn.Module, given: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """MiniMaxH3Transformer3DModel's forward on the same inputs: (video rows, audio rows)."""
    with torch.no_grad():
        video, audio = model(
            hidden_states=given["video"][None], audio_hidden_states=given["audio"][None],
            encoder_hidden_states=given["text"][None], timestep=given["timesteps"],
            timestep_indices=given["timestep_indices"], token_tags=given["tags"], position_ids=given["positions"],
            video_indices=given["video_indices"], audio_indices=given["audio_indices"],
            text_indices=given["text_indices"], return_dict=False)
    return video[0], audio[0]


def diffusers_config() -> dict:
    """The tiny model's MiniMaxH3Transformer3DModel config (what the release's config.json says)."""
    return {"num_attention_heads": 2, "attention_head_dim": 16, "hidden_size": 32, "num_layers": 2,
            "num_refiner_layers": 1, "ffn_dim": 48, "in_channels": 4, "audio_in_channels": 8, "patch_size": (1, 2, 2),
            "text_dim": 24, "freq_dim": 16, "time_embed_hidden_dim": 32, "time_embed_dim": 16, "rope_freq_dim": 2}
