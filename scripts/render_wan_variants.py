"""Render a few frames from a pipeline folder of one of Wan's variants on CPU: proof that a folder loads and runs.

    python scripts/render_wan_variants.py FOLDER --out frames.gif --steps 2

FOLDER is a WanVACEPipeline, WanAnimatePipeline or SkyReels-V2 pipeline folder (make_tiny_wan_variants.py's, or one
cogexport exported). The pipeline class comes from ``model_index.json``; every conditioning input (VACE's control video
and mask, Animate's character image, pose video and 512x512 face video, SkyReels-V2 I2V's image) is synthetic, so
nothing outside FOLDER is needed. The size is the smallest clip the VAE and patching take (2x3 patches, 5 frames).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder must never reach for the Hub

import click
import torch

from render_pipeline import gradient_image, save_frames

PIPELINES = ("WanVACEPipeline", "WanAnimatePipeline", "SkyReelsV2DiffusionForcingPipeline", "SkyReelsV2Pipeline",
             "SkyReelsV2ImageToVideoPipeline")
FACE = 512  # Animate's motion encoder reads 512x512 face crops (its size, as released)


def _conditions(name: str, width: int, height: int, frames: int) -> dict:
    """The pipeline's conditioning inputs, made up: gradients, and for masks a square in the middle."""
    from PIL import Image

    still = gradient_image(width, height)
    if name == "WanVACEPipeline":
        mask = Image.new("L", (width, height), 0)
        mask.paste(255, (width // 4, height // 4, 3 * width // 4, 3 * height // 4))
        return {"video": [still] * frames, "mask": [mask] * frames, "reference_images": [still.transpose(0)]}
    if name == "WanAnimatePipeline":
        return {"image": still, "pose_video": [still.transpose(1)] * (frames - 1),
                "face_video": [gradient_image(FACE, FACE)] * (frames - 1), "segment_frame_length": frames}
    if name == "SkyReelsV2ImageToVideoPipeline":
        return {"image": still}
    if name == "SkyReelsV2DiffusionForcingPipeline":
        return {"base_num_frames": frames}
    return {}


def render_variant(folder: str | os.PathLike, out: str | os.PathLike = "frames.gif", *,
                   prompt: str = "a panda playing a guitar", steps: int = 2, seed: int = 0) -> dict:
    """Load FOLDER, render a clip on CPU and write it to OUT. Returns {"path", "frames", "pipeline", "size"}."""
    import diffusers

    name = json.loads((Path(folder) / "model_index.json").read_text())["_class_name"]
    if name not in PIPELINES:
        raise ValueError(f"{folder}: model_index.json names {name}; expected one of {', '.join(PIPELINES)}")
    pipeline = getattr(diffusers, name).from_pretrained(str(folder))
    pipeline.set_progress_bar_config(disable=True)
    unit = pipeline.vae_scale_factor_spatial * pipeline.transformer.config.patch_size[-1]
    height, width, frames = 2 * unit, 3 * unit, pipeline.vae_scale_factor_temporal + 1
    sizes = {} if name == "WanAnimatePipeline" else {"num_frames": frames}
    result = pipeline(prompt=prompt, height=height, width=width, num_inference_steps=steps,
                      max_sequence_length=pipeline.tokenizer.model_max_length,
                      generator=torch.Generator().manual_seed(seed), output_type="pil", **sizes,
                      **_conditions(name, width, height, frames))
    frames_out = result.frames[0]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_frames(frames_out, out)
    return {"path": str(out), "frames": len(frames_out), "pipeline": name, "size": frames_out[0].size}


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("frames.gif"), show_default=True)
@click.option("--prompt", default="a panda playing a guitar", show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(folder: Path, out: Path, **options) -> None:
    """Render a few frames from the pipeline in FOLDER and write them to OUT (.gif or .mp4)."""
    result = render_variant(folder, out, **options)
    width, height = result["size"]
    click.echo(f"wrote {result['path']}: {result['frames']} frames, {width}x{height} ({result['pipeline']})")


if __name__ == "__main__":
    main()
