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
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent


def measure(command: list[str], env: dict | None = None) -> tuple[float, int]:
    """Run ``command``; return (wall seconds, peak RSS bytes of the process and its waited-for children)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{process.stderr.read().decode()[-3000:]}")
    process.stderr.close()
    return elapsed, usage.ru_maxrss * 1024


def make_checkpoint(work: Path, stage: int) -> Path:
    folder = work / f"bench-zero{stage}-bf16-ws2"
    if not (folder / "truth.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"making the ZeRO-{stage} benchmark checkpoint (a few minutes)...", err=True)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_deepspeed_checkpoint.py"), str(folder),
                        "--model", "bench", "--stage", str(stage), "--dtype", "bf16", "--world-size", "2",
                        "--steps", "1", "--no-truth"], check=True, stdout=subprocess.DEVNULL)
        (folder / "truth.json").write_text("{}")  # marks the checkpoint complete
    return folder / "checkpoint"


def fp32_model_bytes() -> int:
    width, layers, head = 4096, 28, 1013
    return 4 * (layers * width * width + head * width + head)


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
    model_bytes = fp32_model_bytes()
    results = []
    for stage in stages:
        checkpoint = make_checkpoint(work_dir, stage)
        output = work_dir / "output"
        samples: dict[str, list[tuple[float, int]]] = {}
        for _ in range(runs):
            for name, command in tools(checkpoint, output).items():
                shutil.rmtree(output, ignore_errors=True)
                samples.setdefault(name, []).append(measure(command, env))
        shutil.rmtree(output, ignore_errors=True)
        for name, values in samples.items():
            seconds = statistics.median(v[0] for v in values)
            rss = statistics.median(v[1] for v in values)
            results.append({"stage": stage, "tool": name, "seconds": round(seconds, 2), "peak_rss_bytes": rss,
                            "peak_rss_x_model": round(rss / model_bytes, 3), "runs": len(values)})
    ours = {r["stage"]: r for r in results if r["tool"] == "cogexport consolidate"}
    for row in results:
        base = ours[row["stage"]]
        row["time_ratio_vs_cogexport"] = round(row["seconds"] / base["seconds"], 2)
        row["rss_ratio_vs_cogexport"] = round(row["peak_rss_bytes"] / base["peak_rss_bytes"], 2)
    if as_json:
        click.echo(json.dumps({"fp32_model_bytes": model_bytes, "results": results}, indent=2))
        return
    click.echo(f"fp32 model: {model_bytes / 1e9:.2f} GB; bf16 training, world size 2; median of {runs} runs\n")
    click.echo(f"{'stage':<6} {'tool':<36} {'wall s':>7} {'peak RSS':>9} {'x model':>8} {'time / ours':>12} {'RSS / ours':>11}")
    for row in results:
        click.echo(f"ZeRO-{row['stage']:<1} {row['tool']:<36} {row['seconds']:>7.1f} {row['peak_rss_bytes'] / 1e9:>7.2f}GB "
                   f"{row['peak_rss_x_model']:>7.2f}x {row['time_ratio_vs_cogexport']:>11.2f}x {row['rss_ratio_vs_cogexport']:>10.2f}x")


if __name__ == "__main__":
    main()
