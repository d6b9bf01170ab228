"""What the benchmark scripts share: timing a command in a fresh process, the medians and ratios they report, and
the cached DeepSpeed checkpoints of the ~1.9 GB bench model.

A harness must not import torch or hold tensors: Linux hands a parent's RSS high-water mark to a child's ru_maxrss
at exec (vfork shares the parent's mm), so a big parent would inflate every measurement.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
BENCH_WIDTH, BENCH_LAYERS, BENCH_HEAD = 4096, 28, 1013  # make_deepspeed_checkpoint.py's BenchModel


def measure(command: list[str], env: dict | None = None) -> tuple[float, int]:
    """Run ``command``; return (wall seconds, peak RSS bytes of the process and its waited-for children)."""
    os.sync()  # start each run with no dirty pages from the previous run's output being written back
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a chatty child cannot block on a full pipe
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            stderr.seek(0)
            raise click.ClickException(f"{' '.join(command)} failed:\n{stderr.read().decode()[-3000:]}")
    return elapsed, usage.ru_maxrss * 1024


def summarize(samples: dict[str, list[tuple[float, int]]], model_bytes: int, **labels) -> list[dict]:
    """One row per tool: medians, peak RSS as a multiple of the fp32 model, ratios to the first tool (ours)."""
    rows = []
    for name, values in samples.items():
        seconds, rss = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        rows.append({**labels, "tool": name, "seconds": round(seconds, 2), "peak_rss_bytes": rss,
                     "peak_rss_x_model": round(rss / model_bytes, 3), "runs": len(values),
                     "samples": [{"seconds": round(s, 2), "peak_rss_bytes": r} for s, r in values]})
    ours = rows[0]
    for row in rows:
        row["time_ratio_vs_cogexport"] = round(row["seconds"] / ours["seconds"], 2)
        row["rss_ratio_vs_cogexport"] = round(row["peak_rss_bytes"] / ours["peak_rss_bytes"], 2)
    return rows


def bench_model_bytes() -> int:
    """The bench model's size in fp32."""
    return 4 * (BENCH_LAYERS * BENCH_WIDTH * BENCH_WIDTH + BENCH_HEAD * BENCH_WIDTH + BENCH_HEAD)


def bench_checkpoint(work: Path, stage: int) -> Path:
    """The save dir of a bf16, world size 2 DeepSpeed checkpoint of the bench model, made once per work dir."""
    folder = work / f"bench-zero{stage}-bf16-ws2"
    if not (folder / "truth.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"making the ZeRO-{stage} benchmark checkpoint (a few minutes)...", err=True)
        subprocess.run([sys.executable, str(SCRIPTS / "make_deepspeed_checkpoint.py"), str(folder),
                        "--model", "bench", "--stage", str(stage), "--dtype", "bf16", "--world-size", "2",
                        "--steps", "1", "--no-truth"], check=True, stdout=subprocess.DEVNULL)
        (folder / "truth.json").write_text("{}")  # written last: marks the checkpoint complete
    return folder / "checkpoint"


def print_table(rows: list[dict], first_column: str, first_width: int, label) -> None:
    """The human-readable table every benchmark prints."""
    click.echo(f"{first_column:<{first_width}} {'wall s':>7} {'peak RSS':>9} {'x fp32 model':>13} {'time / ours':>12} "
               f"{'RSS / ours':>11}   per run: s / GB")
    for row in rows:
        per_run = ", ".join(f"{s['seconds']:.1f}/{s['peak_rss_bytes'] / 1e9:.2f}" for s in row["samples"])
        click.echo(f"{label(row):<{first_width}} {row['seconds']:>7.1f} {row['peak_rss_bytes'] / 1e9:>7.2f}GB "
                   f"{row['peak_rss_x_model']:>12.2f}x {row['time_ratio_vs_cogexport']:>11.2f}x "
                   f"{row['rss_ratio_vs_cogexport']:>10.2f}x   {per_run}")
