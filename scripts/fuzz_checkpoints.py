"""Corrupt real checkpoints on purpose, and check that cogexport never turns one into a silently wrong model.

    .venv/bin/python scripts/fuzz_checkpoints.py --seed 1 --count 500 [--no-deepspeed] [--json] [--verbose]

Sources are the test suite's real fixtures (DeepSpeed ZeRO stages 0-3 made by real DeepSpeed runs, a SAT-style
CogVideoX run, a safetensors file), copied, then damaged one way each: truncated; a byte flipped in the zip
directory, a zip local header, the pickle, tensor data or a safetensors header's structure (safetensors has no
checksum: damage to its data or names cannot be detected by anyone, so it is left out); a rank file deleted,
swapped with another or overwritten by another's copy; ``latest`` rewritten (each source takes the classes in
turn; where and how from the case's seed). On every damaged copy ``cogexport
inspect`` and ``consolidate`` (and ``export`` for CogVideoX sources) run in a forked child with a time limit, and
each run is classed:

  right           exit 0 and the output equals the ground truth taken where it was born (the training process's
                  fp32 masters; the Diffusers model the SAT run was written from; the tensors the safetensors
                  library saved); for inspect, the report of the undamaged copy
  clean error     exit 2 with exactly one line on stderr, nothing written, the input unchanged
  problems listed inspect only: exit 1 with the problems listed (the checkpoint is not usable)
  silently wrong  exit 0 with a wrong output, or inspect exit 0 (usable) on a copy consolidate refuses
  traceback, multi-line error, hang, dirty (something written or the input changed on an error): failures

DeepSpeed's own consolidator (``deepspeed.utils.zero_to_fp32``, what its ``zero_to_fp32.py`` runs) goes through the
same damaged ZeRO copies, judged against its own output on the undamaged copy: right, silently wrong, error
(an exception: its command line shows a traceback), hang or crash.

The exit status is 1 if any cogexport run failed. The same seed gives the same mutations.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("PYTHONWARNINGS", "ignore")

import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import zipfile  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import click  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from fixtures import CACHE, DeepSpeedVariant, deepspeed_checkpoint  # noqa: E402

TIME_LIMIT = 60.0  # seconds per run; a toy checkpoint takes well under one
FAILURES = ("silently wrong", "traceback", "multi-line error", "hang", "dirty", "inspect missed it")

ZERO_VARIANTS = [
    DeepSpeedVariant(0, "bf16", 2), DeepSpeedVariant(1, "bf16", 2), DeepSpeedVariant(1, "bf16", 2, bf16_optimizer=True),
    DeepSpeedVariant(2, "bf16", 1), DeepSpeedVariant(2, "bf16", 3), DeepSpeedVariant(2, "fp16", 2),
    DeepSpeedVariant(2, "bf16", 3, parameter_alignment=True), DeepSpeedVariant(3, "bf16", 2),
    DeepSpeedVariant(3, "fp32", 3), DeepSpeedVariant(3, "bf16", 2, sub_group_size=300),
]


# -- sources: a pristine copy, what to run on it, and the ground truth ---------------------------------------
@dataclass
class Source:
    name: str
    root: Path  # folder copied for each case; the checkpoint is root / checkpoint
    checkpoint: str  # relative path given to cogexport
    truth: dict[str, torch.Tensor]  # what consolidate must write
    export: tuple[str, ...] | None = None  # extra arguments of an export run, when the source is a CogVideoX model
    export_truth: dict[str, torch.Tensor] = field(default_factory=dict)
    deepspeed: bool = False  # run DeepSpeed's zero_to_fp32 too


def zero_source(variant: DeepSpeedVariant) -> Source:
    fixture = deepspeed_checkpoint(variant)
    expected = fixture.expected_state_dict()
    truth = {name: t if name in fixture.truth["buffers"] or not t.dtype.is_floating_point else t.float()
             for name, t in expected.items()}
    return Source(variant.id, fixture.root, "checkpoint", truth, deepspeed=variant.stage > 0)


def cogvideox_sources() -> list[Source]:
    """A SAT-style run (model states only, fp32 so the export is exact) and the same model as Diffusers-named
    safetensors, both written once into the fixture cache from one seeded tiny CogVideoX transformer."""
    from cogvideox_fixtures import build_tiny_transformer, config_folder, write_sat_run

    folder = CACHE / "fuzz-cogvideox"
    original = build_tiny_transformer("2b", num_layers=2, seed=3)
    truth = {name: t.detach().clone() for name, t in original.state_dict().items()}
    if not (folder / ".complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        write_sat_run(folder / "sat" / "checkpoint", original.state_dict(), dtype=torch.float32)
        (folder / "safetensors").mkdir(parents=True)
        save_file({k: t.contiguous() for k, t in truth.items()}, folder / "safetensors" / "model.safetensors")
        config_folder(folder / "base", original)
        (folder / ".complete").touch()
    export = ("--model-type", "t2v", "--base", str(folder / "base"), "--dtype", "fp32")
    return [Source("sat-2b", folder / "sat", "checkpoint", {}, export, truth),
            Source("safetensors-2b", folder / "safetensors", "model.safetensors", truth, export, truth)]


def sources() -> list[Source]:
    return [zero_source(v) for v in ZERO_VARIANTS] + cogvideox_sources()


# -- mutations ----------------------------------------------------------------------------------------------
def zip_regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges of a torch.save archive by kind."""
    regions: dict[str, list[tuple[int, int]]] = {"zip directory": [], "local header": [], "pickle": [],
                                                 "tensor data": []}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as handle:
        for info in archive.infolist():
            handle.seek(info.header_offset + 26)
            name_length, extra_length = int.from_bytes(handle.read(2), "little"), int.from_bytes(handle.read(2), "little")
            data = info.header_offset + 30 + name_length + extra_length
            regions["local header"].append((info.header_offset, data))
            kind = "pickle" if info.filename.endswith("data.pkl") else "tensor data" if "/data/" in info.filename \
                else None
            if kind and info.file_size:
                regions[kind].append((data, data + info.file_size))
        regions["zip directory"].append((archive.start_dir, path.stat().st_size))
    return {k: v for k, v in regions.items() if v}


def safetensors_regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """The header's structure: its bytes outside tensor names and metadata strings.

    safetensors carries no checksum: a flipped byte in tensor data, or one that turns a tensor's name or a metadata
    value into another valid string, cannot be told from what was saved by any reader. Those bytes are left alone;
    everything else in the header (sizes, braces, dtypes, shapes, offsets) must be caught."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    free_text = [json.dumps(name).encode() for name in header if name != "__metadata__"]
    free_text += [json.dumps(text).encode() for pair in (header.get("__metadata__") or {}).items() for text in pair]
    excluded = sorted((data.find(text, 8), data.find(text, 8) + len(text)) for text in free_text)
    allowed, position = [], 0
    for start, stop in excluded:
        if start > position:
            allowed.append((position, start))
        position = max(position, stop)
    allowed.append((position, 8 + size))
    return {"safetensors header": allowed}


def flip(path: Path, region: tuple[int, int], rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    position = rng.randrange(*region)
    mask = 1 << rng.randrange(8) if rng.random() < 0.5 else rng.randrange(1, 256)
    data[position] ^= mask
    path.write_bytes(bytes(data))
    return f"byte {position} ^= 0x{mask:02x}"


Mutation = Callable[[Path, random.Random], str]


def rank_files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.rglob("*.pt") if "zero_pp_rank_" in p.name)


def mutations_for(source: Source, checkpoint: Path) -> dict[str, Mutation]:
    """The mutations that apply to this source, by class name."""
    data_files = sorted(p for p in checkpoint.rglob("*") if p.suffix in (".pt", ".safetensors"))
    found: dict[str, Mutation] = {}

    def on_file(kind: str) -> Mutation:
        def mutate(root: Path, rng: random.Random) -> str:
            candidates = [(p, r) for p in data_files for r in regions_of(p).get(kind, [])]
            path, region = rng.choice(candidates)
            return f"{path.relative_to(root)}: {flip(path, region, rng)}"
        return mutate

    kinds = {kind for p in data_files for kind in regions_of(p)}
    for kind in sorted(kinds):
        found[f"flip {kind}"] = on_file(kind)

    def truncate(root: Path, rng: random.Random) -> str:
        path = rng.choice(data_files)
        size = path.stat().st_size
        keep = rng.choice([rng.randrange(size), size - rng.randrange(1, min(size, 64) + 1)])
        os.truncate(path, keep)
        return f"{path.relative_to(root)}: truncated to {keep} of {size} bytes"

    found["truncate"] = truncate
    ranks = rank_files(checkpoint)
    if ranks:
        def delete(root: Path, rng: random.Random) -> str:
            path = rng.choice(ranks)
            path.unlink()
            return f"deleted {path.relative_to(root)}"
        found["delete rank file"] = delete
    if len(ranks) > 1:
        def swap(root: Path, rng: random.Random) -> str:
            first, second = rng.sample([p for p in ranks if "optim" in p.name] if rng.random() < 0.7 else ranks, 2)
            temporary = first.with_suffix(".swap")
            first.rename(temporary)
            second.rename(first)
            temporary.rename(second)
            return f"swapped {first.relative_to(root)} and {second.name}"

        def duplicate(root: Path, rng: random.Random) -> str:
            kind = rng.choice(["optim", "model"] if any("model" in p.name for p in ranks) else ["optim"])
            first, second = rng.sample([p for p in ranks if kind in p.name], 2)
            shutil.copyfile(first, second)
            return f"copied {first.relative_to(root)} over {second.name}"
        found["swap rank files"] = swap
        found["duplicate rank file"] = duplicate
    if (checkpoint / "latest").exists():
        def rewrite_latest(root: Path, rng: random.Random) -> str:
            content = rng.choice([bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))),
                                  b"global_step99", b"../../etc", b"", b"global_step2\n\nrm -rf /",
                                  b"\x89PNG\r\n\x1a\n\x00\x00", b"x" * 5000])
            (checkpoint / "latest").write_bytes(content)
            return f"latest := {content[:40]!r}"
        found["rewrite latest"] = rewrite_latest
    return found


def regions_of(path: Path) -> dict[str, list[tuple[int, int]]]:
    return safetensors_regions(path) if path.suffix == ".safetensors" else zip_regions(path)


# -- running a command in a forked child ---------------------------------------------------------------------
@dataclass
class Run:
    code: int | None  # None: killed after TIME_LIMIT
    stdout: str
    stderr: str
    seconds: float


def run_forked(function: Callable[[], int], workdir: Path) -> Run:
    """Run ``function`` in a forked child with stdout/stderr captured, killed after TIME_LIMIT seconds."""
    out_path, err_path = workdir / ".stdout", workdir / ".stderr"
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 98
        try:
            out_fd, err_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), \
                os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            code = function()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 99
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = start + TIME_LIMIT
    code: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
    run = Run(code, read(out_path), read(err_path), time.perf_counter() - start)
    out_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return run


def cogexport_command(*args: str) -> Callable[[], int]:
    def run() -> int:
        from cogexport.cli import main

        main([*args], prog_name="cogexport", standalone_mode=True)
        return 0
    return run


# -- judging ------------------------------------------------------------------------------------------------
def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".std")}


def read_output(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def same_tensors(written: dict[str, torch.Tensor], truth: dict[str, torch.Tensor]) -> bool:
    return written.keys() == truth.keys() and all(
        written[n].dtype == truth[n].dtype and torch.equal(written[n], truth[n]) for n in truth)


def judge_error(run: Run, output: Path, before: dict[str, str], root: Path) -> str:
    """Class of a run that did not succeed."""
    if run.code is None:
        return "hang"
    if run.code == 99 or "Traceback (most recent call last)" in run.stderr:
        return "traceback"
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    if run.code != 2 or len(lines) != 1 or not lines[0].startswith("cogexport: error: "):
        return "multi-line error" if run.code == 2 else "traceback"
    if output.exists() or any(".cogexport-" in p.name for p in output.parent.iterdir()) or snapshot(root) != before:
        return "dirty"
    return "clean error"


def judge_writer(run: Run, output: Path, truth: dict[str, torch.Tensor], before: dict[str, str], root: Path) -> str:
    if run.code == 0:
        if snapshot(root) != before:
            return "dirty"
        return "right" if same_tensors(read_output(output), truth) else "silently wrong"
    return judge_error(run, output, before, root)


def comparable_report(stdout: str, root: Path) -> dict:
    report = json.loads(stdout)
    text = json.dumps(report).replace(str(root), "<root>")
    return json.loads(text)


def judge_inspect(run: Run, pristine: dict | None, root: Path, before: dict[str, str]) -> str:
    if run.code in (0, 1):
        if "Traceback" in run.stderr:
            return "traceback"
        if snapshot(root) != before:
            return "dirty"
        try:
            report = comparable_report(run.stdout, root)
        except ValueError:
            return "traceback"
        if run.code == 1:
            return "problems listed" if report["problems"] else "multi-line error"
        return "right" if report == pristine else "silently wrong"
    return judge_error(run, root / "no-output", before, root)


# -- DeepSpeed's consolidator, side by side ------------------------------------------------------------------
def deepspeed_command(checkpoint: Path, output: Path) -> Callable[[], int]:
    def run() -> int:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
        torch.save({name: t.clone() for name, t in state.items()}, output)
        return 0
    return run


def judge_deepspeed(run: Run, output: Path, baseline: dict | None) -> str:
    if run.code is None:
        return "hang"
    if run.code == 99:
        return "error (traceback)"
    if run.code != 0:
        return "crash"
    written = torch.load(output, weights_only=True)
    return "right" if baseline is not None and same_tensors(written, baseline) else "silently wrong"


# -- the campaign -------------------------------------------------------------------------------------------
@dataclass
class Case:
    seed: int
    source: str
    mutation: str
    detail: str
    results: dict[str, str]
    seconds: dict[str, float] = field(default_factory=dict)


def baseline(source: Source, work: Path, deepspeed: bool) -> tuple[dict, dict | None]:
    """The undamaged copy's inspect report and DeepSpeed's output on it; and a check that cogexport is right."""
    root = work / "pristine"
    shutil.copytree(source.root, root)
    checkpoint = root / source.checkpoint
    inspected = run_forked(cogexport_command("inspect", str(checkpoint), "--json"), work)
    if inspected.code != 0:
        raise click.ClickException(f"inspect fails on the undamaged {source.name}: {inspected.stderr[-2000:]}")
    report = comparable_report(inspected.stdout, root)
    if source.truth:
        done = run_forked(cogexport_command("consolidate", str(checkpoint), str(work / "out")), work)
        if done.code != 0 or not same_tensors(read_output(work / "out"), source.truth):
            raise click.ClickException(f"consolidate is not right on the undamaged {source.name}: {done.stderr}")
    ds_baseline = None
    if deepspeed and source.deepspeed:
        ran = run_forked(deepspeed_command(checkpoint, work / "ds.pt"), work)
        ds_baseline = torch.load(work / "ds.pt", weights_only=True) if ran.code == 0 else None
    shutil.rmtree(root)
    shutil.rmtree(work / "out", ignore_errors=True)
    (work / "ds.pt").unlink(missing_ok=True)
    return report, ds_baseline


def run_case(source: Source, seed: int, turn: int, work: Path, pristine: dict, ds_baseline: dict | None,
             deepspeed: bool) -> Case:
    """Damage a copy of ``source`` (the ``turn``-th time) and judge every run on it."""
    rng = random.Random(seed)
    root = work / f"case-{seed}"
    shutil.copytree(source.root, root)
    checkpoint = root / source.checkpoint
    choices = mutations_for(source, checkpoint.parent if checkpoint.is_file() else checkpoint)
    mutation = sorted(choices)[(turn + seed) % len(choices)]  # each class in turn, so small runs cover them all
    detail = choices[mutation](root, rng)
    before = snapshot(root)
    seconds = {}
    run = run_forked(cogexport_command("inspect", str(checkpoint), "--json"), work)
    results, seconds["inspect"] = {"inspect": judge_inspect(run, pristine, root, before)}, run.seconds
    if source.truth:
        output = work / f"out-{seed}"
        run = run_forked(cogexport_command("consolidate", str(checkpoint), str(output)), work)
        results["consolidate"], seconds["consolidate"] = judge_writer(run, output, source.truth, before, root), \
            run.seconds
        shutil.rmtree(output, ignore_errors=True)
    if source.export:
        output = work / f"export-{seed}"
        run = run_forked(cogexport_command(str(checkpoint), str(output), *source.export), work)
        results["export"], seconds["export"] = judge_writer(run, output, source.export_truth, before, root), \
            run.seconds
        shutil.rmtree(output, ignore_errors=True)
    if results["inspect"] == "right" and any(r != "right" for k, r in results.items() if k != "inspect"):
        results["inspect"] = "inspect missed it"  # told usable, yet a writer refused or erred
    if deepspeed and source.deepspeed and ds_baseline is not None:
        output = work / f"ds-{seed}.pt"
        run = run_forked(deepspeed_command(checkpoint, output), work)
        results["zero_to_fp32"], seconds["zero_to_fp32"] = judge_deepspeed(run, output, ds_baseline), run.seconds
        output.unlink(missing_ok=True)
    shutil.rmtree(root)
    return Case(seed, source.name, mutation, detail, results, {k: round(v, 2) for k, v in seconds.items()})


def campaign(seed: int, count: int, deepspeed: bool, verbose: bool = False) -> list[Case]:
    if deepspeed:
        import deepspeed.utils.zero_to_fp32  # noqa: F401  (imported once, before forking)
    import cogexport.cli  # noqa: F401
    import cogexport.to_diffusers  # noqa: F401
    torch.set_num_threads(1)
    all_sources = sources()
    cases = []
    with tempfile.TemporaryDirectory(prefix="cogexport-fuzz-") as temporary:
        work = Path(temporary)
        baselines = {}
        for index in range(count):
            source = all_sources[index % len(all_sources)]
            if source.name not in baselines:
                baselines[source.name] = baseline(source, work, deepspeed)
            case = run_case(source, seed * 1_000_003 + index, index // len(all_sources), work,
                            *baselines[source.name], deepspeed)
            cases.append(case)
            if verbose:
                click.echo(f"{case.seed} {case.source} [{case.mutation}] {case.detail}: {case.results} {case.seconds}",
                           err=True)
    return cases


def summary(cases: list[Case]) -> dict:
    tools = sorted({tool for case in cases for tool in case.results})
    return {
        "cases": len(cases),
        "runs": sum(len(case.results) for case in cases),
        "by_tool": {tool: dict(Counter(c.results[tool] for c in cases if tool in c.results)) for tool in tools},
        "by_mutation": {m: dict(Counter(r for c in cases if c.mutation == m for r in c.results.values()))
                        for m in sorted({c.mutation for c in cases})},
        "by_source": dict(Counter(c.source for c in cases)),
        "failures": [case.__dict__ for case in cases
                     if any(r in FAILURES for t, r in case.results.items() if t != "zero_to_fp32")],
    }


@click.command()
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--count", type=click.IntRange(1), default=100, show_default=True, help="Damaged copies to make.")
@click.option("--no-deepspeed", is_flag=True, help="Do not run DeepSpeed's zero_to_fp32 side by side.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--verbose", is_flag=True, help="One line per case on stderr.")
def main(seed: int, count: int, no_deepspeed: bool, as_json: bool, verbose: bool) -> None:
    started = time.perf_counter()
    cases = campaign(seed, count, not no_deepspeed, verbose)
    result = summary(cases)
    result.update(seed=seed, seconds=round(time.perf_counter() - started, 1))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(f"seed {seed}: {result['cases']} damaged copies, {result['runs']} runs, {result['seconds']} s")
        click.echo(f"sources: {', '.join(f'{k} {v}' for k, v in result['by_source'].items())}")
        for tool, classes in result["by_tool"].items():
            click.echo(f"  {tool:<13} " + ", ".join(f"{k} {v}" for k, v in sorted(classes.items())))
        click.echo("by mutation:")
        for mutation, classes in result["by_mutation"].items():
            click.echo(f"  {mutation:<26} " + ", ".join(f"{k} {v}" for k, v in sorted(classes.items())))
        for failure in result["failures"]:
            click.echo(f"FAILED seed {failure['seed']} {failure['source']} [{failure['mutation']}] "
                       f"{failure['detail']}: {failure['results']}")
    sys.exit(1 if result["failures"] else 0)


if __name__ == "__main__":
    main()
