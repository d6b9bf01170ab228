"""Benchmark ``cogexport`` on an LTX-Video 2B single-file release (transformer and VAE in one file, random bf16
weights) -> Diffusers bf16 transformer, against the reference path, in one run.

    .venv/bin/python scripts/benchmark_ltx_video.py [--runs 3] [--layers 28] [--work-dir .bench] [--json]
    .venv/bin/python scripts/benchmark_ltx_video.py --reference-path RELEASE CONFIG_DIR OUT   # the reference alone

Full size by default: the 2B transformer (28 layers, 1.92B parameters, 7.7 GB in fp32) with the 0.9.5 VAE beside it,
as ltx-video-2b-v0.9.5.safetensors holds them. ``--layers N`` makes a smaller transformer for a quick check.
cogexport: ``cogexport RELEASE OUT --base CONFIG_DIR --component transformer``. The reference path: Diffusers'
``LTXVideoTransformer3DModel.from_single_file(RELEASE, config=CONFIG_DIR, torch_dtype=bfloat16)`` then
``save_pretrained``. Both outputs are compared tensor by tensor before anything is timed (single_file_benchmark.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, meta_model, original_names,  # noqa: E402
                                   reference_export, release_setup, write_random_safetensors)

VARIANT = "LTX-Video-0.9.5"
FULL_LAYERS = 28


def prepare(work: Path, layers: int) -> dict:
    from cogexport.models import ltx_video
    from cogexport.models.family import family_named

    family = family_named("ltx_video")
    variant = family.variant_named(VARIANT)
    config = {**family.transformer_config(variant), "num_layers": layers}
    model = meta_model(family.transformer.class_name, config)
    release = work / f"ltx-video-2b-{layers}-layers.safetensors"
    vae = meta_model(family.vae.class_name, family.vae_config(variant))
    parts = [("model.diffusion_model.", original_names(model, "ltx_video/original_transformer")),
             ("vae.", original_names(vae, "ltx_video/original_vae_095"))]
    write_random_safetensors(release, parts, ltx_video.original_metadata(config, "t2v"))
    return {**release_setup(release, release, work / f"ltx-video-2b-{layers}-layers-config", model), "layers": layers}


@click.command()
@click.option("--layers", type=click.IntRange(1), default=FULL_LAYERS, show_default=True,
              help="Transformer layers (28: full 2B).")
@benchmark_options
def main(layers: int, **options) -> None:
    FamilyBenchmark(
        script=Path(__file__).resolve(), size_args=["--layers", str(layers)],
        prepare=lambda work: prepare(work, layers),
        reference=lambda release, config_dir, output: reference_export(release, "LTXVideoTransformer3DModel",
                                                                       config_dir, output),
        title=f"LTX-Video 2B ({layers} layers{'' if layers == FULL_LAYERS else ', reduced'}) single file with its "
              "0.9.5 VAE",
    ).main(**options)


if __name__ == "__main__":
    main()
