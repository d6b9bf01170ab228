"""Benchmark ``cogexport`` on a HunyuanVideo release-layout file against the reference path, in one run.

    .venv/bin/python scripts/benchmark_hunyuanvideo.py [--double-layers 2 --single-layers 4] [--runs 3] [--json]
    .venv/bin/python scripts/benchmark_hunyuanvideo.py --reference-path FILE CONFIG_DIR OUT   # the reference alone

The 13B model (20 double + 40 single blocks) needs about 51 GB in fp32, more than this machine has, so the benchmark
uses a FULL-WIDTH model (hidden 3072, 24 heads, the real embedders, text refiner and block shapes) with FEWER BLOCKS,
said in its output. It makes (once, cached in --work-dir) the release layout,
``transformers/mp_rank_00_model_states.pt`` holding ``{"module": state dict}`` of random bf16 weights (as the release
stores them), and a config folder for that size. Then, each tool in a fresh process, alternating, --runs times, to a bf16 Diffusers folder with 5GB shards:

- cogexport: ``cogexport FILE OUT --base CONFIG_DIR --component transformer`` (streams one tensor at a time);
- the reference path, as a user of Diffusers does it: ``torch.load`` the file (mmap) and take its ``module`` (Diffusers'
  ``from_single_file`` does not unwrap it), ``HunyuanVideoTransformer3DModel.from_single_file(that dict,
  config=CONFIG_DIR, torch_dtype=torch.bfloat16)`` (Diffusers' own converter), ``save_pretrained``.

After the first round both folders are compared tensor by tensor (benchmark_export.compare_outputs: same names,
shapes and config; equal values, cogexport's fp32-kept norm tensors compared after rounding to bf16); any difference
fails the benchmark. Reported: median wall time and peak RSS of each tool's process tree (benchmarking.measure), peak
RSS as a multiple of the fp32 model (4 bytes x the Diffusers model's parameter count) and ratios to cogexport.
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
from benchmark_export import compare_outputs  # noqa: E402
from benchmarking import ROOT, measure, print_table, summarize  # noqa: E402

MODEL_STATES = "mp_rank_00_model_states.pt"
RELEASE_LAYERS = (20, 40)  # double, single blocks of the published model


# --------------------------------------------------------------------------------------------------------------
# The reference path (runs in its own process)

def reference_export(release_file: Path, config_dir: Path, output: Path) -> None:
    import torch
    from diffusers import HunyuanVideoTransformer3DModel

    state_dict = torch.load(release_file, map_location="cpu", mmap=True, weights_only=True)["module"]
    model = HunyuanVideoTransformer3DModel.from_single_file(state_dict, config=str(config_dir),
                                                            torch_dtype=torch.bfloat16, local_files_only=True)
    del state_dict
    model.save_pretrained(output, max_shard_size="5GB")


# --------------------------------------------------------------------------------------------------------------
# Making the input (once, in a helper process)

def prepare(work: Path, double_layers: int, single_layers: int) -> dict:
    import torch
    from diffusers import HunyuanVideoTransformer3DModel

    from hunyuanvideo_tiny import original_shapes

    config = {"num_layers": double_layers, "num_single_layers": single_layers}
    name = f"hunyuanvideo-{double_layers}d{single_layers}s"
    release, config_dir, marker = work / name / "transformers", work / f"{name}-config", work / f"{name}.done"
    if not marker.exists():
        shutil.rmtree(work / name, ignore_errors=True)
        click.echo(f"making the full-width HunyuanVideo release file in {release} ...", err=True)
        generator = torch.Generator().manual_seed(0)
        module = {key: (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
                  for key, shape in original_shapes(config).items()}
        release.mkdir(parents=True)
        torch.save({"module": module}, release / MODEL_STATES)
        del module
        with torch.device("meta"):
            HunyuanVideoTransformer3DModel(**config).save_config(config_dir)
        marker.write_text("")  # written last: marks the input complete
    with torch.device("meta"):  # shapes only, nothing allocated
        parameters = sum(p.numel() for p in HunyuanVideoTransformer3DModel(**config).parameters())
    return {"release_file": str(release / MODEL_STATES), "config_dir": str(config_dir), "parameters": parameters,
            "file_bytes": (release / MODEL_STATES).stat().st_size}


def helper(*args: str) -> dict:
    """This script's hidden helper modes, in a child process (the harness never imports torch)."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"{' '.join(args)} failed (its error is above)")
    return json.loads(done.stdout)


def tools(release_file: str, config_dir: str, work: Path) -> dict[str, tuple[list[str], Path]]:
    cogexport = str(Path(sys.executable).parent / "cogexport")
    ours, reference = work / "out-hunyuanvideo-cogexport", work / "out-hunyuanvideo-reference"
    return {
        "cogexport": ([cogexport, release_file, str(ours), "--base", config_dir, "--component", "transformer"], ours),
        "reference path": ([sys.executable, str(Path(__file__).resolve()), "--reference-path", release_file,
                            config_dir, str(reference)], reference),
    }


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the input is made and kept, and outputs are written.")
@click.option("--double-layers", type=click.IntRange(1, 20), default=2, show_default=True)
@click.option("--single-layers", type=click.IntRange(1, 40), default=4, show_default=True)
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--reference-path", nargs=3, type=click.Path(path_type=Path), default=None,
              metavar="FILE CONFIG_DIR OUT", help="Only run the reference path (what the benchmark times).")
@click.option("--prepare", "prepare_only", is_flag=True, hidden=True)
@click.option("--compare", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
def main(work_dir: Path, double_layers: int, single_layers: int, runs: int, as_json: bool,
         reference_path: tuple[Path, Path, Path] | None, prepare_only: bool, compare: tuple[Path, Path] | None) -> None:
    if reference_path:
        reference_export(*reference_path)
        return
    if prepare_only:
        click.echo(json.dumps(prepare(work_dir, double_layers, single_layers)))
        return
    if compare:
        click.echo(json.dumps(compare_outputs(*compare)))
        return

    work_dir.mkdir(parents=True, exist_ok=True)
    setup = helper("--prepare", "--work-dir", str(work_dir), "--double-layers", str(double_layers),
                   "--single-layers", str(single_layers))
    params, model_bytes = setup["parameters"], 4 * setup["parameters"]
    commands = tools(setup["release_file"], setup["config_dir"], work_dir)
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
    size = f"{double_layers} double + {single_layers} single blocks (the release has {RELEASE_LAYERS[0]} + " \
           f"{RELEASE_LAYERS[1]})"
    if as_json:
        click.echo(json.dumps({"model": f"HunyuanVideo, full width (hidden 3072), {size}", "parameters": params,
                               "fp32_model_bytes": model_bytes, "file_bytes": setup["file_bytes"],
                               "harness_peak_rss_bytes": harness_rss, "check": check, "results": results}, indent=2))
        return
    click.echo(f"HunyuanVideo at full width (hidden 3072) but NOT full depth: {size}, so it fits this machine; "
               f"{params:,} parameters, fp32 model {model_bytes / 1e9:.2f} GB")
    click.echo(f"release layout ({MODEL_STATES} with 'module', bf16, {setup['file_bytes'] / 1e9:.2f} GB) -> Diffusers "
               f"bf16, 5GB shards; median of {runs} run(s)")
    click.echo(f"outputs equal: {check['tensors']} tensors ({check['kept_fp32']} kept fp32 by cogexport); "
               f"harness peak RSS {harness_rss / 1e6:.0f} MB\n")
    print_table(results, "tool", 16, lambda row: row["tool"])


if __name__ == "__main__":
    main()
