"""Benchmark ``cogexport consolidate`` against DeepSpeed's own ``zero_to_fp32`` on the same checkpoints, in one run.

    .venv/bin/python scripts/benchmark_consolidate.py [--runs 3] [--stages 2 3]

Makes (once, cached in --work-dir) real DeepSpeed checkpoints of a ~1.9 GB (fp32) model, 28 x Linear(4096, 4096)
plus an odd-sized head, trained under bf16 at world size 2, then runs each converter --runs times, alternating,
each in a fresh process, and reports the median wall time and median peak RSS (from the kernel's accounting of
the child process: ru_maxrss via wait4), peak RSS as a multiple of the fp32 model size, and the ratios.
Both tools write fp32 safetensors (zero_to_fp32 with --safe_serialization) and its default .bin output too.
Timing is not a test: these machines are noisy, so only medians of several runs are quoted.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import ROOT, bench_checkpoint, bench_model_bytes, measure, print_table, summarize  # noqa: E402


def tools(checkpoint: Path, output: Path) -> dict[str, list[str]]:
    cogexport = str(Path(sys.executable).parent / "cogexport")
    zero_to_fp32 = [sys.executable, str(checkpoint / "zero_to_fp32.py"), str(checkpoint), str(output)]
    return {
        "cogexport consolidate": [cogexport, "consolidate", str(checkpoint), str(output), "--dtype", "fp32"],
        "zero_to_fp32 --safe_serialization": zero_to_fp32 + ["--safe_serialization"],
        "zero_to_fp32 (.bin)": zero_to_fp32,
    }


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark checkpoints are made and kept.")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--stages", type=click.IntRange(1, 3), multiple=True, default=(2, 3), show_default=True)
@click.option("--json", "as_json", is_flag=True)
def main(work_dir: Path, runs: int, stages: tuple[int, ...], as_json: bool) -> None:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    model_bytes = bench_model_bytes()
    results = []
    for stage in stages:
        checkpoint = bench_checkpoint(work_dir, stage)
        output = work_dir / "output"
        samples: dict[str, list[tuple[float, int]]] = {}
        for _ in range(runs):
            for name, command in tools(checkpoint, output).items():
                shutil.rmtree(output, ignore_errors=True)
                samples.setdefault(name, []).append(measure(command, env))
        shutil.rmtree(output, ignore_errors=True)
        results += summarize(samples, model_bytes, stage=stage)
    if as_json:
        click.echo(json.dumps({"fp32_model_bytes": model_bytes, "results": results}, indent=2))
        return
    click.echo(f"fp32 model: {model_bytes / 1e9:.2f} GB; bf16 training, world size 2; median of {runs} runs\n")
    print_table(results, "stage tool", 42, lambda row: f"ZeRO-{row['stage']} {row['tool']}")


if __name__ == "__main__":
    main()
