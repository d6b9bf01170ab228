"""Benchmark ``cogexport`` on a Mochi-1 dit.safetensors (random bf16 weights) -> Diffusers bf16 transformer, against
the reference path, in one run.

    .venv/bin/python scripts/benchmark_mochi.py [--runs 3] [--layers 8] [--work-dir .bench] [--json]

Full width (hidden 3072, 24 heads, text stream 1536), but FEWER LAYERS than the release's 48 (default 8, about
1.8B parameters): the full 10B model is 40 GB in fp32, more than this machine holds for the reference path. The
last of the N layers is the asymmetric one, as block 47 is in the release.
cogexport: ``cogexport dit.safetensors OUT --base CONFIG_DIR --component transformer``. The reference path: Diffusers'
``MochiTransformer3DModel.from_single_file(dit.safetensors, config=CONFIG_DIR, torch_dtype=bfloat16)`` then
``save_pretrained``, with its converter's hard-coded 48 layers changed to N (nothing else changed).
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (DEFAULT_WORK, compare, original_names, reference_export, run_benchmark,  # noqa: E402
                                   write_random_release)


def prepare(work: Path, layers: int) -> dict:
    import torch
    from diffusers import MochiTransformer3DModel

    from cogexport.models.family import family_named

    family = family_named("mochi")
    config = {**family.transformer_config(family.variants[0]), "num_layers": layers}
    release = work / f"mochi-{layers}-layers" / "dit.safetensors"
    names, parameters = original_names(family.transformer.class_name, config, "mochi/original_transformer")
    if not release.exists():
        click.echo(f"writing {release} (random bf16 weights)...", err=True)
        write_random_release(release, [("", names)])
    config_dir = work / f"mochi-{layers}-layers-config"
    config_dir.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        MochiTransformer3DModel.from_config(config).save_config(config_dir)
    return {"release": str(release), "release_bytes": release.stat().st_size, "config_dir": str(config_dir),
            "parameters": parameters, "layers": layers}


def converter_for(layers: int):
    """Diffusers' Mochi converter with its layer count told (its own code, one constant changed)."""
    def patch() -> None:
        import diffusers.loaders.single_file_model as single_file_model
        import diffusers.loaders.single_file_utils as single_file_utils

        source = inspect.getsource(single_file_utils.convert_mochi_transformer_checkpoint_to_diffusers)
        namespace: dict = {}
        exec(source.replace("num_layers = 48", f"num_layers = {layers}"), vars(single_file_utils), namespace)
        entry = single_file_model.SINGLE_FILE_LOADABLE_CLASSES["MochiTransformer3DModel"]
        entry["checkpoint_mapping_fn"] = namespace["convert_mochi_transformer_checkpoint_to_diffusers"]

    return patch


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_WORK, show_default=True)
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--layers", type=click.IntRange(1), default=8, show_default=True, help="Layers (the release has 48).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--reference-path", nargs=3, type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--prepare", "prepare_only", is_flag=True, hidden=True)
@click.option("--compare", "compare_dirs", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
def main(work_dir: Path, runs: int, layers: int, as_json: bool, reference_path, prepare_only: bool,
         compare_dirs) -> None:
    if reference_path:
        reference_export(reference_path[0], "MochiTransformer3DModel", reference_path[1], reference_path[2],
                         converter_for(layers))
    elif prepare_only:
        click.echo(json.dumps(prepare(work_dir, layers)))
    elif compare_dirs:
        click.echo(json.dumps(compare(*compare_dirs)))
    else:
        title = f"Mochi-1 at full width with {layers} of its 48 layers"
        run_benchmark(Path(__file__).resolve(), work_dir, runs, as_json, title, ["--layers", str(layers)])


if __name__ == "__main__":
    main()
