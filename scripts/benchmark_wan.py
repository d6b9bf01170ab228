"""Benchmark ``cogexport`` on a full-size Wan 2.1 T2V 1.3B in the original layout against the reference path, in one
run.

    .venv/bin/python scripts/benchmark_wan.py [--runs 3] [--work-dir .bench] [--layers N] [--json]
    .venv/bin/python scripts/benchmark_wan.py --reference-path ORIGINAL CONFIG_DIR OUT    # the reference path alone

Makes (once, cached in --work-dir) the release layout of Wan2.1-T2V-1.3B with random fp32 weights, as released:
``diffusion_pytorch_model.safetensors`` (5.68 GB) and the WanModel ``config.json``, written a tensor at a time. Then
exports it to a bf16 Diffusers transformer folder, each tool in a fresh process (single_file_benchmark.py):

- cogexport: ``cogexport ORIGINAL OUT`` (the variant and config read off the folder; bf16, the class's
  _keep_in_fp32_modules kept in fp32; streams one tensor at a time);
- the reference path: Diffusers' own single-file loading,
  ``WanTransformer3DModel.from_single_file(file, config=LOCAL_CONFIG, torch_dtype=torch.bfloat16)`` then
  ``save_pretrained(OUT)`` (offline, from_single_file needs a local config folder: written beside the release).

Before anything is timed both outputs are compared tensor by tensor (same keys, shapes and configs; equal values, with
the tensors cogexport keeps in fp32 compared after rounding to bf16, since from_single_file casts every tensor);
any difference fails the benchmark. Then --runs rounds, alternating the two tools. Reported: median wall time, median
peak PSS and RSS of each tool's process tree, peak PSS as a multiple of the fp32 model, ratios vs cogexport. ``--layers``
builds a smaller model of the same widths (a quick check that the script works; the README's figures are full size).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, meta_model, original_names,  # noqa: E402
                                   reference_export, release_setup, write_random_safetensors)

VARIANT = "Wan2.1-T2V-1.3B"
FULL_LAYERS = 30
WEIGHTS = "diffusion_pytorch_model.safetensors"


def prepare(work: Path, layers: int, variant: str = VARIANT) -> dict:
    """The original layout's files of a published T2V config (``variant``, with ``layers`` blocks), random fp32
    weights drawn a tensor at a time, made once; and a Diffusers config folder for the reference path."""
    from cogexport.models import wan
    from cogexport.models.family import family_named
    from cogexport.write.diffusers_folders import write_config_json

    family = family_named("wan")
    model = meta_model(family.transformer.class_name,
                       {**family.transformer_config(family.variant_named(variant)), "num_layers": layers})
    folder = work / f"bench-{variant.lower().replace('wan2.1-', 'wan21-')}-{layers}layers"
    # the original names, by the original table run backwards (renames only: each tensor passes through untouched)
    write_random_safetensors(folder / "release" / WEIGHTS, [("", original_names(model, "wan/original_transformer"))],
                             {"format": "pt"}, dtype="float32")
    write_config_json(folder / "release" / "config.json", wan.original_config(dict(model.config), "t2v"))
    return release_setup(folder / "release", folder / "release" / WEIGHTS, folder / "diffusers-config", model)


@click.command()
@click.option("--layers", type=click.IntRange(1, FULL_LAYERS), default=FULL_LAYERS, show_default=True,
              help="Blocks of the 1.3B model to build (fewer: a quick check of the script).")
@benchmark_options
def main(layers: int, **options) -> None:
    FamilyBenchmark(
        script=Path(__file__).resolve(), size_args=["--layers", str(layers)],
        prepare=lambda work: prepare(work, layers),
        reference=lambda release, config_dir, output: reference_export(release / WEIGHTS, "WanTransformer3DModel",
                                                                       config_dir, output),
        title=VARIANT if layers == FULL_LAYERS else f"{VARIANT} cut to {layers} of {FULL_LAYERS} layers",
        release_kind="original layout", release_dtype="fp32", reference_label="from_single_file",
        cogexport_base=False,  # the release's own config.json tells the variant
    ).main(**options)


if __name__ == "__main__":
    main()
