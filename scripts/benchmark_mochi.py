"""Benchmark ``cogexport`` on a Mochi-1 dit.safetensors (random bf16 weights) -> Diffusers bf16 transformer, against
the reference path, in one run.

    .venv/bin/python scripts/benchmark_mochi.py [--runs 3] [--layers 8] [--work-dir .bench] [--json]
    .venv/bin/python scripts/benchmark_mochi.py --reference-path RELEASE CONFIG_DIR OUT [--layers N]  # reference alone

Full width (hidden 3072, 24 heads, text stream 1536), but FEWER LAYERS than the release's 48 (default 8, about
1.8B parameters): the full 10B model is 40 GB in fp32, more than this machine holds for the reference path. The
last of the N layers is the asymmetric one, as block 47 is in the release.
cogexport: ``cogexport dit.safetensors OUT --base CONFIG_DIR --component transformer``. The reference path: Diffusers'
``MochiTransformer3DModel.from_single_file(dit.safetensors, config=CONFIG_DIR, torch_dtype=bfloat16)`` then
``save_pretrained``, with its converter's hard-coded 48 layers changed to N (nothing else changed). Both outputs are
compared tensor by tensor before anything is timed (single_file_benchmark.py).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, meta_model, original_names,  # noqa: E402
                                   reference_export, release_setup, write_random_safetensors)

RELEASE_LAYERS = 48


def prepare(work: Path, layers: int) -> dict:
    from cogexport.models.family import family_named

    family = family_named("mochi")
    config = {**family.transformer_config(family.variants[0]), "num_layers": layers}
    model = meta_model(family.transformer.class_name, config)
    release = work / f"mochi-{layers}-layers" / "dit.safetensors"
    write_random_safetensors(release, [("", original_names(model, "mochi/original_transformer"))])
    return {**release_setup(release, release, work / f"mochi-{layers}-layers-config", model), "layers": layers}


def converter_for(layers: int):
    """Diffusers' Mochi converter with its layer count told (its own code, one constant changed)."""
    def patch() -> None:
        import diffusers.loaders.single_file_model as single_file_model
        import diffusers.loaders.single_file_utils as single_file_utils

        source = inspect.getsource(single_file_utils.convert_mochi_transformer_checkpoint_to_diffusers)
        namespace: dict = {}
        exec(source.replace(f"num_layers = {RELEASE_LAYERS}", f"num_layers = {layers}"), vars(single_file_utils),
             namespace)
        entry = single_file_model.SINGLE_FILE_LOADABLE_CLASSES["MochiTransformer3DModel"]
        entry["checkpoint_mapping_fn"] = namespace["convert_mochi_transformer_checkpoint_to_diffusers"]

    return patch


@click.command()
@click.option("--layers", type=click.IntRange(1), default=8, show_default=True, help="Layers (the release has 48).")
@benchmark_options
def main(layers: int, **options) -> None:
    FamilyBenchmark(
        script=Path(__file__).resolve(), size_args=["--layers", str(layers)],
        prepare=lambda work: prepare(work, layers),
        reference=lambda release, config_dir, output: reference_export(release, "MochiTransformer3DModel", config_dir,
                                                                       output, converter_for(layers)),
        title=f"Mochi-1 at full width with {layers} of its {RELEASE_LAYERS} layers",
    ).main(**options)


if __name__ == "__main__":
    main()
