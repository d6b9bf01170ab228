"""Benchmark ``cogexport consolidate`` against DeepSpeed's own ``zero_to_fp32`` on the same checkpoints, in one run.

    .venv/bin/python scripts/benchmark_consolidate.py [--runs 3] [--stages 2 3] [--model bench-small] [--json]

Makes (once, cached in --work-dir) real DeepSpeed checkpoints of a ~1.9 GB (fp32) model, 28 x Linear(4096, 4096)
plus an odd-sized head, trained under bf16 at world size 2, with the ground truth taken inside the training
process (every fp32 master, gathered from the live engine). ``--model bench-small`` (4 x Linear(256, 256)) tries
the whole benchmark in seconds.

First, untimed, each tool converts each checkpoint once and its output is checked against the ground truth with
check_against_truth.py (every tensor of the state dict present, fp32, torch.equal to the master); any difference
fails the benchmark before anything is timed. Then each tool runs --runs times, alternating, each in a fresh
process, and the report gives the median wall time and the median peak memory of the tool's whole process tree
(benchmarking.py says how it is sampled), as a multiple of the fp32 model size, and the ratios to cogexport. Both
tools write fp32 safetensors (zero_to_fp32 with --safe_serialization), and zero_to_fp32's default .bin output too.
Timing is not a test: these machines are noisy, so only medians of several runs are quoted.

What the CRC-32 checks cost: cogexport also runs with them switched off (a private environment variable that
exists only for this row; the local-header and rank-identity checks still run), alternating with the other rows,
and the report gives the difference of the medians of the two cogexport rows in wall and CPU time (issue 15's
target: at most 5% of the wall time).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import (BENCH_MODELS, ROOT, SCRIPTS, START, WORKERS_1, Measurement,  # noqa: E402
                          bench_checkpoint, bench_model_bytes, bench_truth, check_variants_identical, floor_reads,
                          floor_rows, goal_lines, measure_tree, print_scaling, print_table, run_json, scaling_tools,
                          start_tool, summarize, time_alternately, tree_bytes, with_workers)

SKIP_CRC = "_COGEXPORT_SKIP_CRC_FOR_BENCHMARK"  # read by cogexport/checkpoint/zip_records.py; for the row below only
OURS, OURS_UNCHECKED = "cogexport consolidate", "cogexport consolidate, CRC checks off"
ZERO_TO_FP32 = "zero_to_fp32 --safe_serialization"
ZERO_TO_FP32_BIN = "zero_to_fp32 (.bin)"


def tools(checkpoint: Path, output: Path, env: dict) -> dict[str, tuple[list[str], dict]]:
    """Each tool's command and environment."""
    cogexport = str(Path(sys.executable).parent / "cogexport")
    ours = [cogexport, "consolidate", str(checkpoint), str(output), "--dtype", "fp32"]
    zero_to_fp32 = [sys.executable, str(checkpoint / "zero_to_fp32.py"), str(checkpoint), str(output)]
    checked = {k: v for k, v in env.items() if k != SKIP_CRC}
    return {
        OURS: (ours, checked),
        WORKERS_1: (with_workers(ours, 1), checked),
        OURS_UNCHECKED: (ours, {**checked, SKIP_CRC: "1"}),
        ZERO_TO_FP32: (zero_to_fp32 + ["--safe_serialization"], checked),
        ZERO_TO_FP32_BIN: (zero_to_fp32, checked),
    }


def optimizer_files(checkpoint: Path) -> list[Path]:
    """The ranks' optimizer files of the tag 'latest' names (they hold the fp32 masters)."""
    tag = (checkpoint / "latest").read_text().strip()
    return sorted((checkpoint / tag).glob("*optim_states.pt"))


def crc_cost(samples: dict[str, list[Measurement]]) -> dict:
    """The two cogexport rows' difference of medians: what the CRC-32 checks add to the wall and CPU time."""
    cost = {}
    for measure in ("seconds", "cpu_seconds"):
        checked, unchecked = (statistics.median(getattr(m, measure) for m in samples[name])
                              for name in (OURS, OURS_UNCHECKED))
        cost[measure] = round(checked - unchecked, 3)
        cost[f"{measure}_percent"] = round((checked / unchecked - 1) * 100, 1)
    return cost


def check_against_truth(output: Path, truth: Path) -> dict:
    """check_against_truth.py on one tool's fp32 output, in a child process (the harness never imports torch)."""
    return run_json([sys.executable, str(SCRIPTS / "check_against_truth.py"), str(output), str(truth), "--json"])


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark checkpoints are made and kept.")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--stages", type=click.IntRange(1, 3), multiple=True, default=(2, 3), show_default=True)
@click.option("--model", type=click.Choice(sorted(BENCH_MODELS)), default="bench", show_default=True,
              help="bench-small: a tiny model, to try the benchmark quickly.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--scaling/--no-scaling", default=True, show_default=True,
              help="Also time the scaling table (workers 1, 2, all cores; torchrun 1, 2 processes).")
def main(work_dir: Path, runs: int, stages: tuple[int, ...], model: str, as_json: bool, scaling: bool) -> None:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    model_bytes = bench_model_bytes(model)
    results, checks, costs, scaled, floors = [], {}, {}, [], {}
    for stage in stages:
        checkpoint = bench_checkpoint(work_dir, stage, model)
        commands, checks[stage], variants, floors[stage] = checked_tools(checkpoint, work_dir, env, model_bytes,
                                                                         scaling)
        samples = time_stage(commands, work_dir / "output", runs)
        results += summarize(samples, model_bytes, stage=stage)
        costs[stage] = crc_cost(samples)
        if variants:
            scaled += summarize(time_alternately(variants, runs), model_bytes, stage=stage)
    goals = {stage: goal_lines([row for row in results if row["stage"] == stage],
                                [ZERO_TO_FP32, ZERO_TO_FP32_BIN], ours=OURS)
             for stage in stages}
    if as_json:
        click.echo(json.dumps({"model": model, "fp32_model_bytes": model_bytes, "checks": checks, "io_floor": floors,
                               "results": results, "crc_cost": costs, "scaling": scaled, "goals": goals}, indent=2))
        return
    click.echo(f"fp32 model ({model}): {model_bytes / 1e9:.2f} GB; bf16 training, world size 2; median of {runs} runs")
    for stage, checked in checks.items():
        click.echo(f"ZeRO-{stage}, every tool's output: {next(iter(checked.values()))['summary']}")
    click.echo()
    print_table(results, "stage tool", 46, lambda row: f"ZeRO-{row['stage']} {row['tool']}")
    report_costs_and_goals(costs, goals, floors)
    if scaled:
        print_scaling([dict(row, tool=f"ZeRO-{row['stage']} {row['tool']}") for row in scaled])


def checked_tools(checkpoint: Path, work_dir: Path, env: dict, model_bytes: int,
                  scaling: bool) -> tuple[dict, dict, dict, dict]:
    """Each tool run once, untimed, and its output checked against the ground truth; the scaling runs checked to
    write cogexport's bytes; then the I/O floor (the fp32 masters read from the ranks' optimizer files, the output's
    bytes written) added to the tools. Returns the tools, the checks, the scaling runs and the floor's sizes."""
    output = work_dir / "output"
    commands = tools(checkpoint, output, env)
    checks, variants, floor = {}, {}, {}
    for name, (command, tool_env) in commands.items():
        shutil.rmtree(output, ignore_errors=True)
        measure_tree(command, tool_env)
        checks[name] = check_against_truth(output, bench_truth(checkpoint))
        if name == OURS:
            floor = {"read_bytes": model_bytes, "written_bytes": tree_bytes(output)}
            variants = scaling_tools(command, output, work_dir / "output-scaling") if scaling else {}
            check_variants_identical(variants, output, tool_env)
    for name, (command, _) in floor_rows(floor_reads(optimizer_files(checkpoint), model_bytes), floor["written_bytes"],
                                     output).items():
        commands[name] = (command, env)
    commands[START] = (start_tool(commands[OURS][0]), commands[OURS][1])
    return commands, checks, variants, floor


def time_stage(commands: dict, output: Path, runs: int) -> dict[str, list]:
    """--runs rounds of every tool, alternating, each into the emptied output folder."""
    samples: dict[str, list] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (command, tool_env) in commands.items():
            shutil.rmtree(output, ignore_errors=True)
            samples[name].append(measure_tree(command, tool_env))
    shutil.rmtree(output, ignore_errors=True)
    return samples


def report_costs_and_goals(costs: dict, goals: dict, floors: dict) -> None:
    for stage, cost in costs.items():
        click.echo(f"ZeRO-{stage}: the CRC-32 checks cost {cost['seconds']:+.2f} s wall "
                   f"({cost['seconds_percent']:+.1f}%), {cost['cpu_seconds']:+.2f} s CPU "
                   f"({cost['cpu_seconds_percent']:+.1f}%) (medians of the two cogexport rows; target: at most +5% "
                   "wall)")
    for stage, lines in goals.items():
        click.echo(f"ZeRO-{stage} I/O floor: dd reads {floors[stage]['read_bytes'] / 1e9:.2f} GB of the optimizer "
                   f"files (the fp32 masters' bytes) and writes {floors[stage]['written_bytes'] / 1e9:.2f} GB")
        for line in lines:
            click.echo(f"ZeRO-{stage} {line}")


if __name__ == "__main__":
    main()
