"""Benchmark ``cogexport consolidate`` on a PyTorch distributed checkpoint (DCP) against what users run today.

    .venv/bin/python scripts/benchmark_dcp.py [--runs 3] [--model bench|bench-small] [--save accelerate|hf-storage]

Makes (once, cached in --work-dir) a real FSDP2 checkpoint of the ~1.9 GB (fp32) bench model, 28 x Linear(4096,
4096) plus an odd-sized head, trained one AdamW step at world size 2 and saved by ``accelerate``'s ``save_state``
(SHARDED_STATE_DICT: ``checkpoint-1/pytorch_model_fsdp_0/`` and the Adam states in ``optimizer_0/``). Then:

    cogexport consolidate   checkpoint-1 -> model.safetensors
    dcp_to_torch            python -m torch.distributed.checkpoint.format_utils dcp_to_torch pytorch_model_fsdp_0 model.pt
    accelerate merge-weights  pytorch_model_fsdp_0 -> model.safetensors

``--save hf-storage`` makes the same model's save through PyTorch's Hugging Face writer instead (FSDP2, world size
2, ``HuggingFaceStorageWriter(save_distributed=True)``: one ``shard-0000R-model-00001-of-00001.safetensors`` per rank,
scripts/make_hf_checkpoint.py), and runs:

    cogexport consolidate   the per-rank folder -> model.safetensors
    torch consolidate       torch.distributed.checkpoint._consolidate_hf_safetensors.consolidate_safetensors_files
                            (what the writer's enable_consolidation and torchtitan run) -> model-00001-of-00001...

Each output is first checked equal to cogexport's, tensor by tensor (in a separate process: the harness holds no
tensors), then every tool runs --runs times, alternating, each in a fresh process; the table gives median wall time
and median peak PSS and RSS of each tool's process tree (scripts/benchmarking.py), peak PSS as a multiple of the fp32 model, and ratios to
cogexport. ``--model bench-small`` (width 1024, 0.12 GB) checks the script quickly. Timing is not a test.
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
from benchmarking import (BENCH_HEAD, BENCH_LAYERS, ROOT, SCRIPTS, START, WORKERS_1,  # noqa: E402
                          check_variants_identical, floor_reads, floor_rows, goal_lines, measure_tree, print_scaling,
                          print_table, scaling_tools, start_tool, summarize, time_alternately, tree_bytes)

WIDTHS = {"bench": 4096, "bench-small": 1024}


def model_bytes(model: str) -> int:
    width = WIDTHS[model]
    return 4 * (BENCH_LAYERS * width * width + BENCH_HEAD * width + BENCH_HEAD)


def dcp_bench_checkpoint(work: Path, model: str) -> Path:
    """accelerate's checkpoint-1 of the bench model under FSDP2 at world size 2, made once per work dir."""
    folder = work / f"dcp-{model}-fsdp2-ws2"
    done = folder / "complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"making the FSDP2 {model} checkpoint (a few minutes)...", err=True)
        subprocess.run([sys.executable, str(SCRIPTS / "make_dcp_checkpoint.py"), str(folder), "--writer",
                        "accelerate-fsdp2", "--model", model, "--world-size", "2", "--steps", "1", "--no-truth"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done.write_text("")
    return folder / "run" / "checkpoint-1"


def hf_bench_checkpoint(work: Path, model: str) -> Path:
    """The bench model's per-rank Hugging Face writer save under FSDP2 at world size 2, made once per work dir."""
    folder = work / f"hf-storage-{model}-ws2"
    done = folder / "complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"making the Hugging Face writer save of {model} (a few minutes)...", err=True)
        subprocess.run([sys.executable, str(SCRIPTS / "make_hf_checkpoint.py"), str(folder), "--model", model,
                        "--world-size", "2", "--steps", "1", "--layout", "distributed", "--no-truth"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done.write_text("")
    return folder / "distributed"


# torch's own consolidator, as its writer calls it (every tensor into one output file)
TORCH_CONSOLIDATE = r"""
import sys
from pathlib import Path
from safetensors import safe_open
from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
source, output = sys.argv[1], sys.argv[2]
names = set()
for file in Path(source).glob("*.safetensors"):
    with safe_open(str(file), "pt") as handle:
        names.update(handle.keys())
consolidate_safetensors_files(input_dir=source, output_dir=output, fqn_to_index_mapping=dict.fromkeys(names, 1))
"""


def hf_tools(checkpoint: Path, output: Path) -> dict[str, list[str]]:
    bin_dir = Path(sys.executable).parent
    return {
        "cogexport consolidate": [str(bin_dir / "cogexport"), "consolidate", str(checkpoint), str(output),
                                  "--dtype", "fp32"],
        "torch consolidate": [sys.executable, "-c", TORCH_CONSOLIDATE, str(checkpoint), str(output)],
    }


def output_file(name: str, output: Path) -> Path:
    return output / {"dcp_to_torch": "model.pt", "torch consolidate": "model-00001-of-00001.safetensors"}.get(
        name, "model.safetensors")


def tools(checkpoint: Path, output: Path) -> dict[str, list[str]]:
    if checkpoint.name == "distributed":
        return hf_tools(checkpoint, output)
    bin_dir = Path(sys.executable).parent
    model = checkpoint / "pytorch_model_fsdp_0"
    return {
        "cogexport consolidate": [str(bin_dir / "cogexport"), "consolidate", str(checkpoint), str(output),
                                  "--dtype", "fp32"],
        WORKERS_1: [str(bin_dir / "cogexport"), "consolidate", str(checkpoint), str(output), "--dtype", "fp32",
                    "--workers", "1"],
        "dcp_to_torch": [sys.executable, "-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch", str(model),
                         str(output / "model.pt")],
        "accelerate merge-weights": [str(bin_dir / "accelerate"), "merge-weights", str(model), str(output)],
    }


def weight_files(checkpoint: Path) -> list[Path]:
    """The files holding the weights' bytes: accelerate's .distcp files, or the Hugging Face writer's rank files."""
    if checkpoint.name == "distributed":
        return sorted(checkpoint.glob("*.safetensors"))
    return sorted((checkpoint / "pytorch_model_fsdp_0").glob("*.distcp"))


def prepare(name: str, output: Path) -> None:
    shutil.rmtree(output, ignore_errors=True)
    if name in ("dcp_to_torch", "torch consolidate"):  # they write files, into a folder that must exist
        output.mkdir(parents=True)


COMPARE = r"""
import sys, torch
from safetensors import safe_open
ours, theirs = sys.argv[1], sys.argv[2:]
with safe_open(ours, "pt") as reference:
    names = list(reference.keys())
    for path in theirs:
        if path.endswith(".pt"):
            tree = torch.load(path, mmap=True, weights_only=True)
            other = {k[len("model."):] if k.startswith("model.") else k: v for k, v in tree["model"].items()} \
                if "model" in tree else tree
            get, keys = other.__getitem__, set(other)
        else:
            handle = safe_open(path, "pt")
            get, keys = handle.get_tensor, set(handle.keys())
        assert keys == set(names), f"{path}: other names"
        for name in names:
            assert torch.equal(reference.get_tensor(name), get(name)), f"{path}: {name} differs"
print(len(names))
"""


def check_outputs_equal(checkpoint: Path, work: Path) -> int:
    """Run each tool once and compare every tensor with cogexport's; returns the tensor count."""
    outputs = {}
    for name in tools(checkpoint, work):
        output = work / f"compare-{name.replace(' ', '-')}"
        command = tools(checkpoint, output)[name]
        prepare(name, output)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        outputs[name] = output_file(name, output)
    done = subprocess.run([sys.executable, "-c", COMPARE, *map(str, outputs.values())], check=True,
                          capture_output=True, text=True)
    for output in outputs.values():
        shutil.rmtree(output.parent, ignore_errors=True)
    return int(done.stdout.strip())


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark checkpoint is made and kept.")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--model", type=click.Choice(sorted(WIDTHS)), default="bench", show_default=True)
@click.option("--save", type=click.Choice(["accelerate", "hf-storage"]), default="accelerate", show_default=True,
              help="accelerate's FSDP2 DCP save, or PyTorch's Hugging Face writer's per-rank save.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--scaling/--no-scaling", default=True, show_default=True,
              help="Also time the scaling table (workers 1, 2, all cores; torchrun 1, 2 processes).")
def main(work_dir: Path, runs: int, model: str, save: str, as_json: bool, scaling: bool) -> None:
    env = dict(os.environ)
    checkpoint = dcp_bench_checkpoint(work_dir, model) if save == "accelerate" else hf_bench_checkpoint(work_dir, model)
    count = check_outputs_equal(checkpoint, work_dir)
    output = work_dir / "output"
    size = model_bytes(model)
    written, variants = reference_run(checkpoint, work_dir / "output-reference", work_dir / "output-scaling", scaling)
    commands = tools(checkpoint, output)
    commands.update({name: command for name, (command, _) in
                     floor_rows(floor_reads(weight_files(checkpoint), size), written, output).items()})
    commands[START] = start_tool(next(iter(commands.values())))
    samples: dict[str, list] = {}
    for _ in range(runs):
        for name, command in commands.items():
            prepare(name, output)
            samples.setdefault(name, []).append(measure_tree(command, env))
    shutil.rmtree(output, ignore_errors=True)
    results = summarize(samples, size, model=model)
    scaled = summarize(time_alternately(variants, runs), size, model=model) if variants else []
    others = ["dcp_to_torch", "accelerate merge-weights"] if save == "accelerate" else ["torch consolidate"]
    goals = goal_lines(results, others, ours="cogexport consolidate")
    if as_json:
        click.echo(json.dumps({"fp32_model_bytes": size, "tensors": count, "io_floor": {"read_bytes": size,
                               "written_bytes": written}, "results": results, "scaling": scaled, "goals": goals},
                              indent=2))
        return
    saved = "FSDP2 through accelerate, world size 2, Adam states in optimizer_0/" if save == "accelerate" else \
        "FSDP2 through HuggingFaceStorageWriter(save_distributed=True), world size 2, one file per rank"
    click.echo(f"{model}: fp32 model {size / 1e9:.2f} GB, {saved}; outputs equal: {count} tensors; every --workers "
               f"and torchrun run wrote the same bytes as cogexport's; median of {runs} runs")
    click.echo(f"I/O floor: dd reads {size / 1e9:.2f} GB of the rank files (the weights' bytes) and writes "
               f"{written / 1e9:.2f} GB (cogexport's output size)\n")
    print_table(results, "tool", 26, lambda row: row["tool"])
    for line in goals:
        click.echo(line)
    if scaled:
        print_scaling(scaled)


def reference_run(checkpoint: Path, reference: Path, elsewhere: Path, scaling: bool) -> tuple[int, dict]:
    """cogexport once more, untimed: its output's size, and the scaling runs, each checked to write the same bytes."""
    command = tools(checkpoint, reference)["cogexport consolidate"]
    shutil.rmtree(reference, ignore_errors=True)
    measure_tree(command)
    written = tree_bytes(reference)
    variants = scaling_tools(command, reference, elsewhere) if scaling else {}
    check_variants_identical(variants, reference)
    shutil.rmtree(reference, ignore_errors=True)
    return written, variants


if __name__ == "__main__":
    main()
