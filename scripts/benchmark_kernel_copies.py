"""What kernel copies save, and what checking the CRC-32 of the bytes they copy costs, in one run.

    .venv/bin/python scripts/benchmark_kernel_copies.py [--runs 5] [--gigabytes 1] [--work-dir .bench] [--json]

A torch.save file of fp32 tensors (64 MB each, ``--gigabytes`` in all, made once) is written to a safetensors file
of the same tensors, the way ``cogexport consolidate --dtype fp32`` writes it, three ways, each in a fresh process
(its hidden --write mode), alternating, --runs times:

- loaded: every tensor read into memory (its CRC-32 checked as it is read) and written from there, by one thread
  (what cogexport did before kernel copies);
- kernel copy, checked: copy_file_range, each 8 MB copied then checked against the record's CRC-32 through a
  read-only memory map (what cogexport does);
- kernel copy, unchecked: the same with the CRC-32 checks switched off (the private variable the consolidate
  benchmark uses; never for users).

The three outputs are checked byte-identical first. Reported: median wall and CPU seconds (user + system) and the
peak PSS of each (benchmarking.py). CPU time is the steadier figure on a shared machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import ROOT, measure_tree  # noqa: E402

SKIP_CRC = "_COGEXPORT_SKIP_CRC_FOR_BENCHMARK"
MODES = {"loaded": {}, "kernel copy, checked": {}, "kernel copy, unchecked": {SKIP_CRC: "1"}}


def input_path(work: Path, gigabytes: float) -> Path:
    return work / f"kernel-copies-{gigabytes:g}GB.pt"


def make_input(work: Path, gigabytes: float) -> Path:
    """The hidden --make mode (the harness never imports torch): the torch.save file, made once."""
    path = input_path(work, gigabytes)
    if not path.exists():
        import torch

        generator = torch.Generator().manual_seed(0)
        count = max(1, round(gigabytes * 16))
        partial = path.with_name(path.name + ".partial")
        torch.save({f"w{i}": torch.randn(16 << 20, generator=generator) for i in range(count)}, partial)
        partial.rename(path)
    return path


def write(source: Path, output: Path, copies: bool) -> None:
    """The hidden --write mode: the state dict to one safetensors file, with or without kernel copies."""
    from cogexport.checkpoint.torch_state_dict import TorchStateDictCheckpoint
    from cogexport.write.io_engine import IOSettings, TensorFeed
    from cogexport.write.safetensors_file import write_order, write_safetensors

    with TorchStateDictCheckpoint(source) as checkpoint:
        tensors = dict(checkpoint)
        with TensorFeed(write_order(tensors), IOSettings(workers=1, copy_ranges=copies)) as feed:
            write_safetensors(output, tensors, {"format": "pt"}, payloads=iter(feed))


def command(source: Path, output: Path, mode: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--write", str(source), str(output),
            "--copies" if mode != "loaded" else "--no-copies"]


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True)
@click.option("--runs", type=click.IntRange(1), default=5, show_default=True)
@click.option("--gigabytes", type=float, default=1.0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--write", "write_paths", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--copies/--no-copies", default=True, hidden=True)
@click.option("--make", "make_only", is_flag=True, hidden=True)
def main(work_dir: Path, runs: int, gigabytes: float, as_json: bool, write_paths: tuple[Path, Path] | None,
         copies: bool, make_only: bool) -> None:
    if write_paths:
        write(*write_paths, copies)
        return
    if make_only:
        make_input(work_dir, gigabytes)
        return
    work_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--make", "--work-dir", str(work_dir),
                    "--gigabytes", str(gigabytes)], check=True)
    source = input_path(work_dir, gigabytes)
    outputs = {mode: work_dir / f"kernel-copies-{index}.safetensors" for index, mode in enumerate(MODES)}
    samples: dict[str, list] = {mode: [] for mode in MODES}
    for round_ in range(runs + 1):  # the first round, untimed, makes the outputs compared below
        for mode, variables in MODES.items():
            measured = measure_tree(command(source, outputs[mode], mode), {**os.environ, **variables})
            if round_:
                samples[mode].append(measured)
        if not round_:
            first = outputs["loaded"].read_bytes()
            if any(path.read_bytes() != first for path in outputs.values()):
                raise click.ClickException("the three ways wrote different bytes")
    for path in outputs.values():
        path.unlink(missing_ok=True)
    rows = [{"mode": mode, "seconds": statistics.median(m.seconds for m in runs_),
             "cpu_seconds": statistics.median(m.cpu_seconds for m in runs_),
             "peak_pss_bytes": statistics.median(m.peak_pss_bytes or 0 for m in runs_)} for mode, runs_ in
            samples.items()]
    if as_json:
        click.echo(json.dumps({"input_bytes": source.stat().st_size, "runs": runs, "results": rows}, indent=2))
        return
    click.echo(f"{source.stat().st_size / 1e9:.2f} GB of torch.save fp32 records -> safetensors, one thread; "
               f"median of {runs} runs (outputs byte-identical)\n")
    click.echo(f"{'how':<24} {'wall s':>7} {'CPU s':>7} {'peak PSS':>9}")
    for row in rows:
        click.echo(f"{row['mode']:<24} {row['seconds']:>7.2f} {row['cpu_seconds']:>7.2f} "
                   f"{row['peak_pss_bytes'] / 1e9:>7.2f}GB")
    checked, unchecked = rows[1], rows[2]
    click.echo(f"the CRC-32 check of copied bytes costs {checked['cpu_seconds'] - unchecked['cpu_seconds']:+.2f} s CPU, "
               f"{checked['seconds'] - unchecked['seconds']:+.2f} s wall (medians)")


if __name__ == "__main__":
    main()
