"""Benchmark ``cogexport universal`` against DeepSpeed's own ``ds_to_universal`` on the same checkpoints, in one run.

    .venv/bin/python scripts/benchmark_universal.py [--runs 3] [--stages 2 3] [--json]

Uses the cached bf16, world size 2 DeepSpeed checkpoints of the ~1.9 GB (fp32) bench model that
benchmark_consolidate.py makes (28 x Linear(4096, 4096) plus an odd-sized head; Adam, so every trainable parameter
has an fp32 master, exp_avg and exp_avg_sq), then runs each converter --runs times, alternating, each in a fresh
process:

- cogexport: ``cogexport universal SAVE_DIR OUT``;
- ``python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state`` (needed for any checkpoint not saved
  with universal-checkpoint metadata), with its default 4 extract and 2 merge workers, and with 1 of each.

After the first round the outputs are compared file by file (every zero/<param>/*.pt of DeepSpeed's output must
equal cogexport's); any difference fails the benchmark. Reported: median wall time, median peak RSS (the kernel's
ru_maxrss of the process and its workers, via wait4), peak RSS as a multiple of the fp32 model, the largest
parameter's fp32 master plus optimizer states (the memory the issue allows beyond a constant), and ratios.
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
from benchmarking import (BENCH_WIDTH, ROOT, bench_checkpoint, bench_model_bytes, measure, print_table,  # noqa: E402
                          summarize)


def compare_outputs(ours: Path, theirs: Path) -> dict:
    """Every per-parameter file DeepSpeed wrote, compared with cogexport's (runs in a helper process)."""
    import torch

    def value(path: Path) -> torch.Tensor:
        saved = torch.load(path, weights_only=False)  # the tools' own output, made just now by this benchmark
        return saved["param"] if isinstance(saved, dict) else saved

    compared, differ = 0, []
    for path in sorted((theirs / "zero").glob("*/*.pt")):
        mine = ours / path.relative_to(theirs)
        if not mine.is_file():
            differ.append(f"{mine.relative_to(ours)} missing")
            continue
        expected, got = value(path), value(mine)  # DeepSpeed's ZeRO-3 output is flat, cogexport's full shape
        if got.numel() != expected.numel() or not torch.equal(got.float().reshape(-1), expected.float().reshape(-1)):
            differ.append(str(mine.relative_to(ours)))
        compared += 1
    if not compared or differ:
        raise click.ClickException(f"cogexport and ds_to_universal differ ({compared} files compared): "
                                   f"{', '.join(differ[:8]) or 'nothing to compare'}")
    return {"files_compared": compared}


def helper(*args: str) -> dict:
    """This script's hidden helper mode in a child process (the harness never imports torch); its JSON."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"{' '.join(args)} failed (its error is above)")
    return json.loads(done.stdout)


def tools(save_dir: Path, work: Path) -> dict[str, tuple[list[str], Path]]:
    tag = (save_dir / "latest").read_text().strip()
    cogexport = str(Path(sys.executable).parent / "cogexport")
    ds_to_universal = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                       str(save_dir / tag), "--inject_missing_state", "--output_folder"]
    ours, theirs, theirs_serial = (work / name / f"{tag}_universal" for name in
                                   ("out-cogexport", "out-ds_to_universal", "out-ds_to_universal-1"))
    return {
        "cogexport universal": ([cogexport, "universal", str(save_dir), str(ours)], ours),
        "ds_to_universal (4+2 workers)": (ds_to_universal + [str(theirs)], theirs),
        "ds_to_universal (1+1 workers)": (ds_to_universal + [str(theirs_serial), "--num_extract_workers", "1",
                                                             "--num_merge_workers", "1"], theirs_serial),
    }


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark checkpoints are made and kept, and outputs written.")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--stages", type=click.IntRange(1, 3), multiple=True, default=(2, 3), show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--compare", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
def main(work_dir: Path, runs: int, stages: tuple[int, ...], as_json: bool, compare: tuple[Path, Path] | None) -> None:
    if compare:
        click.echo(json.dumps(compare_outputs(*compare)))
        return
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}
    model_bytes = bench_model_bytes()
    largest_parameter_states = 3 * 4 * BENCH_WIDTH * BENCH_WIDTH  # fp32 master, exp_avg, exp_avg_sq
    results, checks = [], {}
    for stage in stages:
        commands = tools(bench_checkpoint(work_dir, stage), work_dir)
        samples: dict[str, list[tuple[float, int]]] = {name: [] for name in commands}
        for round_ in range(runs):
            for name, (command, output) in commands.items():
                shutil.rmtree(output.parent, ignore_errors=True)
                samples[name].append(measure(command, env))
            if round_ == 0:  # check before spending time on more rounds
                outputs = [str(output) for _, output in commands.values()]
                checks[stage] = [helper("--compare", outputs[0], theirs) for theirs in outputs[1:]]
        for _, output in commands.values():
            shutil.rmtree(output.parent, ignore_errors=True)
        results += summarize(samples, model_bytes, stage=stage)
    if as_json:
        click.echo(json.dumps({"fp32_model_bytes": model_bytes, "largest_parameter_states_bytes":
                               largest_parameter_states, "checks": checks, "results": results}, indent=2))
        return
    compared = ", ".join(f"ZeRO-{stage}: {check[0]['files_compared']} files" for stage, check in checks.items())
    click.echo(f"fp32 model: {model_bytes / 1e9:.2f} GB; bf16 training, world size 2, Adam; largest parameter with "
               f"its optimizer states: {largest_parameter_states / 1e9:.2f} GB; median of {runs} runs")
    click.echo(f"outputs equal ({compared})\n")
    print_table(results, "stage tool", 38, lambda row: f"ZeRO-{row['stage']} {row['tool']}")


if __name__ == "__main__":
    main()
