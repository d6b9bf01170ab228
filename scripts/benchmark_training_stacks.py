"""Benchmark cogexport on the training stacks' own saves beside each stack's own converter and the I/O floor.

    .venv/bin/python scripts/benchmark_training_stacks.py [--stack fastvideo --stack autotp --stack trainer] [--runs 3]

The checkpoints are made once per work dir by the stacks' own code (scripts/stack_bench_checkpoints.py says which
and at what size), each with its ground truth taken inside training. Per stack:

- fastvideo: a DMD2 run (student, critic and EMA roles, each role's AdamW states) exported to a Diffusers
  transformer in fp32 by ``cogexport export`` and by FastVideo's own ``dcp_to_diffusers.py`` run from its source
  (scripts/fastvideo_dcp_to_diffusers.py: what is stood in for, and the venv it needs: --fastvideo-python,
  --fastvideo-src).
- autotp: a DeepSpeed AutoTP 2 x ZeRO-3 save: ``cogexport consolidate`` and ``cogexport universal`` beside
  DeepSpeed's ``ds_to_universal`` (DeepSpeed's ``zero_to_fp32`` refuses tensor-parallel saves).
- trainer: a Hugging Face Trainer ``checkpoint-N/`` (ZeRO-2, bf16): ``cogexport consolidate`` beside the
  ``zero_to_fp32.py`` the Trainer saves into the folder.

Every tool's output is first checked, untimed, against the ground truth (every tensor, fp32, torch.equal; any
difference stops the benchmark); then each tool runs --runs times, alternating, each in a fresh process
(benchmarking.py: median wall time, peak PSS and RSS of the process tree), beside both I/O floors and cogexport's
start. The machine's load average is printed beside each table. Timing is not a test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import (ROOT, SCRIPTS, START, compile_cogexport_bytecode, floor_reads,  # noqa: E402
                          floor_rows, floor_tool, goal_lines, measure_tree, print_table, run_json, start_tool,
                          summarize, tree_bytes)

COGEXPORT = str(Path(sys.executable).parent / "cogexport")
FASTVIDEO = "FastVideo dcp_to_diffusers.py"
DS_TO_UNIVERSAL = "ds_to_universal (4+2 workers)"
ZERO_TO_FP32 = "zero_to_fp32 --safe_serialization"


@dataclass
class Stack:
    """One benchmark: each tool's command and environment, by row name; how its outputs are checked; the floor."""

    title: str
    output: Path  # where each tool writes (its own per stack: stacks may run side by side)
    tools: dict[str, tuple[list[str], dict]]
    ours: str
    others: list[str]
    check: Callable[[dict[str, Path]], str]  # the outputs by tool name -> one line saying what was compared
    floor_reads: Callable[[int], list]  # the bytes written -> the floor's reads
    model_bytes: int
    # row name -> (the tool whose output's size it writes, command(written bytes, output))
    extra_floors: dict[str, tuple[str, Callable[[int, Path], list[str]]]] = field(default_factory=dict)


# -- checks (in child processes: the harness never imports torch) --------------------------------------------------
COMPARE_FASTVIDEO = r"""
import json, sys, pathlib, torch
from safetensors.torch import load_file
truth = {k.split(".", 1)[1]: v for k, v in load_file(sys.argv[1]).items() if k.startswith("student.")}
for folder in sys.argv[2:]:
    got = {}
    for path in sorted(pathlib.Path(folder).rglob("*.safetensors")):
        got.update(load_file(path))
    assert set(got) == set(truth), (folder, sorted(set(got) ^ set(truth))[:5])
    for name, tensor in truth.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor), (folder, name)
print(json.dumps({"tensors": len(truth)}))
"""

COMPARE_UNIVERSAL = r"""
import json, sys, pathlib, torch
ours, theirs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
count = 0
for path in sorted((theirs / "zero").glob("*/*.pt")):  # per parameter (beside them: optimizer_state.pt)
    mine = torch.load(ours / path.relative_to(theirs), weights_only=False)
    other = torch.load(path, weights_only=False)
    mine, other = (x["param"] if isinstance(x, dict) else x for x in (mine, other))
    assert torch.equal(mine.reshape(-1), other.reshape(-1)) and mine.dtype == other.dtype, path
    count += 1
# ds_to_universal writes no step.pt for a ZeRO-3 save; cogexport writes each parameter's step beside its moments
assert count and count == len([p for p in (ours / "zero").glob("*/*.pt") if p.name != "step.pt"]), count
print(json.dumps({"files": count}))
"""


def check_against_truth(output: Path, truth_dir: Path) -> dict:
    return run_json([sys.executable, str(SCRIPTS / "check_against_truth.py"), str(output), str(truth_dir), "--json"])


def universal_output(output: Path) -> Path:
    return output / "universal"


# -- the stacks ----------------------------------------------------------------------------------------------------
def fastvideo_stack(work: Path, python: str, source: str) -> Stack:
    from stack_bench_checkpoints import fastvideo_run

    run = fastvideo_run(work)
    step = run / "run" / "checkpoint-1"
    output = work / "output-fastvideo"
    truth = run / "truth.safetensors"
    student = _truth_bytes(truth, "student.")

    def check(outputs: dict) -> str:
        done = subprocess.run([sys.executable, "-c", COMPARE_FASTVIDEO, str(truth), *map(str, outputs.values())],
                              check=True, stdout=subprocess.PIPE, text=True)
        return f"every tool's transformer: all {json.loads(done.stdout)['tensors']} tensors equal the student's " \
               "fp32 weights taken inside training"

    return Stack(
        output=output,
        title=f"FastVideo DMD2 run (student, critic, EMA; world size 2), student {student / 1e9:.2f} GB fp32, "
              f"{_bytes(step / 'dcp') / 1e9:.2f} GB of .distcp files",
        tools={"cogexport export": ([COGEXPORT, "export", str(run / "run"), str(output), "--base",
                                     str(run / "base" / "transformer"), "--dtype", "fp32"], dict(os.environ)),
               FASTVIDEO: ([python, str(SCRIPTS / "fastvideo_dcp_to_diffusers.py"), "--checkpoint", str(step),
                            "--output-dir", str(output), "--config", str(run / "run.yaml")],
                           {**os.environ, "FASTVIDEO_SRC": source})},
        ours="cogexport export", others=[FASTVIDEO], check=check, model_bytes=student,
        floor_reads=lambda written: floor_reads(sorted((step / "dcp").glob("*.distcp")), student))


def autotp_stack(work: Path) -> Stack:
    from stack_bench_checkpoints import autotp_run

    run = autotp_run(work)
    save = run / "checkpoint"
    tag = (save / "latest").read_text().strip()
    output = work / "output-autotp"
    ds_to_universal = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                       str(save / tag), "--inject_missing_state", "--output_folder", str(universal_output(output))]
    optimizer_files = sorted((save / tag).glob("*optim_states.pt"))
    model_bytes = _truth_bytes(run / "truth.safetensors")

    def check(outputs: dict) -> str:
        consolidated = check_against_truth(outputs["cogexport consolidate"], run)["summary"]
        for name in ("cogexport universal", DS_TO_UNIVERSAL):
            run_json([sys.executable, str(SCRIPTS / "benchmark_universal.py"), "--check",
                      str(universal_output(outputs[name])), str(run), "--flat-ok"])
        same = subprocess.run([sys.executable, "-c", COMPARE_UNIVERSAL, str(universal_output(
            outputs["cogexport universal"])), str(universal_output(outputs[DS_TO_UNIVERSAL]))], check=True,
            stdout=subprocess.PIPE, text=True)
        return (f"consolidate: {consolidated}; universal: every fp32 master equals the truth in both tools' "
                f"outputs, and all {json.loads(same.stdout)['files']} files (masters and Adam moments) equal "
                "between them")

    universal_files = optimizer_files + sorted((save / tag).glob("*model_states.pt"))
    return Stack(
        output=output,
        title=f"DeepSpeed AutoTP 2 x ZeRO-3 (2 data-parallel ranks, fp32 training), {model_bytes / 1e9:.2f} GB "
              "fp32 model",
        tools={"cogexport consolidate": ([COGEXPORT, "consolidate", str(save), str(output), "--dtype", "fp32"],
                                         dict(os.environ)),
               "cogexport universal": ([COGEXPORT, "universal", str(save), str(universal_output(output))],
                                       dict(os.environ)),
               DS_TO_UNIVERSAL: (ds_to_universal, {**os.environ, "DS_ACCELERATOR": "cpu"})},
        ours="cogexport consolidate", others=[DS_TO_UNIVERSAL], check=check, model_bytes=model_bytes,
        floor_reads=lambda written: floor_reads(optimizer_files, model_bytes),
        extra_floors={"universal I/O floor (dd)": ("cogexport universal", lambda written, out: floor_tool(
            floor_reads(universal_files, written), written, out)[0])})


def trainer_stack(work: Path) -> Stack:
    from stack_bench_checkpoints import trainer_run

    run = trainer_run(work)
    step = run / "run" / "checkpoint-1"
    tag = (step / "latest").read_text().strip()
    output = work / "output-trainer"
    model_bytes = _truth_bytes(run / "truth.safetensors")

    def check(outputs: dict) -> str:
        results = [check_against_truth(path, run)["summary"] for path in outputs.values()]
        return f"every tool's output: {results[0]}"

    return Stack(
        output=output, title=f"Hugging Face Trainer checkpoint-1/ (DeepSpeed ZeRO-2, bf16 training, world size 2), "
              f"{model_bytes / 1e9:.2f} GB fp32 model",
        tools={"cogexport consolidate": ([COGEXPORT, "consolidate", str(step), str(output), "--dtype", "fp32"],
                                         dict(os.environ)),
               ZERO_TO_FP32: ([sys.executable, str(step / "zero_to_fp32.py"), str(step), str(output),
                               "--safe_serialization"], {**os.environ, "DS_ACCELERATOR": "cpu"})},
        ours="cogexport consolidate", others=[ZERO_TO_FP32], check=check, model_bytes=model_bytes,
        floor_reads=lambda written: floor_reads(sorted((step / tag).glob("*optim_states.pt")), model_bytes))


def _bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _truth_bytes(truth: Path, prefix: str = "") -> int:
    """The bytes of a truth file's weights (names starting with ``prefix``; never its optimizer states), from its
    header alone."""
    with truth.open("rb") as handle:
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    return sum(entry["data_offsets"][1] - entry["data_offsets"][0] for key, entry in header.items()
               if key != "__metadata__" and key.startswith(prefix) and not key.startswith("optimizer/"))


# -- running them --------------------------------------------------------------------------------------------------
def checked_outputs(stack: Stack, work: Path) -> tuple[str, dict[str, int]]:
    """Each tool once, untimed, into an output of its own; the outputs checked; each output's size."""
    outputs = {}
    for index, (name, (command, env)) in enumerate(stack.tools.items()):
        output = stack.output.with_name(f"{stack.output.name}-check-{index}")
        shutil.rmtree(output, ignore_errors=True)
        subprocess.run(_retarget(command, stack.output, output), env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        outputs[name] = output
    summary = stack.check(outputs)
    written = {name: tree_bytes(output) for name, output in outputs.items()}
    for output in outputs.values():
        shutil.rmtree(output, ignore_errors=True)
    return summary, written


def _retarget(command: list[str], output: Path, elsewhere: Path) -> list[str]:
    return [part.replace(str(output), str(elsewhere)) for part in command]


def timed(stack: Stack, sizes: dict[str, int], runs: int) -> dict[str, list]:
    output, written = stack.output, sizes[stack.ours]
    commands = dict(stack.tools)
    commands.update({name: (command, dict(os.environ)) for name, (command, _) in
                     floor_rows(stack.floor_reads(written), written, output).items()})
    commands.update({name: (make(sizes[tool], output), dict(os.environ))
                     for name, (tool, make) in stack.extra_floors.items()})
    commands[START] = (start_tool(commands[stack.ours][0]), dict(os.environ))
    samples: dict[str, list] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (command, env) in commands.items():
            shutil.rmtree(output, ignore_errors=True)
            os.sync()
            samples[name].append(measure_tree(command, env))
    shutil.rmtree(output, ignore_errors=True)
    return samples


def load_average() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def builders(fastvideo_python: str | None, fastvideo_src: str | None) -> dict:
    def fastvideo(work: Path) -> Stack:
        if not fastvideo_python or not fastvideo_src:
            raise click.UsageError("--stack fastvideo needs --fastvideo-python and --fastvideo-src (see "
                                   "scripts/fastvideo_dcp_to_diffusers.py)")
        return fastvideo_stack(work, fastvideo_python, fastvideo_src)

    return {"fastvideo": fastvideo, "autotp": autotp_stack, "trainer": trainer_stack}


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench" / "stacks",
              show_default=True, help="Where the checkpoints are made and kept, and outputs written.")
@click.option("--stack", "stacks", type=click.Choice(["fastvideo", "autotp", "trainer"]), multiple=True,
              default=("fastvideo", "autotp", "trainer"), show_default=True)
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--fastvideo-python", envvar="FASTVIDEO_PYTHON", help="The Python of the venv FastVideo's script runs "
              "in (scripts/fastvideo_dcp_to_diffusers.py).")
@click.option("--fastvideo-src", envvar="FASTVIDEO_SRC", help="A checkout of FastVideo's source.")
def main(work_dir: Path, stacks: tuple[str, ...], runs: int, fastvideo_python: str | None,
         fastvideo_src: str | None) -> None:
    """Time cogexport beside each training stack's own converter (the module docstring says which)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    compile_cogexport_bytecode()
    for name in stacks:
        stack = builders(fastvideo_python, fastvideo_src)[name](work_dir)
        summary, sizes = checked_outputs(stack, work_dir)
        before = load_average()
        samples = timed(stack, sizes, runs)
        click.echo(f"\n{stack.title}; median of {runs} runs\n{summary}\n{before} before, {load_average()} after")
        results = summarize(samples, stack.model_bytes, stack=name)
        print_table(results, "tool", 34, lambda row: row["tool"])
        for line in goal_lines(results, stack.others, ours=stack.ours):
            click.echo(line)
        if len(stack.tools) > len(stack.others) + 1:  # a second cogexport row (universal): its own line
            second = next(tool for tool in stack.tools if tool not in (stack.ours, *stack.others))
            click.echo(goal_lines(results, stack.others, ours=second)[0])


if __name__ == "__main__":
    main()
