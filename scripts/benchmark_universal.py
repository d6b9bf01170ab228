"""Benchmark ``cogexport universal`` against DeepSpeed's own ``ds_to_universal`` on the same checkpoints, in one run.

    .venv/bin/python scripts/benchmark_universal.py [--runs 3] [--stages 2 3] [--model bench-small] [--json]

Uses the cached bf16, world size 2 DeepSpeed checkpoints of the ~1.9 GB (fp32) bench model that
benchmark_consolidate.py makes (28 x Linear(4096, 4096) plus an odd-sized head; Adam, so every trainable parameter
has an fp32 master, exp_avg and exp_avg_sq), with the ground truth taken inside the training process (every
master and Adam state, gathered from the live engine), then runs each converter:

- cogexport: ``cogexport universal SAVE_DIR OUT``;
- ``python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state`` (needed for any checkpoint not saved
  with universal-checkpoint metadata), with its default 4 extract and 2 merge workers (worker processes), and with
  1 of each (which DeepSpeed runs in its main process).

First, untimed, each tool converts each checkpoint once and its output is checked against the ground truth: for
every trainable parameter, zero/<name>/fp32.pt must equal the fp32 master and zero/<name>/<state>.pt each Adam
state, in fp32, torch.equal (cogexport's tensors in the parameter's shape; DeepSpeed's ZeRO-3 output is flat, so
its are compared flat); any difference fails the benchmark before anything is timed. Then each tool runs --runs
times, alternating, each in a fresh process. Reported: median wall time, median peak memory of the tool's whole
process tree (its workers included; benchmarking.py says how it is sampled), as a multiple of the fp32 model, the
largest parameter's fp32 master plus optimizer states (the memory the issue allows beyond a constant), and ratios.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import (BENCH_MODELS, FLOOR, ROOT, START, WORKERS_1, bench_checkpoint, bench_model_bytes,  # noqa: E402
                          bench_truth, check_variants_identical, floor_reads, floor_tool, goal_lines, measure_tree,
                          print_scaling, print_table, run_json, scaling_tools, start_tool, summarize, tree_bytes)


class TruthMismatch(Exception):
    """A universal checkpoint differs from the ground truth; the message lists how."""


def check_universal(output: Path, truth_dir: Path, full_shapes: bool = True) -> dict:
    """Every trainable parameter's master and optimizer states in ``output`` against the truth; raises on any
    difference. ``full_shapes=False`` accepts flat tensors of the right length (DeepSpeed's ZeRO-3 output)."""
    import torch
    from safetensors import safe_open

    facts = json.loads((truth_dir / "truth.json").read_text())
    problems, compared = [], 0
    with safe_open(truth_dir / "truth.safetensors", framework="pt") as truth:
        states = sorted({key.split("/")[1] for key in truth.keys() if key.startswith("optimizer/")})
        for name in facts["trainable"]:
            for state, key in [("fp32", name)] + [(state, f"optimizer/{state}/{name}") for state in states]:
                path = output / "zero" / name / f"{state}.pt"
                if not path.is_file():
                    problems.append(f"{path.relative_to(output)} missing")
                    continue
                saved = torch.load(path, weights_only=False)  # the tool's own output, made just now by this script
                got, expected = (saved["param"] if isinstance(saved, dict) else saved), truth.get_tensor(key)
                flat = not full_shapes and got.dim() == 1 and got.numel() == expected.numel()
                if got.dtype != expected.dtype:
                    problems.append(f"{path.relative_to(output)}: dtype {got.dtype}, expected {expected.dtype}")
                elif got.shape != expected.shape and not flat:
                    problems.append(f"{path.relative_to(output)}: shape {tuple(got.shape)}, expected "
                                    f"{tuple(expected.shape)}")
                elif not torch.equal(got.reshape(expected.shape), expected):
                    problems.append(f"{path.relative_to(output)}: values differ from the ground truth")
                compared += 1
    if problems or not compared:
        listed = "; ".join(problems[:10]) or "nothing to compare"
        raise TruthMismatch(f"{output} differs from the ground truth in {len(problems)} place(s): {listed}"
                            + (" ..." if len(problems) > 10 else ""))
    return {"files_compared": compared, "states": ["fp32", *states]}


def tools(save_dir: Path, work: Path) -> dict[str, tuple[list[str], Path]]:
    tag = (save_dir / "latest").read_text().strip()
    cogexport = str(Path(sys.executable).parent / "cogexport")
    ds_to_universal = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                       str(save_dir / tag), "--inject_missing_state", "--output_folder"]
    ours, ours_serial, theirs, theirs_serial = (work / name / f"{tag}_universal" for name in
                                                ("out-cogexport", "out-cogexport-1", "out-ds_to_universal",
                                                 "out-ds_to_universal-1"))
    return {
        "cogexport universal": ([cogexport, "universal", str(save_dir), str(ours)], ours),
        WORKERS_1: ([cogexport, "universal", str(save_dir), str(ours_serial), "--workers", "1"], ours_serial),
        "ds_to_universal (4+2 workers)": (ds_to_universal + [str(theirs)], theirs),
        "ds_to_universal (1+1 workers)": (ds_to_universal + [str(theirs_serial), "--num_extract_workers", "1",
                                                             "--num_merge_workers", "1"], theirs_serial),
    }


def check(output: Path, truth: Path, full_shapes: bool) -> dict:
    """check_universal in a child process (the harness never imports torch)."""
    return run_json([sys.executable, str(Path(__file__).resolve()), "--check", str(output), str(truth)]
                    + ([] if full_shapes else ["--flat-ok"]))


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark checkpoints are made and kept, and outputs written.")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--stages", type=click.IntRange(1, 3), multiple=True, default=(2, 3), show_default=True)
@click.option("--model", type=click.Choice(sorted(BENCH_MODELS)), default="bench", show_default=True,
              help="bench-small: a tiny model, to try the benchmark quickly.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--scaling/--no-scaling", default=True, show_default=True,
              help="Also time the scaling table (workers 1, 2, all cores; torchrun 1, 2 processes).")
@click.option("--check", "check_only", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--flat-ok", is_flag=True, hidden=True)
def main(work_dir: Path, runs: int, stages: tuple[int, ...], model: str, as_json: bool, scaling: bool,
         check_only: tuple[Path, Path] | None, flat_ok: bool) -> None:
    if check_only:
        try:
            click.echo(json.dumps(check_universal(*check_only, full_shapes=not flat_ok)))
        except TruthMismatch as mismatch:
            raise click.ClickException(str(mismatch)) from None
        return
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore"}
    model_bytes = bench_model_bytes(model)
    width = BENCH_MODELS[model][0]
    largest_parameter_states = 3 * 4 * width * width  # fp32 master, exp_avg, exp_avg_sq
    results, checks, scaled, floors = [], {}, [], {}
    for stage in stages:
        checkpoint = bench_checkpoint(work_dir, stage, model)
        commands, checks[stage], variants, floors[stage] = checked_tools(checkpoint, work_dir, env, scaling)
        results += summarize(time_runs(commands, runs, env), model_bytes, stage=stage)
        if variants:
            scaled += summarize(time_runs(variants, runs, env), model_bytes, stage=stage)
    goals = {stage: goal_lines([row for row in results if row["stage"] == stage],
                               [name for name in tools(bench_checkpoint(work_dir, stage, model), work_dir)
                                if name.startswith("ds_to_universal")], ours="cogexport universal")
             for stage in stages}
    if as_json:
        click.echo(json.dumps({"model": model, "fp32_model_bytes": model_bytes, "largest_parameter_states_bytes":
                               largest_parameter_states, "checks": checks, "io_floor": floors, "results": results,
                               "scaling": scaled, "goals": goals}, indent=2))
        return
    click.echo(f"fp32 model ({model}): {model_bytes / 1e9:.2f} GB; bf16 training, world size 2, Adam; largest "
               f"parameter with its optimizer states: {largest_parameter_states / 1e9:.2f} GB; median of {runs} runs")
    for stage, checked in checks.items():
        first = next(iter(checked.values()))
        click.echo(f"ZeRO-{stage}, every tool's output: {first['files_compared']} files ({', '.join(first['states'])} "
                   "of every parameter) equal the ground truth taken inside the training process")
    click.echo()
    print_table(results, "stage tool", 38, lambda row: f"ZeRO-{row['stage']} {row['tool']}")
    for stage, lines in goals.items():
        click.echo(f"ZeRO-{stage} I/O floor: dd reads and writes {floors[stage]['written_bytes'] / 1e9:.2f} GB (what "
                   "cogexport writes, read from the ranks' optimizer files and the model states)")
        for line in lines:
            click.echo(f"ZeRO-{stage} {line}")
    if scaled:
        print_scaling([dict(row, tool=f"ZeRO-{row['stage']} {row['tool']}") for row in scaled])


def checked_tools(checkpoint: Path, work_dir: Path, env: dict, scaling: bool) -> tuple[dict, dict, dict, dict]:
    """Each tool run once, untimed, and its output checked against the ground truth (then removed: each output is
    5-12 GB, one on disk at a time); the scaling runs checked to write cogexport's bytes; then the I/O floor added to
    the tools. Returns the tools, the checks, the scaling runs and the floor's size."""
    commands = tools(checkpoint, work_dir)
    checks, variants, floor = {}, {}, {}
    for name, (command, output) in commands.items():
        shutil.rmtree(output.parent, ignore_errors=True)
        measure_tree(command, env)
        checks[name] = check(output, bench_truth(checkpoint), full_shapes=name.startswith("cogexport"))
        if name == "cogexport universal":
            floor = {"written_bytes": tree_bytes(output)}
            variants = scaling_tools(command, output, work_dir / "out-scaling" / output.name) if scaling else {}
            check_variants_identical(variants, output, env)
        shutil.rmtree(output.parent, ignore_errors=True)
    commands[FLOOR] = universal_floor(checkpoint, floor["written_bytes"], work_dir / "out-floor")
    ours_command, ours_output = commands["cogexport universal"]
    commands[START] = (start_tool(ours_command), ours_output)
    return commands, checks, variants, floor


def universal_floor(checkpoint: Path, written: int, output: Path) -> tuple[list[str], Path]:
    """dd reading (and writing) the bytes a universal checkpoint is made of: every parameter's master and moments
    from the ranks' optimizer files, and the model states file."""
    tag = (checkpoint / "latest").read_text().strip()
    files = sorted((checkpoint / tag).glob("*optim_states.pt")) + sorted((checkpoint / tag).glob("*model_states.pt"))
    return floor_tool(floor_reads(files, written), written, output)


def time_runs(commands: dict, runs: int, env: dict) -> dict[str, list]:
    """--runs rounds of the commands, alternating; each output (and the latest_universal beside it) removed."""
    samples: dict[str, list] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (command, output) in commands.items():
            samples[name].append(measure_tree(command, env))
            shutil.rmtree(output.parent if output.name.endswith("_universal") else output, ignore_errors=True)
    return samples


if __name__ == "__main__":
    main()
