"""GGUF quantizing beside llama.cpp's own C reference quantizers, on the same values (issue 39): per value on one
core, and wall time and peak memory with 1 and 2 cores.

    python scripts/benchmark_gguf_reference.py [--quant Q4_K_M --quant Q8_0] [--runs 3]   # Wan2.1-T2V-1.3B
    python scripts/benchmark_gguf_reference.py --layers 1 --runs 1 --quant Q4_K_M            # a quick check

The release is scripts/benchmark_gguf.py's (random N(0, 0.02) fp32 weights under the variant's exact names and
shapes, made once). The judge is ``quantize_row_*_ref`` of llama.cpp's ggml-quants.c as scripts/build_ggml_reference.sh
builds it (the library the tests compare with; ``--library`` or COGEXPORT_GGML_REFERENCE to point elsewhere), called
through ctypes, which releases Python's lock, so its threads run at once; the float types (F32, F16, BF16) are the
``gguf`` package's casts. For each ``--quant``:

1. cogexport writes the GGUF file once (untimed); the reference job (this script's hidden ``reference`` mode: numpy,
   safetensors and the C library, no torch) quantizes the release's values to each tensor's type in that file, and
   every tensor's bytes are compared with the file's: any difference stops the benchmark.
2. Per value, one core, in one process: cogexport's ``quantize_tensor`` and the C reference on the same tensors
   (``--sample-tensors`` of each quantized type, the largest), one after the other, ``--runs`` rounds; the medians
   of the thread's CPU time (a loaded machine delays both alike), and their ratio per type (the issue: at most 1.1x).
   The K types go through cogexport's compiled quantizer when the install built it (the report says which ran;
   COGEXPORT_KQUANT_KERNEL=0 measures the torch path instead).
3. Wall time and peak memory, each run a fresh process measured by scripts/benchmarking.py, in turn, ``--runs``
   rounds: cogexport with ``--workers 1`` and ``--workers 2``, the reference job with 1 and 2 threads (reading the
   release, quantizing, writing the bytes), the I/O floors (the release's bytes read, the file's bytes written) and
   cogexport's start. The reference job also reports the time its quantizing took (C's one-core time, from the
   1-thread runs).
4. The issue's bound: cogexport's wall time with N cores at most 1.25 x (C's one-core time / N) + the I/O floor, for
   N = 1 and 2 as measured, and for 4 and 8 worked out from the per-core figures (cogexport's work, its wall time
   less the floor and the start, divided by N times the parallel efficiency it reached on 2 cores; not measured);
   peak memory at most 0.25x the fp32 model.

The figures, with the day and commit they were measured at: docs/benchmarks.md#gguf-beside-llamacpps-c-reference.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_gguf import DEFAULT_WORK, quant_tools  # noqa: E402
from benchmarking import (ROOT, START, floor_reads, floor_rows, measure_tree, print_table, retarget,  # noqa: E402
                          run_json, start_tool, summarize, time_alternately, with_workers)

LIBRARY = Path(os.environ.get("COGEXPORT_GGML_REFERENCE",
                              ROOT / "tests" / ".fixtures" / "ggml-reference" / "libggml_quants_ref.so"))
FLOAT_TYPES = ("F32", "F16", "BF16")
BOUND_FACTOR = 1.25
WORKERS = (1, 2)
WORKED_OUT = (4, 8)


def row_name(workers: int) -> str:
    return f"cogexport --workers {workers}"


def reference_name(threads: int) -> str:
    return f"C reference, {threads} thread{'s' if threads > 1 else ''}"


# --------------------------------------------------------------------------------------------------------------
# The reference job: llama.cpp's C quantizers on the release's values (no torch)

class CReference:
    """llama.cpp's reference quantizers as built by scripts/build_ggml_reference.sh."""

    def __init__(self, library: Path) -> None:
        if not library.is_file():
            raise click.ClickException(f"{library}: llama.cpp's reference quantizers are not built; run "
                                       "scripts/build_ggml_reference.sh (or pass --library)")
        self.library = ctypes.CDLL(str(library))

    def quantize(self, rows, type_name: str, threads: int = 1, pool: ThreadPoolExecutor | None = None):
        """``rows`` (float32, (rows, values a row), C-contiguous) stored as ``type_name``: uint8 (rows, bytes a row).
        With ``threads`` > 1 the rows are split into that many runs, one per thread of ``pool``."""
        import gguf
        import numpy as np

        kind = gguf.GGMLQuantizationType[type_name]
        if type_name in FLOAT_TYPES:
            return gguf.quants.quantize(rows, kind).view(np.uint8).reshape(rows.shape[0], -1)
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        out = np.empty((rows.shape[0], rows.shape[1] // block * block_bytes), dtype=np.uint8)
        function = getattr(self.library, f"quantize_row_{type_name.lower().replace('_k', '_K')}_ref")

        def run(start: int, stop: int) -> None:
            values = rows[start:stop]
            function(values.ctypes.data_as(ctypes.c_void_p), out[start:stop].ctypes.data_as(ctypes.c_void_p),
                     ctypes.c_int64(values.size))

        bounds = [rows.shape[0] * piece // threads for piece in range(threads + 1)]
        if threads <= 1 or pool is None:
            run(0, rows.shape[0])
        else:
            for future in [pool.submit(run, start, stop) for start, stop in zip(bounds, bounds[1:]) if stop > start]:
                future.result()
        return out


def reference_job(release: Path, plan: list[list], output: Path, threads: int, library: Path) -> dict:
    """Every tensor of ``plan`` ([name, type, stored shape], in the file's order) read from ``release``, quantized by
    the C reference with ``threads`` threads and its bytes written to ``output`` one after another; returns the
    time the quantizing took (the reading and writing not counted) and the values quantized."""
    import numpy as np
    from safetensors import safe_open

    reference, quantizing, values = CReference(library), 0.0, 0
    output.parent.mkdir(parents=True, exist_ok=True)
    with safe_open(release, framework="numpy") as source, open(output, "wb") as sink, \
            ThreadPoolExecutor(threads) as pool:
        for name, type_name, shape in plan:
            rows = np.ascontiguousarray(source.get_tensor(name), dtype=np.float32).reshape(-1, shape[-1])
            start = time.perf_counter()
            stored = reference.quantize(rows, type_name, threads, pool)
            quantizing += time.perf_counter() - start
            values += rows.size
            sink.write(memoryview(stored.reshape(-1)))
    return {"quantize_seconds": quantizing, "values": values, "threads": threads}


# --------------------------------------------------------------------------------------------------------------
# The checks and the per-value comparison (in child processes: they read the GGUF file through cogexport)

def file_plan(gguf_file: Path) -> list[list]:
    """[name, type, stored shape] of every tensor of ``gguf_file``, in its order."""
    from cogexport.checkpoint.gguf_file import GgufCheckpoint

    with GgufCheckpoint(gguf_file) as stored:
        return [[name, stored.types[name], list(stored.stored_shapes[name])] for name in stored.types]


def differing_tensors(gguf_file: Path, plan: list[list], reference_output: Path) -> list[str]:
    """The tensors whose bytes in ``gguf_file`` differ from the reference job's (its output, in ``plan``'s order)."""
    import numpy as np

    from cogexport.checkpoint.gguf_file import GgufCheckpoint

    differing, offset = [], 0
    expected = np.memmap(reference_output, dtype=np.uint8, mode="r")
    with GgufCheckpoint(gguf_file) as stored:
        for name, _, _ in plan:
            ours = stored.stored_bytes(name)
            if not np.array_equal(ours, expected[offset:offset + ours.size]):
                differing.append(name)
            offset += ours.size
    if offset != expected.size:
        differing.append(f"(the reference wrote {expected.size} bytes, the file's tensors hold {offset})")
    return differing


def per_value(release: Path, plan: list[list], sample: int, runs: int, library: Path) -> dict:
    """Per quantized type: cogexport's and the C reference's one-core time on the same tensors (the ``sample``
    largest of the type), one after the other, ``runs`` rounds; medians of the thread's CPU time."""
    import numpy as np
    import torch
    from safetensors import safe_open

    from cogexport.quantize import quantize_tensor

    torch.set_num_threads(1)
    reference = CReference(library)
    by_type: dict[str, list[list]] = {}
    for entry in plan:
        if entry[1] not in FLOAT_TYPES:
            by_type.setdefault(entry[1], []).append(entry)
    results = {}
    with safe_open(release, framework="numpy") as source:
        for type_name, entries in by_type.items():
            chosen = sorted(entries, key=lambda entry: -int(np.prod(entry[2])))[:sample]
            tensors = [np.ascontiguousarray(source.get_tensor(name), dtype=np.float32).reshape(-1, shape[-1])
                       for name, _, shape in chosen]
            ours, theirs = [], []
            for _ in range(runs):
                ours.append(_cpu_seconds(lambda: [quantize_tensor(torch.from_numpy(t), type_name) for t in tensors]))
                theirs.append(_cpu_seconds(lambda: [reference.quantize(t, type_name) for t in tensors]))
            values = sum(t.size for t in tensors)
            mine, c = statistics.median(ours), statistics.median(theirs)
            results[type_name] = {"tensors": len(tensors), "values": values, "cogexport_ns": 1e9 * mine / values,
                                  "c_ns": 1e9 * c / values, "ratio": mine / c, "quantizer": _quantizer(type_name)}
    return results


def _quantizer(type_name: str) -> str:
    """Which of cogexport's quantizers made the type: the compiled K quantizer when built, else the torch code."""
    from cogexport.quantize import kernel

    return "compiled (kquant_kernel.c)" if kernel.handles(type_name) else "torch"


def _cpu_seconds(work) -> float:
    start = time.thread_time()
    work()
    return time.thread_time() - start


# --------------------------------------------------------------------------------------------------------------
# The run

def measured_quant(release: Path, facts: dict, quant: str, work: Path, me: list[str], runs: int,
                   sample: int) -> dict:
    """Steps 1-3 of the docstring for one ``--quant``."""
    commands, out = quant_tools(facts, release, quant, work)
    command = commands["cogexport"][0]
    shutil.rmtree(out, ignore_errors=True)
    measure_tree(command)
    gguf_file = next(out.glob("*.gguf"))
    plan_path = work / f"plan-{quant}.json"
    plan = run_json(me + ["--mode", "plan", "--output", str(gguf_file)])
    plan_path.write_text(json.dumps(plan))
    reference_output = work / "out-reference-check" / "reference.bin"
    run_json(me + ["--mode", "reference", "--plan", str(plan_path), "--output", str(reference_output)])
    differing = run_json(me + ["--mode", "compare", "--plan", str(plan_path), "--output", str(gguf_file),
                               "--reference-output", str(reference_output)])
    if differing:
        raise click.ClickException(f"{gguf_file}: {len(differing)} tensors differ from llama.cpp's C reference: "
                                   f"{', '.join(differing[:5])}")
    shutil.rmtree(reference_output.parent, ignore_errors=True)
    written = gguf_file.stat().st_size
    per_type = run_json(me + ["--mode", "per-value", "--plan", str(plan_path), "--sample-tensors", str(sample),
                              "--runs", str(runs)])
    reports = work / f"reference-reports-{quant}.jsonl"
    reports.unlink(missing_ok=True)
    rows = {row_name(n): (with_workers(retarget(command, out, work / f"out-w{n}"), n), work / f"out-w{n}")
            for n in WORKERS}
    for threads in WORKERS:
        target = work / f"out-c{threads}"
        rows[reference_name(threads)] = (me + ["--mode", "reference", "--plan", str(plan_path), "--threads",
                                               str(threads), "--output", str(target / "reference.bin"),
                                               "--report", str(reports)], target)
    rows.update(floor_rows(floor_reads([release], release.stat().st_size), written, work / "out-floor"))
    rows[START] = (start_tool(command), work / "out-start")
    shutil.rmtree(out, ignore_errors=True)
    results = summarize(time_alternately(rows, runs), facts["fp32_bytes"])
    done = [json.loads(line) for line in reports.read_text().splitlines()]
    c_quantizing = {n: statistics.median(r["quantize_seconds"] for r in done if r["threads"] == n) for n in WORKERS}
    return {"quant": quant, "file_bytes": written, "tensors": len(plan), "per_value": per_type,
            "c_quantize_seconds": c_quantizing, "results": results, "bounds": bound_lines(results, c_quantizing[1])}


def bound_lines(results: list[dict], c_one_core: float) -> list[str]:
    """The issue's bounds against this run's medians (see the docstring, step 4)."""
    by_tool = {row["tool"]: row for row in results}
    floor = min((row for row in results if row["tool"].startswith("I/O floor")), key=lambda row: row["seconds"])
    start = by_tool[START]["seconds"]
    lines = []
    for n in WORKERS:
        wall, bound = by_tool[row_name(n)]["seconds"], BOUND_FACTOR * c_one_core / n + floor["seconds"]
        verdict = "within" if wall <= bound else "over"
        lines.append(f"{n} core{'s' if n > 1 else ''}: cogexport {wall:.1f} s, bound {BOUND_FACTOR} x "
                     f"{c_one_core:.1f} / {n} + {floor['seconds']:.1f} = {bound:.1f} s: {verdict} "
                     f"({wall / bound:.2f}x)")
    work_one = by_tool[row_name(1)]["seconds"] - floor["seconds"] - start
    work_two = by_tool[row_name(2)]["seconds"] - floor["seconds"] - start
    efficiency = work_one / (2 * work_two) if work_two > 0 else float("nan")
    lines.append(f"worked out (not measured): cogexport's work {work_one:.1f} s on one core, parallel efficiency on 2 "
                 f"cores {efficiency:.2f}")
    for n in WORKED_OUT:
        wall = start + floor["seconds"] + work_one / (n * efficiency)
        bound = BOUND_FACTOR * c_one_core / n + floor["seconds"]
        lines.append(f"  {n} cores: about {wall:.1f} s against the bound {bound:.1f} s ({wall / bound:.2f}x)")
    memory = max(by_tool[row_name(n)].get("peak_pss_x_model", by_tool[row_name(n)]["peak_rss_x_model"])
                 for n in WORKERS)
    lines.append(f"cogexport peak memory: {memory:.2f}x the fp32 model (goal: at most 0.25x)")
    return lines


def report(facts: dict, variant: str, layers: int | None, runs: int, measured: list[dict]) -> None:
    click.echo(f"{variant}{f' ({layers} blocks)' if layers else ''}: {facts['parameters']:,} parameters, fp32 release "
               f"{facts['fp32_bytes'] / 1e9:.2f} GB -> GGUF; medians of {runs} run(s); every tensor of cogexport's "
               "file compared with llama.cpp's C reference first")
    for one in measured:
        click.echo(f"\n{one['quant']}: {one['tensors']} tensors, file {one['file_bytes'] / 1e9:.2f} GB, every one "
                   "byte-identical to the C reference")
        click.echo("per value, one core (CPU time of the thread, the same tensors):")
        for type_name, figures in one["per_value"].items():
            click.echo(f"  {type_name}: cogexport {figures['cogexport_ns']:.1f} ns, C {figures['c_ns']:.1f} ns: "
                       f"{figures['ratio']:.2f}x ({figures['tensors']} tensors, {figures['values']:,} values, "
                       f"cogexport's {figures['quantizer']} quantizer; the issue: at most 1.1x)")
        print_table(one["results"], "tool", 34, lambda row: row["tool"])
        c_times = one["c_quantize_seconds"]
        click.echo(f"C's quantizing time inside its job: {c_times[1]:.1f} s with 1 thread (C's one-core time), "
                   f"{c_times[2]:.1f} s with 2 threads ({c_times[1] / c_times[2]:.2f}x)")
        for line in one["bounds"]:
            click.echo(line)


@click.command()
@click.option("--variant", default="Wan2.1-T2V-1.3B", show_default=True)
@click.option("--layers", type=int, default=None, help="keep this many blocks (a full-width subset)")
@click.option("--quant", "quants", multiple=True, default=("Q4_K_M", "Q8_0"), show_default=True)
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--sample-tensors", type=int, default=8, show_default=True,
              help="tensors of each quantized type in the per-value comparison (the largest)")
@click.option("--work", type=click.Path(path_type=Path), default=DEFAULT_WORK, show_default=True)
@click.option("--library", type=click.Path(path_type=Path), default=LIBRARY, show_default=True,
              help="llama.cpp's reference quantizers (scripts/build_ggml_reference.sh)")
@click.option("--json", "as_json", is_flag=True)
@click.option("--mode", type=click.Choice(["run", "plan", "reference", "compare", "per-value"]), default="run",
              hidden=True)
@click.option("--plan", "plan_path", type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--output", type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--reference-output", type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--threads", type=int, default=1, hidden=True)
@click.option("--report", "report_path", type=click.Path(path_type=Path), default=None, hidden=True)
def main(variant, layers, quants, runs, sample_tensors, work, library, as_json, mode, plan_path, output,
         reference_output, threads, report_path):
    release = work / f"{variant}{f'-{layers}-layers' if layers else ''}" / "diffusion_pytorch_model.safetensors"
    plan = json.loads(plan_path.read_text()) if plan_path else None
    if mode == "plan":
        return click.echo(json.dumps(file_plan(output)))
    if mode == "reference":
        done = reference_job(release, plan, output, threads, library)
        if report_path:
            with open(report_path, "a") as sink:
                sink.write(json.dumps(done) + "\n")
        return click.echo(json.dumps(done))
    if mode == "compare":
        return click.echo(json.dumps(differing_tensors(output, plan, reference_output)))
    if mode == "per-value":
        return click.echo(json.dumps(per_value(release, plan, sample_tensors, runs, library)))
    CReference(library)  # refuses a missing library before anything runs
    gguf_script = Path(__file__).resolve().parent / "benchmark_gguf.py"
    prepare = [sys.executable, str(gguf_script), "--variant", variant, "--work", str(work), "--mode", "prepare"]
    facts = run_json(prepare + (["--layers", str(layers)] if layers else []))
    me = [sys.executable, __file__, "--variant", variant, "--work", str(work), "--library", str(library)]
    me += ["--layers", str(layers)] if layers else []
    measured = [measured_quant(release, facts, quant, work, me, runs, sample_tensors) for quant in quants]
    if as_json:
        return click.echo(json.dumps({"variant": variant, "layers": layers, **facts, "quants": measured}, indent=1))
    report(facts, variant, layers, runs, measured)


if __name__ == "__main__":
    main()
