"""Benchmark ``cogexport`` at a 14B model's widths, bigger than this machine's memory, beside the I/O floor.

    .venv/bin/python scripts/benchmark_at_scale.py [--layers 16] [--runs 3] [--work-dir .bench] [--json]

The other benchmarks are sized for this machine's page cache (2-9 GB), where cogexport's fixed start (starting Python
and importing torch) is as long as copying the bytes. This one is the job issue 22 names: Wan2.1-T2V-14B in its
original layout (fp32, as released), cut to --layers of its 40 blocks (16: 22.9 GB, 5.7 billion parameters), exported
to a bf16 Diffusers transformer folder. No other tool can run it here: Diffusers' from_single_file holds the whole
state dict, more than this machine's 24 GiB; so the rows are cogexport, cogexport --workers 1, its start and both I/O
floors of the same job (the bytes read and written, copied by dd and in the kernel).

Made once in --work-dir by benchmark_wan.py's maker: the release, random weights written a tensor at a time. Before
anything is timed, cogexport's output is judged tensor by tensor, in a helper process, one tensor in memory at a time:
its names are the ones Diffusers' own single-file converter (convert_wan_transformer_to_diffusers, which renames
only, run on the names) gives the release's tensors, and each tensor equals the release's cast to the dtype Diffusers
keeps it in (bf16, or fp32 for the class's _keep_in_fp32_modules). Then --runs rounds of every row in turn, each in a
fresh process; before each run the page cache is emptied where the harness may (as root: every run reads from the
disk, as a first conversion of a checkpoint just written by training does on a cluster), else each starts in
whatever state the last left (said in the report).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import (START, WORKERS_1, floor_reads, floor_rows, goal_lines, measure, measure_tree,  # noqa: E402
                          print_table, retarget, run_json, start_tool, summarize, time_alternately, tree_bytes,
                          with_workers)
from benchmark_wan import prepare as prepare_wan_release  # noqa: E402
from single_file_benchmark import DEFAULT_WORK  # noqa: E402

VARIANT = "Wan2.1-T2V-14B"
FULL_LAYERS = 40
WEIGHTS = "diffusion_pytorch_model.safetensors"
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def judge(release: Path, output: Path) -> dict:
    """Every tensor of ``output`` against the release, by Diffusers' own names (see the module docstring)."""
    import diffusers
    import torch
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    from safetensors import safe_open

    with safe_open(release, "pt") as source:
        names = convert_wan_transformer_to_diffusers({name: name for name in source.keys()})  # {ours: original}
    index = output / f"{WEIGHTS}.index.json"
    weight_map = json.loads(index.read_text())["weight_map"] if index.exists() else \
        {name: WEIGHTS for name in safe_open(output / WEIGHTS, "pt").keys()}
    if set(weight_map) != set(names):
        raise click.ClickException(f"names differ from Diffusers': {sorted(set(weight_map) ^ set(names))[:5]}")
    kept_fp32 = diffusers.WanTransformer3DModel._keep_in_fp32_modules
    shards = {shard: safe_open(output / shard, "pt") for shard in set(weight_map.values())}
    counted = {"tensors": 0, "kept_fp32": 0}
    with safe_open(release, "pt") as source:
        for name, original in names.items():
            fp32 = any(module in name.split(".") for module in kept_fp32)
            written = shards[weight_map[name]].get_tensor(name)
            expected = source.get_tensor(original).to(torch.float32 if fp32 else torch.bfloat16)
            if written.dtype != expected.dtype or not torch.equal(written, expected):
                raise click.ClickException(f"{name} differs from the release's {original}")
            counted["tensors"] += 1
            counted["kept_fp32"] += fp32
    return counted


def emptying_the_page_cache() -> bool:
    """Whether this harness may empty the page cache before each run (root, with the proc file writable)."""
    return os.access(DROP_CACHES, os.W_OK)


def measure_cold(command: list[str]):
    """``measure_tree`` after the dirty pages are written and the page cache is emptied."""
    subprocess.run(["sync"], check=True)
    DROP_CACHES.write_text("1\n")
    return measure_tree(command)


def run(script: list[str], work: Path, runs: int, as_json: bool) -> None:
    work.mkdir(parents=True, exist_ok=True)
    setup = run_json([*script, "--prepare", "--work-dir", str(work)])
    release, ours = Path(setup["weights"]), work / "out-cogexport"
    command = [str(Path(sys.executable).parent / "cogexport"), setup["release"], str(ours)]
    shutil.rmtree(ours, ignore_errors=True)
    measure(command)  # untimed: the output is judged before anything is timed
    check = run_json([*script, "--judge", str(release), str(ours)])
    written, read = tree_bytes(ours), 4 * setup["parameters"]
    shutil.rmtree(ours, ignore_errors=True)
    rows = {"cogexport": (command, ours), WORKERS_1: (with_workers(retarget(command, ours, work / "out-w1"), 1),
                                                     work / "out-w1"),
            **floor_rows(floor_reads([release], read), written, work / "out-floor"),
            START: (start_tool(command), work / "out-start")}
    cold = emptying_the_page_cache()
    results = summarize(time_alternately(rows, runs, measure_cold if cold else measure_tree), read)
    goals = goal_lines(results, [])
    if as_json:
        click.echo(json.dumps({"model": VARIANT, **setup, "check": check, "read_bytes": read, "written_bytes": written,
                               "page_cache_emptied": cold, "results": results, "goals": goals}, indent=2))
        return
    click.echo(f"{VARIANT} cut to {setup['parameters'] / 1e9:.2f} billion parameters: original layout "
               f"{setup['release_bytes'] / 1e9:.1f} GB (fp32) -> Diffusers bf16 transformer, "
               f"{written / 1e9:.1f} GB in 5GB shards; median of {runs} run(s), page cache "
               f"{'emptied before each run' if cold else 'as the last run left it'}")
    click.echo(f"output judged: {check['tensors']} tensors equal the release's, by Diffusers' converter's names "
               f"({check['kept_fp32']} kept fp32, the rest cast to bf16)\n")
    print_table(results, "tool", max(len(name) for name in rows) + 2, lambda row: row["tool"])
    for line in goals:
        click.echo(line)


@click.command()
@click.option("--layers", type=click.IntRange(1, FULL_LAYERS), default=16, show_default=True,
              help="Blocks of the 14B model to build (16: 22.9 GB of fp32 weights).")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_WORK, show_default=True)
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--prepare", "prepare_only", is_flag=True, hidden=True)
@click.option("--judge", "judge_paths", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
def main(layers: int, work_dir: Path, runs: int, as_json: bool, prepare_only: bool,
         judge_paths: tuple[Path, Path] | None) -> None:
    if prepare_only:
        click.echo(json.dumps(prepare_wan_release(work_dir, layers, VARIANT)))
    elif judge_paths:
        click.echo(json.dumps(judge(*judge_paths)))
    else:
        run([sys.executable, str(Path(__file__).resolve()), "--layers", str(layers)], work_dir, runs, as_json)


if __name__ == "__main__":
    main()
