"""HunyuanVideo FramePack inputs for tests: tiny models built by Diffusers' HunyuanVideoFramepackTransformer3DModel
(whose names are the release's; framepack_tiny.packed_shapes writes lllyasviel's module tree out independently), the
release folder (save_pretrained shards with the Packed class's config.json) and the single-file repack."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from cogvideox_fixtures import config_folder  # noqa: F401
from fixtures import SCRIPTS, cached_fixture
from safetensors.torch import save_file

sys.path.insert(0, str(SCRIPTS))
from framepack_tiny import (PACKED_CLASS, build_tiny_transformer, packed_shapes, release_config,  # noqa: E402,F401
                            tiny_config)

SINGLE_FILE = "FramePackI2V_HY_bf16.safetensors"  # the name of the repack ComfyUI's FramePack wrappers load


def tiny_pipeline() -> Path:
    """A complete tiny HunyuanVideoFramepackPipeline folder (seed 0), made once."""
    scripts = ("make_tiny_framepack.py", "framepack_tiny.py", "make_tiny_hunyuanvideo.py", "hunyuanvideo_tiny.py",
               "tiny_models.py")
    return cached_fixture("framepack-pipeline", scripts, [str(SCRIPTS / "make_tiny_framepack.py")])


def release_folder(folder: Path, model, max_shard_size: str = "40kB") -> Path:
    """lllyasviel/FramePackI2V_HY's layout: the Packed class's save_pretrained, sharded, its config.json naming that
    class (the Diffusers model's save with the config rewritten as the Packed class writes it)."""
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(release_config(config, config["_diffusers_version"]), indent=2)
                                        + "\n")
    return folder


def single_file(folder: Path, weights: dict[str, torch.Tensor]) -> Path:
    """The repacked single file: every tensor in one safetensors file, no config beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, folder / SINGLE_FILE)
    return folder / SINGLE_FILE


def forward_inputs(model, seed: int = 0) -> dict:
    """Inputs that reach every module: noisy latents, the three history latents, text, pooled text, image embeds."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config

    def noise(*shape):
        return torch.randn(*shape, generator=generator)

    channels = config.in_channels
    return dict(hidden_states=noise(1, channels, 2, 8, 8), timestep=torch.tensor([500.0]),
                encoder_hidden_states=noise(1, 5, config.text_embed_dim),
                encoder_attention_mask=torch.ones(1, 5, dtype=torch.long),
                pooled_projections=noise(1, config.pooled_projection_dim),
                image_embeds=noise(1, 3, config.image_proj_dim), indices_latents=torch.tensor([4, 5]),
                guidance=torch.tensor([6000.0]), latents_clean=noise(1, channels, 2, 8, 8),
                indices_latents_clean=torch.tensor([0, 3]), latents_history_2x=noise(1, channels, 2, 8, 8),
                indices_latents_history_2x=torch.tensor([1, 2]), latents_history_4x=noise(1, channels, 4, 8, 8),
                indices_latents_history_4x=torch.tensor([6, 7, 8, 9]))
