"""Benchmark ``cogexport`` on a full-width release of one of Wan's variants in the original layout against Diffusers'
own path, in one run.

    .venv/bin/python scripts/benchmark_wan_variants.py [--variant vace-1.3b] [--runs 3] [--layers N] [--json]
    .venv/bin/python scripts/benchmark_wan_variants.py --variant animate-14b --layers 5 --runs 3
    .venv/bin/python scripts/benchmark_wan_variants.py --variant animate2-14b --layers 4 --runs 3

Makes (once, cached in --work-dir) the release layout of the published variant with random weights, as released:
for Wan's own variants ``diffusion_pytorch_model.safetensors`` in fp32 and the original ``config.json`` (VaceWanModel,
WanAnimateModel, or SkyReels-V2's WanModel with inject_sample_info); for ChronoEdit the same file and the WanModel
``config.json`` recording ``rope_temporal_skip_len`` (what ``--to original`` writes and ComfyUI and DiffSynth-Studio
load: nvidia publishes no original-layout file, so its bf16 dtype is this script's choice); for Wan-Animate-2 the
release's one bf16 file, ``wan_animate_2_bf16.safetensors``, with no config beside it (the release has none); written
a tensor at a time. Then exports it to a bf16 Diffusers transformer folder, each tool in a fresh process
(single_file_benchmark.py): cogexport with no other input where the release's config tells the family, variant and
size (Wan-Animate-2 cut in depth has none: it is given the Diffusers config folder as ``--base``, as a user exporting
another size would), and Diffusers' ``from_single_file(file, config=LOCAL_CONFIG, torch_dtype=torch.bfloat16)`` then
``save_pretrained``. The outputs are compared tensor by tensor before anything is timed.

| --variant          | model (full size)                                    | fp32 release | default depth           |
|--------------------|------------------------------------------------------|--------------|-------------------------|
| vace-1.3b          | Wan2.1-VACE-1.3B: 30 blocks + 15 VACE blocks, 1536   | ~8.7 GB      | full                    |
| skyreels-i2v-1.3b  | SkyReels-V2-I2V-1.3B-540P: 30 blocks, CLIP branch    | ~6.0 GB      | full                    |
| animate-14b        | Wan2.2-Animate-14B: 40 blocks, 5120, 8 face adapters | ~69 GB       | full; --layers 5: fits  |
| chronoedit-14b     | ChronoEdit-14B: Wan 2.1 I2V 14B's 40 blocks, 5120    | ~33 GB bf16  | full; --layers 4: fits  |
| animate2-14b       | Wan2.2-Animate-2-14B: 40 in-context blocks, 5120     | ~33 GB bf16  | full; --layers 4: fits  |

SkyReels-V2's diffusion-forcing 1.3B model (the one with the fps embedding) cannot be the benchmark's subject:
Diffusers' from_single_file fails on it (its converter has no rule for fps_projection): no reference path to time.
``--layers`` keeps the full width and cuts the depth (Animate keeps one face adapter per 5 blocks): say so with the
figures.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, meta_model, original_names,  # noqa: E402
                                   reference_export, release_setup, write_random_safetensors)



@dataclass(frozen=True)
class Release:
    """How a variant is published: its family and variant, full depth, Diffusers class, weights file and dtype, and
    whether a config.json lies beside the weights (without one, a cut model needs --base to tell its size)."""

    family: str
    variant: str
    full_depth: int
    class_name: str
    weights: str = "diffusion_pytorch_model.safetensors"
    dtype: str = "fp32"
    config_beside: bool = True


VARIANTS = {"vace-1.3b": Release("wan_vace", "Wan2.1-VACE-1.3B", 30, "WanVACETransformer3DModel"),
            "skyreels-i2v-1.3b": Release("skyreels_v2", "SkyReels-V2-I2V-1.3B-540P", 30,
                                         "SkyReelsV2Transformer3DModel"),
            "animate-14b": Release("wan_animate", "Wan2.2-Animate-14B", 40, "WanAnimateTransformer3DModel"),
            "chronoedit-14b": Release("chronoedit", "ChronoEdit-14B", 40, "ChronoEditTransformer3DModel", dtype="bf16"),
            "animate2-14b": Release("wan_animate2", "Wan2.2-Animate-2-14B", 40, "WanAnimate2Transformer3DModel",
                                    weights="wan_animate_2_bf16.safetensors", dtype="bf16", config_beside=False)}
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def model_config(variant: str, layers: int) -> tuple[object, dict]:
    """The family and the published config with ``layers`` blocks (VACE hints the layers it can still reach,
    Animate keeps a face adapter every 5 blocks)."""
    from cogexport.models.family import family_named

    release = VARIANTS[variant]
    family = family_named(release.family)
    config = {**family.transformer_config(family.variant_named(release.variant)), "num_layers": layers}
    if "vace_layers" in config:
        config["vace_layers"] = [i for i in config["vace_layers"] if i < layers]
    return family, config


def write_release(folder: Path, variant: str, config: dict):
    """The release of a model of ``config`` as ``variant`` is published, in ``folder`` (random weights drawn a tensor
    at a time, made once). Returns what cogexport reads (the folder where a config.json lies beside the weights,
    else the file), the weights file and the model on the meta device."""
    from cogexport.models.family import family_named
    from cogexport.write.diffusers_folders import write_config_json

    release = VARIANTS[variant]
    family = family_named(release.family)
    model = meta_model(family.transformer.class_name, config)
    weights = folder / release.weights
    write_random_safetensors(weights, [("", original_names(model, family.transformer.original.table))],
                             {"format": "pt"}, dtype=TORCH_DTYPES[release.dtype])
    if not release.config_beside:
        return weights, weights, model
    task = family.variant_named(release.variant).task
    write_config_json(folder / "config.json", family.shapes.original_config(dict(model.config), task))
    return folder, weights, model


def prepare(work: Path, variant: str, layers: int) -> dict:
    """The release's files and a Diffusers config folder for the reference path (and for cogexport's --base where
    the release has no config)."""
    _, config = model_config(variant, layers)
    folder = work / f"bench-{variant}-{layers}layers"
    release, weights, model = write_release(folder / "release", variant, config)
    return release_setup(release, weights, folder / "diffusers-config", model)


def weights_file(release: Path, variant: str) -> Path:
    """The weights file of ``prepare``'s release (its folder, or the file itself)."""
    return release if release.is_file() else release / VARIANTS[variant].weights


@click.command()
@click.option("--variant", type=click.Choice(list(VARIANTS)), default="vace-1.3b", show_default=True)
@click.option("--layers", type=click.IntRange(1, 40), default=None,
              help="Blocks to build, at full width (default: the variant's full depth; fewer: say so).")
@benchmark_options
def main(variant: str, layers: int | None, **options) -> None:
    release = VARIANTS[variant]
    layers = layers or release.full_depth
    if release.family == "wan_animate" and layers % 5:
        raise click.UsageError("--layers for animate-14b: a multiple of 5 (one face adapter every 5 blocks)")
    full = layers == release.full_depth
    FamilyBenchmark(
        script=Path(__file__).resolve(), size_args=["--variant", variant, "--layers", str(layers)],
        prepare=lambda work: prepare(work, variant, layers),
        reference=lambda weights, config_dir, output: reference_export(weights_file(weights, variant),
                                                                       release.class_name, config_dir, output),
        title=release.variant if full else f"{release.variant} cut to {layers} of {release.full_depth} layers "
                                           "(full width)",
        release_kind="original layout" if release.config_beside else f"release file ({release.weights})",
        release_dtype=release.dtype, reference_label="from_single_file",
        # the release's own config.json tells the family and variant; without one, the published size alone is told
        cogexport_base=not release.config_beside and not full,
    ).main(**options)


if __name__ == "__main__":
    main()
