"""Benchmark ``cogexport`` on an LTX-Video 2B single-file release (transformer and VAE in one file, random bf16
weights) -> Diffusers bf16 transformer, against the reference path, in one run.

    .venv/bin/python scripts/benchmark_ltx_video.py [--runs 3] [--layers 28] [--work-dir .bench] [--json]

Full size by default: the 2B transformer (28 layers, 1.92B parameters, 7.7 GB in fp32) with the 0.9.5 VAE beside it,
as ltx-video-2b-v0.9.5.safetensors holds them. ``--layers N`` makes a smaller transformer for a quick check.
cogexport: ``cogexport RELEASE OUT --base CONFIG_DIR --component transformer``. The reference path: Diffusers'
``LTXVideoTransformer3DModel.from_single_file(RELEASE, config=CONFIG_DIR, torch_dtype=bfloat16)`` then
``save_pretrained``. Both outputs are compared tensor by tensor after the first round.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (DEFAULT_WORK, compare, original_names, reference_export, run_benchmark,  # noqa: E402
                                   write_random_release)

VARIANT = "LTX-Video-0.9.5"


def prepare(work: Path, layers: int) -> dict:
    from diffusers import LTXVideoTransformer3DModel

    from cogexport.models import ltx_video
    from cogexport.models.family import family_named

    family = family_named("ltx_video")
    variant = family.variant_named(VARIANT)
    config = {**family.transformer_config(variant), "num_layers": layers}
    release = work / f"ltx-video-2b-{layers}-layers.safetensors"
    transformer, parameters = original_names(family.transformer.class_name, config, "ltx_video/original_transformer")
    if not release.exists():
        click.echo(f"writing {release} (random bf16 weights)...", err=True)
        vae, _ = original_names(family.vae.class_name, family.vae_config(variant), "ltx_video/original_vae_095")
        write_random_release(release, [("model.diffusion_model.", transformer), ("vae.", vae)],
                             ltx_video.original_metadata(config, "t2v"))
    config_dir = work / f"ltx-video-2b-{layers}-layers-config"
    config_dir.mkdir(parents=True, exist_ok=True)
    import torch

    with torch.device("meta"):
        LTXVideoTransformer3DModel.from_config(config).save_config(config_dir)
    return {"release": str(release), "release_bytes": release.stat().st_size, "config_dir": str(config_dir),
            "parameters": parameters, "layers": layers}


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_WORK, show_default=True)
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--layers", type=click.IntRange(1), default=28, show_default=True, help="Transformer layers (28: full 2B).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--reference-path", nargs=3, type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--prepare", "prepare_only", is_flag=True, hidden=True)
@click.option("--compare", "compare_dirs", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
def main(work_dir: Path, runs: int, layers: int, as_json: bool, reference_path, prepare_only: bool,
         compare_dirs) -> None:
    if reference_path:
        reference_export(reference_path[0], "LTXVideoTransformer3DModel", reference_path[1], reference_path[2])
    elif prepare_only:
        click.echo(json.dumps(prepare(work_dir, layers)))
    elif compare_dirs:
        click.echo(json.dumps(compare(*compare_dirs)))
    else:
        title = f"LTX-Video 2B ({layers} layers{'' if layers == 28 else ', reduced'}) single file with its 0.9.5 VAE"
        run_benchmark(Path(__file__).resolve(), work_dir, runs, as_json, title, ["--layers", str(layers)])


if __name__ == "__main__":
    main()
