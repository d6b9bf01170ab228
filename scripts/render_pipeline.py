"""Render a few frames from a CogVideoX or Wan pipeline folder on CPU: proof that a folder loads and runs.

    python scripts/render_pipeline.py FOLDER --out frames.gif --steps 2

FOLDER is a Diffusers pipeline folder (``model_index.json`` + components), e.g. one written by
make_tiny_cogvideox.py or exported by cogexport. Text-to-video or image-to-video is read from
``model_index.json``; image-to-video gets a synthetic gradient image, so nothing outside FOLDER is needed.
Size and frame count default to the transformer's sample size (tiny for tiny folders). Writes a GIF
(Pillow) or, for ``.mp4``, a video through diffusers' ``export_to_video`` (needs imageio-ffmpeg).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder must never reach for the Hub

import click
import torch

PIPELINES = {"CogVideoXPipeline": "t2v", "CogVideoXImageToVideoPipeline": "i2v", "WanPipeline": "t2v",
             "WanImageToVideoPipeline": "i2v"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def pipeline_class_name(folder: str | os.PathLike) -> str:
    """The pipeline class recorded in FOLDER/model_index.json (one of PIPELINES)."""
    name = json.loads((Path(folder) / "model_index.json").read_text())["_class_name"]
    if name not in PIPELINES:
        raise ValueError(f"{folder}: model_index.json names {name}; expected one of {sorted(PIPELINES)}")
    return name


def gradient_image(width: int, height: int):
    """A deterministic colour gradient to condition image-to-video on."""
    import numpy as np
    from PIL import Image

    ys, xs = np.mgrid[0:height, 0:width]
    rgb = np.stack([xs * 255 // max(width - 1, 1), ys * 255 // max(height - 1, 1), np.full_like(xs, 128)], axis=-1)
    return Image.fromarray(rgb.astype("uint8"), "RGB")


def _sample_size(pipeline) -> tuple[int, int, int, int]:
    """Height, width, frames and text length to render at: CogVideoX's transformer records its sample size (and its
    text positions are sized for exactly max_text_seq_length tokens); Wan's does not, so the smallest clip its VAE and
    patching take (2x3 patches, 2 latent frames) and the tokenizer's own length."""
    config = pipeline.transformer.config
    spatial = pipeline.vae_scale_factor_spatial
    if "sample_height" in config:
        return config.sample_height * spatial, config.sample_width * spatial, config.sample_frames, \
            config.max_text_seq_length
    unit = spatial * config.patch_size[-1]
    return 2 * unit, 3 * unit, pipeline.vae_scale_factor_temporal + 1, pipeline.tokenizer.model_max_length


def save_frames(frames: list, out: Path, fps: int = 8) -> None:
    if out.suffix.lower() == ".gif":
        frames[0].save(out, save_all=True, append_images=frames[1:], duration=1000 // fps, loop=0)
    else:
        from diffusers.utils import export_to_video

        export_to_video(frames, str(out), fps=fps)


def render(
    folder: str | os.PathLike,
    out: str | os.PathLike = "frames.gif",
    *,
    prompt: str = "a panda playing a guitar",
    steps: int = 2,
    seed: int = 0,
    guidance_scale: float = 6.0,
    dtype: str = "fp32",
    height: int | None = None,
    width: int | None = None,
    num_frames: int | None = None,
) -> dict:
    """Load FOLDER, render a clip on CPU and write it to OUT. Returns {"path", "frames", "variant", "size"}."""
    import diffusers

    name = pipeline_class_name(folder)
    pipeline = getattr(diffusers, name).from_pretrained(str(folder), dtype=DTYPES[dtype])
    pipeline.set_progress_bar_config(disable=True)
    config = pipeline.transformer.config
    default_height, default_width, default_frames, text_length = _sample_size(pipeline)
    height, width = height or default_height, width or default_width
    kwargs = {}
    if PIPELINES[name] == "i2v":
        kwargs["image"] = gradient_image(width, height)
        if config.get("pos_embed_seq_len"):  # Wan FLF2V: conditioned on the first and the last frame
            kwargs["last_image"] = gradient_image(width, height).transpose(0)
    result = pipeline(
        prompt=prompt,
        height=height,
        width=width,
        num_frames=num_frames or default_frames,
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        max_sequence_length=text_length,
        generator=torch.Generator().manual_seed(seed),
        output_type="pil",
        **kwargs,
    )
    frames = result.frames[0]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_frames(frames, out)
    return {"path": str(out), "frames": len(frames), "variant": PIPELINES[name], "size": frames[0].size}


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("frames.gif"), show_default=True)
@click.option("--prompt", default="a panda playing a guitar", show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--guidance-scale", type=float, default=6.0, show_default=True)
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="fp32", show_default=True)
def main(folder: Path, out: Path, **options) -> None:
    """Render a few frames from the pipeline in FOLDER and write them to OUT (.gif or .mp4)."""
    result = render(folder, out, **options)
    width, height = result["size"]
    click.echo(f"wrote {result['path']}: {result['frames']} frames, {width}x{height} ({result['variant']})")


if __name__ == "__main__":
    main()
