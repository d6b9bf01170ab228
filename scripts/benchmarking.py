"""What the benchmark scripts share: timing a command in a fresh process while sampling the memory of its whole
process tree, the medians and ratios they report, and the cached DeepSpeed checkpoints of the bench model with the
ground truth taken inside their training processes.

Memory is measured on the whole process tree (the command and every process it starts, however deep), by sampling
/proc while it runs:

- peak PSS (the headline figure): the largest value, over the run, of the sum of the proportional set sizes of the
  processes alive at that moment. A page shared by n processes counts 1/n in each, so every page the tree holds
  counts once: it is the tree's physical memory, as a cgroup would charge it (without the page cache of files it
  only reads or writes). The kernel takes longer to count PSS the bigger a process is (about 13 ms per GB), so it
  is sampled every 20 ms or, for big processes, as often as keeps the counting under a tenth of one core (every
  ~0.6 s at 5 GB); these tools hold their peaks for seconds.
- peak RSS: the same sum of resident set sizes, sampled every 10 ms (and never less than the kernel's own
  high-water mark of the largest single process, ru_maxrss from wait4). A page two processes share (a library, a
  forked worker's memory still shared with its parent) counts once in each, so for a multi-process tool it is an
  upper bound; for one process it is that process's RSS.

A harness must not import torch or hold tensors: it would add its own memory to the machine under test, and Linux
hands a parent's RSS high-water mark to a child's ru_maxrss at exec (vfork shares the parent's mm).
"""

from __future__ import annotations

import compileall
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
BENCH_WIDTH, BENCH_LAYERS, BENCH_HEAD = 4096, 28, 1013  # make_deepspeed_checkpoint.py's BenchModel
# make_deepspeed_checkpoint.py's bench models: (width, layers, head size).
BENCH_MODELS = {"bench": (BENCH_WIDTH, BENCH_LAYERS, BENCH_HEAD), "bench-small": (256, 4, BENCH_HEAD)}
RSS_INTERVAL, PSS_MIN_INTERVAL, PSS_DUTY = 0.01, 0.02, 0.1
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Measurement:
    """One run of one tool: peak RSS and peak PSS of the process tree (see the module docstring)."""

    seconds: float
    peak_bytes: int  # peak RSS of the tree (what ``measure`` returns)
    peak_pss_bytes: int | None = None
    largest_process_bytes: int | None = None  # ru_maxrss of the largest single process the command waited for
    processes: int = 1  # processes of the tree seen over the run
    most_alive: int = 1  # the most of them alive at one sample
    cpu_seconds: float | None = None  # user + system time of the command and the children it waited for


class ProcessTree:
    """The live processes descended from ``root``, found by parent pid in /proc.

    The harness makes itself a child subreaper, so a process whose parent exits is re-parented to the harness rather
    than to init and is still recognised; a process, once recognised, stays in the tree until it is gone.
    """

    def __init__(self, root: int) -> None:
        self.members: set[int] = {root}
        self.outsiders: set[int] = set()
        self.harness = os.getpid()
        self.seen: set[int] = {root}

    def refresh(self) -> set[int]:
        alive = {int(entry) for entry in os.listdir("/proc") if entry.isdigit()}
        self.members &= alive
        self.outsiders &= alive  # a pid that disappears may come back as a process of ours
        unknown = {pid: _parent(pid) for pid in alive - self.members - self.outsiders}
        grew = True
        while grew:  # a child and its own child may both be new since the last sample
            grew = False
            for pid, parent in list(unknown.items()):
                if parent in self.members or parent == self.harness:
                    self.members.add(pid)
                    del unknown[pid]
                    grew = True
        self.outsiders |= unknown.keys()
        self.seen |= self.members
        return set(self.members)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'
            return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            return int(handle.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0  # exited between the listing and the read


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


class TreeSampler:
    """Samples the tree's summed RSS and summed PSS in two threads (a PSS read of a big process takes the kernel
    tens of milliseconds and must not delay the RSS samples)."""

    def __init__(self, root: int) -> None:
        self.tree = ProcessTree(root)
        self.members: set[int] = {root}
        self.peak_rss = self.peak_pss = 0
        self.most_alive = 1
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._sample_rss, daemon=True),
                         threading.Thread(target=self._sample_pss, daemon=True)]

    def __enter__(self) -> "TreeSampler":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _sample_rss(self) -> None:
        while True:
            self.members = self.tree.refresh()
            self.most_alive = max(self.most_alive, len(self.members))
            self.peak_rss = max(self.peak_rss, sum(_rss(pid) for pid in self.members))
            if self._stop.wait(RSS_INTERVAL):
                return

    def _sample_pss(self) -> None:
        while True:
            start = time.perf_counter()
            self.peak_pss = max(self.peak_pss, sum(_pss(pid) for pid in set(self.members)))
            counting = time.perf_counter() - start
            if self._stop.wait(max(PSS_MIN_INTERVAL, counting * (1 - PSS_DUTY) / PSS_DUTY)):
                return


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _reap_orphans() -> None:
    """Wait for descendants re-parented to the harness (their parent exited before them)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def measure_tree(command: list[str], env: dict | None = None) -> Measurement:
    """Run ``command`` in a fresh process and measure it (wall time, memory of its whole process tree)."""
    os.sync()  # start each run with no dirty pages from the previous run's output being written back
    _become_subreaper()
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a chatty child cannot block on a full pipe
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        with TreeSampler(process.pid) as sampler:
            _, status, usage = os.wait4(process.pid, 0)
            elapsed = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
        _reap_orphans()
        if process.returncode != 0:
            stderr.seek(0)
            raise click.ClickException(f"{' '.join(command)} failed:\n{stderr.read().decode()[-3000:]}")
    largest = usage.ru_maxrss * 1024
    return Measurement(elapsed, max(sampler.peak_rss, largest), sampler.peak_pss or None, largest,
                       len(sampler.tree.seen), sampler.most_alive, usage.ru_utime + usage.ru_stime)


def measure(command: list[str], env: dict | None = None) -> tuple[float, int]:
    """Run ``command``; return (wall seconds, peak RSS bytes of its whole process tree). ``measure_tree`` says more."""
    measured = measure_tree(command, env)
    return measured.seconds, measured.peak_bytes


def time_alternately(commands: dict[str, tuple[list[str], Path]], runs: int, measure_one=measure_tree) -> dict:
    """``runs`` rounds of every tool in turn, each in a fresh process writing into its emptied output folder; the
    outputs are removed as soon as measured. {tool: [what ``measure_one`` returned, a run]}."""
    compile_cogexport_bytecode()
    samples: dict[str, list] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (command, output) in commands.items():
            shutil.rmtree(output, ignore_errors=True)
            samples[name].append(measure_one(command))
            shutil.rmtree(output, ignore_errors=True)  # full-size outputs: one on disk at a time
    return samples


def compile_cogexport_bytecode() -> None:
    """Compile cogexport's modules as pip does when it installs the wheel, so that every run loads them as a user's
    install does. The benchmarks run the editable checkout, which Python otherwise compiles from source in every
    process where bytecode is not written (PYTHONDONTWRITEBYTECODE, set on these machines): about 0.2 s of each run's
    start. The other tools' modules were compiled by pip."""
    compileall.compile_dir(ROOT / "cogexport", quiet=1)


def _as_measurement(value: Measurement | tuple[float, int]) -> Measurement:
    return value if isinstance(value, Measurement) else Measurement(*value)


def summarize(samples: dict[str, list[Measurement | tuple[float, int]]], model_bytes: int, **labels) -> list[dict]:
    """One row per tool: medians, peak memory as a multiple of the fp32 model, ratios to the first tool (ours).
    ``samples`` holds ``measure_tree`` results (or ``measure``'s (seconds, peak RSS) pairs, then without PSS)."""
    rows = []
    for name, values in samples.items():
        runs = [_as_measurement(v) for v in values]
        seconds, rss = statistics.median(r.seconds for r in runs), statistics.median(r.peak_bytes for r in runs)
        row = {**labels, "tool": name, "seconds": round(seconds, 2), "peak_rss_bytes": rss,
               "peak_rss_x_model": round(rss / model_bytes, 3), "runs": len(runs),
               "samples": [{"seconds": round(r.seconds, 2), "peak_rss_bytes": r.peak_bytes} for r in runs]}
        if all(r.peak_pss_bytes is not None for r in runs):
            pss = statistics.median(r.peak_pss_bytes for r in runs)
            row.update(peak_pss_bytes=pss, peak_pss_x_model=round(pss / model_bytes, 3),
                       most_alive=max(r.most_alive for r in runs), processes=max(r.processes for r in runs))
            for sample, run in zip(row["samples"], runs):
                sample.update(peak_pss_bytes=run.peak_pss_bytes, largest_process_bytes=run.largest_process_bytes,
                              processes=run.processes, most_alive=run.most_alive)
        rows.append(row)
    ours = rows[0]
    for row in rows:
        row["time_ratio_vs_cogexport"] = round(row["seconds"] / ours["seconds"], 2)
        row["rss_ratio_vs_cogexport"] = round(row["peak_rss_bytes"] / ours["peak_rss_bytes"], 2)
        if "peak_pss_bytes" in row and "peak_pss_bytes" in ours:
            row["pss_ratio_vs_cogexport"] = round(row["peak_pss_bytes"] / ours["peak_pss_bytes"], 2)
    return rows


def bench_model_bytes(model: str = "bench") -> int:
    """The bench model's size in fp32."""
    width, layers, head = BENCH_MODELS[model]
    return 4 * (layers * width * width + head * width + head)


def bench_checkpoint(work: Path, stage: int, model: str = "bench") -> Path:
    """The save dir of a bf16, world size 2 DeepSpeed checkpoint of the bench model, made once per work dir.
    Beside it (``bench_truth``) the ground truth taken inside the training process: every fp32 master and Adam
    state, gathered from the live engine."""
    folder = work / f"{model}-zero{stage}-bf16-ws2"
    if not (folder / "complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"making the ZeRO-{stage} {model} checkpoint with its ground truth (a few minutes)...", err=True)
        subprocess.run([sys.executable, str(SCRIPTS / "make_deepspeed_checkpoint.py"), str(folder),
                        "--model", model, "--stage", str(stage), "--dtype", "bf16", "--world-size", "2",
                        "--steps", "1", "--stream-truth"], check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "DS_ACCELERATOR": "cpu"})
        (folder / "complete").write_text("")  # written last: marks the checkpoint and its truth complete
    return folder / "checkpoint"


def bench_truth(checkpoint: Path) -> Path:
    """The folder holding truth.safetensors and truth.json of a ``bench_checkpoint``."""
    return checkpoint.parent


def run_json(command: list[str]) -> dict:
    """Run a helper command in a child process (the harness never imports torch); the JSON it prints."""
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"{' '.join(command[1:])} failed (its error is above)")
    return json.loads(done.stdout)


def print_table(rows: list[dict], first_column: str, first_width: int, label) -> None:
    """The human-readable table every benchmark prints: memory is peak PSS when measured (else peak RSS)."""
    pss = all("pss_ratio_vs_cogexport" in row for row in rows)
    first_width = max(first_width, *(len(label(row)) + 1 for row in rows))
    memory = "peak_pss_bytes" if pss else "peak_rss_bytes"
    name = "PSS" if pss else "RSS"
    tree = f" {'peak RSS':>9} {'procs':>5}" if pss else ""
    click.echo(f"{first_column:<{first_width}} {'wall s':>7} {'peak ' + name:>9}{tree} {'x fp32 model':>13} "
               f"{'time / ours':>12} {name + ' / ours':>11}   per run: s / {name} GB")
    for row in rows:
        per_run = ", ".join(f"{s['seconds']:.1f}/{s[memory] / 1e9:.2f}" for s in row["samples"])
        columns = f"{row[memory] / 1e9:>7.2f}GB" + (
            f" {row['peak_rss_bytes'] / 1e9:>7.2f}GB {row['most_alive']:>5}" if pss else "")
        click.echo(f"{label(row):<{first_width}} {row['seconds']:>7.1f} {columns} "
                   f"{row[memory.replace('_bytes', '_x_model')]:>12.2f}x {row['time_ratio_vs_cogexport']:>11.2f}x "
                   f"{row[name.lower() + '_ratio_vs_cogexport']:>10.2f}x   {per_run}")
    if pss:
        click.echo("peak PSS: the peak of the summed proportional set sizes of the tool's whole process tree (every "
                   "page counted once); peak RSS: the same with resident set sizes (shared pages counted in each "
                   "process); procs: the most processes of the tree alive at once. Medians over the runs.")



# --------------------------------------------------------------------------------------------------------------
# The I/O floor, cogexport's --workers 1 row, and the scaling table (issue 22)

FLOOR = "I/O floor (dd)"
WORKERS_1 = "cogexport --workers 1"
BLOCK = 16 << 20


def cores() -> int:
    return len(os.sched_getaffinity(0))


def floor_reads(files: list[Path], total: int) -> list[tuple[Path, int]]:
    """``total`` bytes to read, taken from ``files`` in proportion to their sizes (never more than a file holds)."""
    sizes = [path.stat().st_size for path in files]
    whole = sum(sizes) or 1
    shares = [min(size, total * size // whole) for size in sizes]
    shares[-1] = min(sizes[-1], shares[-1] + total - sum(shares))
    return list(zip(files, shares))


def floor_tool(reads: list[tuple[Path, int]], write_bytes: int, output: Path) -> tuple[list[str], Path]:
    """The I/O floor of a job: ``dd`` reading the bytes the job must read (``reads``: each input file and how many
    of its bytes, from its start) and writing the first ``write_bytes`` of them into files in ``output``, in 16 MB
    blocks through one buffer: the same bytes in and out, with no parsing, casting or checking. (cogexport copies
    unchanged tensors in the kernel, which can beat this floor: dd's bytes pass through user space.)"""
    steps, left = [f"mkdir -p {output}"], write_bytes
    for index, (path, count) in enumerate(reads):
        written = min(left, count)
        left -= written
        if written:
            steps.append(f"dd if={path} of={output}/floor-{index} bs={BLOCK} iflag=count_bytes count={written} "
                         "status=none")
        if count > written:
            steps.append(f"dd if={path} of=/dev/null bs={BLOCK} iflag=skip_bytes,count_bytes skip={written} "
                         f"count={count - written} status=none")
    if left:
        steps.append(f"dd if=/dev/zero of={output}/floor-rest bs={BLOCK} iflag=count_bytes count={left} status=none")
    return ["bash", "-c", " && ".join(steps)], output


KERNEL_FLOOR = "I/O floor (kernel copy, as cp)"
# The kernel-copy floor: the bytes written are copied file to file by copy_file_range (what cp does here, and what
# cogexport does with unchanged tensors); the bytes read but not written go through one buffer, as a reader's must.
_KERNEL_COPY = r"""
import os, sys
output, left = sys.argv[1], int(sys.argv[2])
os.makedirs(output, exist_ok=True)
buffer = memoryview(bytearray(16 << 20))
for index in range(3, len(sys.argv), 2):
    path, count = sys.argv[index], int(sys.argv[index + 1])
    written, source = min(left, count), os.open(path, os.O_RDONLY)
    left -= written
    if written:
        target = os.open(f"{output}/floor-{index}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        done = 0
        while done < written:
            done += os.copy_file_range(source, target, min(1 << 30, written - done), done, done)
        os.close(target)
    position = written
    while position < count:
        position += os.preadv(source, [buffer[:min(len(buffer), count - position)]], position)
    os.close(source)
with open(f"{output}/floor-rest", "wb") as handle:  # more written than read: zeros, as dd's /dev/zero
    while left > 0:
        left -= handle.write(buffer[:min(len(buffer), left)])
"""


def kernel_floor_tool(reads: list[tuple[Path, int]], write_bytes: int, output: Path) -> tuple[list[str], Path]:
    """The I/O floor of a job as ``floor_tool``'s, with the bytes written copied in the kernel (copy_file_range,
    cp's way here) instead of through dd's buffer: the faster floor where nothing needs to pass through user space."""
    pairs = [str(item) for path, count in reads for item in (path, count)]
    return [sys.executable, "-c", _KERNEL_COPY, str(output), str(write_bytes), *pairs], output


def floor_rows(reads: list[tuple[Path, int]], write_bytes: int, output: Path) -> dict[str, tuple[list[str], Path]]:
    """Both floors of a job, by row name, writing into ``output``."""
    return {FLOOR: floor_tool(reads, write_bytes, output), KERNEL_FLOOR: kernel_floor_tool(reads, write_bytes, output)}


def tree_bytes(folder: Path, suffixes: tuple[str, ...] = (".safetensors", ".pt", ".bin")) -> int:
    """Bytes of the data files under ``folder`` (hard links counted once)."""
    seen, total = set(), 0
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix in suffixes and path.stat().st_ino not in seen:
            seen.add(path.stat().st_ino)
            total += path.stat().st_size
    return total


def retarget(command: list[str], output: Path, elsewhere: Path) -> list[str]:
    """The command writing ``elsewhere`` instead of ``output`` (its OUTPUT argument)."""
    return [str(elsewhere) if argument == str(output) else argument for argument in command]


def with_workers(command: list[str], workers: int) -> list[str]:
    return [*command, "--workers", str(workers)]


START = "cogexport start (--help)"


def start_tool(command: list[str]) -> list[str]:
    """A cogexport run's fixed cost: the same command line with --help, which starts Python, imports torch and what
    the command needs (an export: every family's data), and reads and writes nothing."""
    return [*command, "--help"]


NO_CACHE = "cogexport, Diffusers not cached"


def without_diffusers_cache(command: list[str]) -> list[str]:
    """The export command with cogexport's cache of what Diffusers' classes tell turned off
    (cogexport/models/diffusers_cache.py): what an export costs the first time it meets a class and config, Diffusers
    imported. The other cogexport rows find the cache filled by their untimed first run."""
    return ["env", "COGEXPORT_CACHE_DIR=", *command]


def under_torchrun(command: list[str], processes: int) -> list[str]:
    """The cogexport command (``command[0]`` the cogexport script) as a torchrun job of ``processes`` processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
            "-m", "cogexport", *command[1:]]


def scaling_tools(command: list[str], output: Path, elsewhere: Path) -> dict[str, tuple[list[str], Path]]:
    """cogexport (``command``, writing ``output``) at 1, 2 and all cores' worker threads, and under torchrun with 1
    and 2 processes (each with its default workers: the cores shared among the machine's processes), writing
    ``elsewhere``."""
    command, output = retarget(command, output, elsewhere), elsewhere
    variants = {f"workers {n}": (with_workers(command, n), output) for n in dict.fromkeys([1, 2, cores()])}
    variants.update({f"torchrun {n} process{'es' if n > 1 else ''}": (under_torchrun(command, n), output)
                     for n in (1, 2)})
    return variants


def differing_files(ours: Path, other: Path, ignore: tuple[str, ...] = ("README.md",)) -> list[str]:
    """Files whose bytes differ between two output folders (README.md holds the command line, which differs)."""
    import filecmp

    names = {str(p.relative_to(folder)) for folder in (ours, other) for p in folder.rglob("*") if p.is_file()}
    return sorted(name for name in names if Path(name).name not in ignore
                  and not ((ours / name).is_file() and (other / name).is_file()
                           and filecmp.cmp(ours / name, other / name, shallow=False)))


def check_variants_identical(variants: dict[str, tuple[list[str], Path]], reference: Path,
                             env: dict | None = None) -> None:
    """Run each variant once (untimed) and require its output to be byte for byte ``reference``'s."""
    for name, (command, output) in variants.items():
        shutil.rmtree(output, ignore_errors=True)
        measure_tree(command, env)
        differing = differing_files(reference, output)
        shutil.rmtree(output, ignore_errors=True)
        if differing:
            raise click.ClickException(f"{name} wrote other bytes than cogexport's default run: {differing[:5]}")


def goal_lines(rows: list[dict], others: list[str], ours: str = "cogexport") -> list[str]:
    """Issue 22's goals against this run's medians: wall <= 0.6x the fastest other tool's and <= 1.5x the I/O
    floor's (the faster of the two floors, where both ran); peak PSS <= 0.25x the fp32 model."""
    by_tool = {row["tool"]: row for row in rows}
    mine = by_tool[ours]
    lines = []
    fastest = min((by_tool[name] for name in others if name in by_tool), key=lambda row: row["seconds"], default=None)
    if fastest is not None:
        lines.append(f"{ours} / fastest other tool ({fastest['tool']}): {mine['seconds'] / fastest['seconds']:.2f}x "
                     "wall (goal: at most 0.6x)")
    floor = min((by_tool[name] for name in (FLOOR, KERNEL_FLOOR) if name in by_tool), key=lambda row: row["seconds"],
                default=None)
    if floor is not None:  # the faster floor of the run
        lines.append(f"{ours} / {floor['tool']}: {mine['seconds'] / floor['seconds']:.2f}x wall (goal: at most 1.5x)")
        if START in by_tool:
            net = mine["seconds"] - by_tool[START]["seconds"]
            lines.append(f"{ours} less its start ({by_tool[START]['seconds']:.1f} s) / {floor['tool']}: "
                         f"{net / floor['seconds']:.2f}x wall (the work alone)")
    memory = mine.get("peak_pss_x_model", mine["peak_rss_x_model"])
    lines.append(f"{ours} peak memory: {memory:.2f}x the fp32 model (goal: at most 0.25x)")
    return lines


def print_scaling(rows: list[dict], label: str = "") -> None:
    click.echo(f"\nscaling{label}: the same command at 1, 2 and all {cores()} cores' worker threads, and as a torchrun "
               "job of 1 and 2 processes (memory summed over the job's processes, the launcher included)")
    print_table(rows, "run", max(len(row["tool"]) for row in rows) + 2, lambda row: row["tool"])
