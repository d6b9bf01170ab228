"""Benchmark ``cogexport`` on a full-size Wan 2.1 T2V 1.3B in the original layout against the reference path, in one
run.

    .venv/bin/python scripts/benchmark_wan.py [--runs 3] [--work-dir .bench] [--layers N] [--json]
    .venv/bin/python scripts/benchmark_wan.py --reference-path ORIGINAL CONFIG OUT    # the reference path alone

Makes (once, cached in --work-dir) the release layout of Wan2.1-T2V-1.3B with random fp32 weights, as released:
``diffusion_pytorch_model.safetensors`` (5.68 GB) and the WanModel ``config.json``, written a tensor at a time. Then
exports it to a bf16 Diffusers transformer folder --runs times, alternating the two tools, each in a fresh process:

- cogexport: ``cogexport ORIGINAL OUT`` (the variant and config read off the folder; bf16, the class's
  _keep_in_fp32_modules kept in fp32; streams one tensor at a time);
- the reference path: Diffusers' own single-file loading,
  ``WanTransformer3DModel.from_single_file(file, config=LOCAL_CONFIG, torch_dtype=torch.bfloat16)`` then
  ``save_pretrained(OUT)`` (offline, from_single_file needs a local config folder: written once beside the release).

After the first round both outputs are compared tensor by tensor (same keys, shapes and configs; equal values, with
the tensors cogexport keeps in fp32 compared after rounding to bf16, since from_single_file casts every tensor);
any difference fails the benchmark. Reported: median wall time, median peak RSS of each tool's process tree,
peak RSS as a multiple of the fp32 model, ratios vs cogexport. ``--layers`` builds a smaller model of the same
widths (a quick check that the script works; the README's figures are full size).
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import ROOT, measure, print_table, summarize  # noqa: E402

VARIANT = "Wan2.1-T2V-1.3B"
FULL_LAYERS = 30
WEIGHTS = "diffusion_pytorch_model.safetensors"


# --------------------------------------------------------------------------------------------------------------
# The reference path (runs in its own process)
def reference_export(original: Path, config: Path, output: Path) -> None:
    import torch
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel.from_single_file(str(original / WEIGHTS), config=str(config),
                                                   torch_dtype=torch.bfloat16)
    model.save_pretrained(output, max_shard_size="5GB")


# --------------------------------------------------------------------------------------------------------------
# The benchmark's input: the release layout with random weights
def diffusers_config(layers: int) -> dict:
    from cogexport.models.family import family_named

    family = family_named("wan")
    return {**family.transformer_config(family.variant_named(VARIANT)), "num_layers": layers}


def make_release(folder: Path, layers: int) -> None:
    """The original layout's files of the published 1.3B config (with ``layers`` blocks), random fp32 weights drawn
    a tensor at a time; and a Diffusers config folder for the reference path."""
    import torch
    from diffusers import WanTransformer3DModel

    from cogexport.keymap.plan import plan_translation
    from cogexport.keymap.table import load_table
    from cogexport.lazy import LazyTensor
    from cogexport.models import wan
    from cogexport.write.diffusers_folders import write_config_json
    from cogexport.write.safetensors_file import write_safetensors

    config = diffusers_config(layers)
    with torch.device("meta"):
        model = WanTransformer3DModel.from_config(config)

    def random(shape: torch.Size, seed: int):
        return lambda: torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.02

    diffusers_names = {name: LazyTensor(t.shape, torch.float32, random(t.shape, seed), name)
                       for seed, (name, t) in enumerate(model.state_dict().items())}
    # the original names, by the original table run backwards (renames only: each tensor passes through untouched)
    original = plan_translation(load_table("wan/original_transformer").inverted(), diffusers_names, None, {}).tensors
    (folder / "release").mkdir(parents=True)
    write_safetensors(folder / "release" / WEIGHTS, original, {"format": "pt"})
    write_config_json(folder / "release" / "config.json", wan.original_config(dict(model.config), "t2v"))
    model.save_config(folder / "diffusers-config")


def prepare(work: Path, layers: int) -> dict:
    """Make the release (once) and count the model's parameters; runs in a helper process."""
    import torch
    from diffusers import WanTransformer3DModel

    folder = work / f"bench-wan21-t2v-1.3b-{layers}layers"
    marker = folder.with_name(folder.name + ".done")
    if not marker.exists():
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"making the {VARIANT} release ({layers} layers) in {folder}...", err=True)
        make_release(folder, layers)
        marker.write_text("")  # written last: marks the release complete
    with torch.device("meta"):
        model = WanTransformer3DModel.from_config(diffusers_config(layers))
    return {"release": str(folder / "release"), "config": str(folder / "diffusers-config"),
            "file_bytes": (folder / "release" / WEIGHTS).stat().st_size,
            "parameters": sum(p.numel() for p in model.parameters())}


def compare(ours: Path, reference: Path) -> dict:
    from benchmark_export import compare_outputs

    return compare_outputs(ours, reference)


# --------------------------------------------------------------------------------------------------------------
# The benchmark
def helper(*args: str) -> dict:
    """Run this script's hidden helper mode in a child process (the harness never imports torch) and return the
    JSON it prints."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"{' '.join(args)} failed (its error is above)")
    return json.loads(done.stdout)


def tools(setup: dict, work: Path) -> dict[str, tuple[list[str], Path]]:
    cogexport = str(Path(sys.executable).parent / "cogexport")
    ours, reference = work / "wan-out-cogexport", work / "wan-out-reference"
    return {
        "cogexport": ([cogexport, setup["release"], str(ours)], ours),
        "from_single_file": ([sys.executable, str(Path(__file__).resolve()), "--reference-path", setup["release"],
                              setup["config"], str(reference)], reference),
    }


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark release is made and kept, and outputs are written.")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--layers", type=click.IntRange(1, FULL_LAYERS), default=FULL_LAYERS, show_default=True,
              help="Blocks of the 1.3B model to build (fewer: a quick check of the script).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--reference-path", nargs=3, type=click.Path(path_type=Path), default=None,
              metavar="ORIGINAL CONFIG OUT", help="Only run the reference path (what the benchmark times).")
@click.option("--prepare", "prepare_only", is_flag=True, hidden=True)
@click.option("--compare", "compare_folders", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
def main(work_dir: Path, runs: int, layers: int, as_json: bool, reference_path: tuple[Path, Path, Path] | None,
         prepare_only: bool, compare_folders: tuple[Path, Path] | None) -> None:
    if reference_path:
        reference_export(*reference_path)
        return
    if prepare_only:
        click.echo(json.dumps(prepare(work_dir, layers)))
        return
    if compare_folders:
        click.echo(json.dumps(compare(*compare_folders)))
        return

    work_dir.mkdir(parents=True, exist_ok=True)
    setup = helper("--prepare", "--work-dir", str(work_dir), "--layers", str(layers))
    params, model_bytes = setup["parameters"], 4 * setup["parameters"]
    commands = tools(setup, work_dir)
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in commands}
    check = None
    for round_ in range(runs):
        for name, (command, output) in commands.items():
            shutil.rmtree(output, ignore_errors=True)
            samples[name].append(measure(command))
        if round_ == 0:  # check before spending time on more rounds
            check = helper("--compare", *(str(output) for _, output in commands.values()))
            if check["numel"] != params:
                raise click.ClickException(f"outputs hold {check['numel']} elements, the model has {params}")
    for _, output in commands.values():
        shutil.rmtree(output, ignore_errors=True)
    harness_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # a floor under every measurement

    results = summarize(samples, model_bytes)
    size = VARIANT if layers == FULL_LAYERS else f"{VARIANT} cut to {layers} of {FULL_LAYERS} layers"
    if as_json:
        click.echo(json.dumps({"variant": size, "parameters": params, "fp32_model_bytes": model_bytes,
                               "original_file_bytes": setup["file_bytes"], "harness_peak_rss_bytes": harness_rss,
                               "check": check, "results": results}, indent=2))
        return
    click.echo(f"{size}: {params:,} parameters, fp32 model {model_bytes / 1e9:.2f} GB; original layout "
               f"({setup['file_bytes'] / 1e9:.2f} GB fp32 file) -> Diffusers bf16, 5GB shards; median of {runs} runs")
    click.echo(f"outputs equal: {check['tensors']} tensors ({check['kept_fp32']} kept fp32 by cogexport, as "
               f"from_pretrained keeps them); harness peak RSS {harness_rss / 1e6:.0f} MB\n")
    print_table(results, "tool", 18, lambda row: row["tool"])


if __name__ == "__main__":
    main()
