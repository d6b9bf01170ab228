"""What checking every byte read against its zip record's CRC-32 costs ``cogexport consolidate``.

    .venv/bin/python scripts/measure_crc_cost.py [--runs 5] [--stage 2]

Consolidates the ~1.9 GB (fp32) benchmark checkpoint of scripts/benchmark_consolidate.py (made once, cached in
--work-dir) with the checks on and with them off, alternating, each in a fresh process, and reports the median
wall and CPU (user + system) seconds of each and the difference. The checks are switched off by a private
environment variable that exists only for this measurement; everything else (local-header checks, rank
identity) runs in both, so the difference is the CRC-32 work alone.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import ROOT, bench_checkpoint  # noqa: E402

SKIP_CRC = "_COGEXPORT_SKIP_CRC_FOR_BENCHMARK"  # read by cogexport/checkpoint/zip_records.py


def timed(command: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU seconds of ``command`` run in a fresh process."""
    os.sync()
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise click.ClickException(f"{' '.join(command)} failed: {process.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True)
@click.option("--runs", type=click.IntRange(1), default=5, show_default=True)
@click.option("--stage", type=click.IntRange(1, 3), default=2, show_default=True)
def main(work_dir: Path, runs: int, stage: int) -> None:
    checkpoint = bench_checkpoint(work_dir, stage)
    output = work_dir / "crc-output"
    cogexport = str(Path(sys.executable).parent / "cogexport")
    command = [cogexport, "consolidate", str(checkpoint), str(output), "--dtype", "fp32"]
    settings = {"CRC-32 checked": {k: v for k, v in os.environ.items() if k != SKIP_CRC},
                "CRC-32 skipped": {**os.environ, SKIP_CRC: "1"}}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in settings}
    for _ in range(runs):
        for name, env in settings.items():
            shutil.rmtree(output, ignore_errors=True)
            samples[name].append(timed(command, env))
    shutil.rmtree(output, ignore_errors=True)
    medians = {name: (statistics.median(s[0] for s in values), statistics.median(s[1] for s in values))
               for name, values in samples.items()}
    click.echo(f"ZeRO-{stage} bench checkpoint, cogexport consolidate --dtype fp32, median of {runs} runs")
    for name, (wall, cpu) in medians.items():
        per_run = ", ".join(f"{w:.2f}/{c:.2f}" for w, c in samples[name])
        click.echo(f"  {name:<15} wall {wall:6.2f} s  cpu {cpu:6.2f} s   per run wall/cpu: {per_run}")
    (wall_on, cpu_on), (wall_off, cpu_off) = medians["CRC-32 checked"], medians["CRC-32 skipped"]
    click.echo(f"  cost            wall {wall_on - wall_off:+6.2f} s ({(wall_on / wall_off - 1) * 100:+.1f}%)  "
               f"cpu {cpu_on - cpu_off:+6.2f} s ({(cpu_on / cpu_off - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
