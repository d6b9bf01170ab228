"""Benchmark ``cogexport`` on a full-width release of one of Wan's variants in the original layout against Diffusers'
own path, in one run.

    .venv/bin/python scripts/benchmark_wan_variants.py [--variant vace-1.3b] [--runs 3] [--layers N] [--json]
    .venv/bin/python scripts/benchmark_wan_variants.py --variant animate-14b --layers 5 --runs 3

Makes (once, cached in --work-dir) the release layout of the published variant with random fp32 weights, as released:
``diffusion_pytorch_model.safetensors`` and the original ``config.json`` (VaceWanModel, WanAnimateModel, or
SkyReels-V2's WanModel with inject_sample_info), written a tensor at a time. Then exports it to a bf16 Diffusers
transformer folder, each tool in a fresh process (single_file_benchmark.py): cogexport with no other input (the
family, variant and config read off the release), and Diffusers' ``from_single_file(file, config=LOCAL_CONFIG,
torch_dtype=torch.bfloat16)`` then ``save_pretrained``. The outputs are compared tensor by tensor before anything is
timed.

| --variant          | model (full size)                                    | fp32 release | default depth           |
|--------------------|------------------------------------------------------|--------------|-------------------------|
| vace-1.3b          | Wan2.1-VACE-1.3B: 30 blocks + 15 VACE blocks, 1536   | ~8.7 GB      | full                    |
| skyreels-i2v-1.3b  | SkyReels-V2-I2V-1.3B-540P: 30 blocks, CLIP branch    | ~6.0 GB      | full                    |
| animate-14b        | Wan2.2-Animate-14B: 40 blocks, 5120, 8 face adapters | ~69 GB       | full; --layers 5: fits  |

SkyReels-V2's diffusion-forcing 1.3B model (the one with the fps embedding) cannot be the benchmark's subject:
Diffusers' from_single_file fails on it (its converter has no rule for fps_projection): no reference path to time.
``--layers`` keeps the full width and cuts the depth (Animate keeps one face adapter per 5 blocks): say so with the
figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, meta_model, original_names,  # noqa: E402
                                   reference_export, release_setup, write_random_safetensors)

WEIGHTS = "diffusion_pytorch_model.safetensors"
# --variant -> (family, published variant, its full depth)
VARIANTS = {"vace-1.3b": ("wan_vace", "Wan2.1-VACE-1.3B", 30),
            "skyreels-i2v-1.3b": ("skyreels_v2", "SkyReels-V2-I2V-1.3B-540P", 30),
            "animate-14b": ("wan_animate", "Wan2.2-Animate-14B", 40)}


def model_config(variant: str, layers: int) -> tuple[object, dict]:
    """The family and the published config with ``layers`` blocks (VACE hints the layers it can still reach,
    Animate keeps a face adapter every 5 blocks)."""
    from cogexport.models.family import family_named

    key, name, _ = VARIANTS[variant]
    family = family_named(key)
    config = {**family.transformer_config(family.variant_named(name)), "num_layers": layers}
    if "vace_layers" in config:
        config["vace_layers"] = [i for i in config["vace_layers"] if i < layers]
    return family, config


def prepare(work: Path, variant: str, layers: int) -> dict:
    """The original layout's files (random fp32 weights drawn a tensor at a time, made once) and a Diffusers config
    folder for the reference path."""
    from cogexport.write.diffusers_folders import write_config_json

    family, config = model_config(variant, layers)
    model = meta_model(family.transformer.class_name, config)
    folder = work / f"bench-{variant}-{layers}layers"
    table = family.transformer.original.table
    write_random_safetensors(folder / "release" / WEIGHTS, [("", original_names(model, table))], {"format": "pt"},
                             dtype="float32")
    task = family.variant_named(VARIANTS[variant][1]).task
    write_config_json(folder / "release" / "config.json", family.shapes.original_config(dict(model.config), task))
    return release_setup(folder / "release", folder / "release" / WEIGHTS, folder / "diffusers-config", model)


@click.command()
@click.option("--variant", type=click.Choice(list(VARIANTS)), default="vace-1.3b", show_default=True)
@click.option("--layers", type=click.IntRange(1, 40), default=None,
              help="Blocks to build, at full width (default: the variant's full depth; fewer: say so).")
@benchmark_options
def main(variant: str, layers: int | None, **options) -> None:
    family_key, name, full = VARIANTS[variant]
    layers = layers or full
    if family_key == "wan_animate" and layers % 5:
        raise click.UsageError("--layers for animate-14b: a multiple of 5 (one face adapter every 5 blocks)")
    class_name = {"wan_vace": "WanVACETransformer3DModel", "skyreels_v2": "SkyReelsV2Transformer3DModel",
                  "wan_animate": "WanAnimateTransformer3DModel"}[family_key]
    FamilyBenchmark(
        script=Path(__file__).resolve(), size_args=["--variant", variant, "--layers", str(layers)],
        prepare=lambda work: prepare(work, variant, layers),
        reference=lambda release, config_dir, output: reference_export(release / WEIGHTS, class_name, config_dir,
                                                                       output),
        title=name if layers == full else f"{name} cut to {layers} of {full} layers (full width)",
        release_kind="original layout", release_dtype="fp32", reference_label="from_single_file",
        cogexport_base=False,  # the release's own config.json tells the family and variant
    ).main(**options)


if __name__ == "__main__":
    main()
