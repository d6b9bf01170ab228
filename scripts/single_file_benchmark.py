"""What the family benchmarks (benchmark_wan.py, benchmark_wan_variants.py, benchmark_hunyuanvideo.py,
benchmark_ltx_video.py, benchmark_ltx2.py, benchmark_mochi.py, benchmark_framepack.py, benchmark_sana_video.py,
benchmark_kandinsky6.py, ...) share: a full-width release of random weights in its published layout (one file, or
shards with their index), the reference path (Diffusers' ``from_single_file`` with a local config, or
``from_pretrained`` of a release already in Diffusers' names, then ``save_pretrained``; or another project's script,
extracted from its repository), the comparison of the two outputs, and the run.

The run: each tool exports once, untimed, in a fresh process, and the two outputs are compared tensor by tensor
(same names, shapes and config; equal values, the tensors cogexport keeps in fp32 compared after rounding to the
reference's bf16, or exactly where the reference keeps them in fp32 too); any difference fails the benchmark before
anything is timed. Then
each tool runs --runs times, alternating, each in a fresh process: peak PSS and RSS of its process tree and wall time
(scripts/benchmarking.py), medians. The harness never imports torch: making the release and comparing run in
helper processes (the script's hidden --prepare and --compare modes).

Release files are written a tensor at a time where the format allows it (safetensors, by cogexport's streaming
writer); a torch.save release is one pickle, so it is built whole, as the release itself was.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import (NO_CACHE, ROOT, START, WORKERS_1, check_variants_identical, floor_reads,  # noqa: E402
                          floor_rows, goal_lines, measure, print_scaling, print_table, retarget, run_json,
                          scaling_tools, start_tool, summarize, time_alternately, tree_bytes, with_workers,
                          without_diffusers_cache)

DEFAULT_WORK = ROOT / ".bench"
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


# --------------------------------------------------------------------------------------------------------------
# Making the release (in a helper process)

def meta_model(class_name: str, config: dict):
    """The Diffusers model on the meta device: names, shapes and config, nothing allocated."""
    import diffusers
    import torch

    with torch.device("meta"):
        return getattr(diffusers, class_name).from_config(config)


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def original_names(model, table: str) -> dict:
    """{original name: shape} of a (meta) Diffusers model, by the family's original table run backwards."""
    import torch

    from cogexport.keymap.plan import plan_translation
    from cogexport.keymap.table import load_table
    from cogexport.lazy import LazyTensor

    lazy = {n: LazyTensor(t.shape, torch.bfloat16, lambda: None) for n, t in model.state_dict().items()}
    names = plan_translation(load_table(table).inverted(), lazy, None, {}).tensors
    return {name: tensor.shape for name, tensor in names.items()}


def random_tensors(parts: list[tuple[str, dict]], dtype) -> dict:
    """Lazy N(0, 0.02) tensors in ``dtype``: each part is (prefix, {name: shape}); drawn from one seeded generator
    in the order they are loaded."""
    import torch

    from cogexport.lazy import LazyTensor

    generator = torch.Generator().manual_seed(0)

    def noise(shape):
        return lambda: (torch.randn(shape, generator=generator) * 0.02).to(dtype)

    return {prefix + name: LazyTensor(torch.Size(shape), dtype, noise(shape))
            for prefix, names in parts for name, shape in names.items()}


def make_once(path: Path, write: Callable[[Path], None]) -> None:
    """Make ``path`` unless it exists: ``write`` fills a .partial file beside it, renamed only once complete."""
    if path.exists():
        return
    click.echo(f"writing {path} (random weights)...", err=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    write(partial)
    partial.rename(path)


def write_random_safetensors(path: Path, parts: list[tuple[str, dict]], metadata: dict | None = None,
                             dtype: str = "bfloat16") -> None:
    """A safetensors release of random weights (see ``random_tensors``), streamed a tensor at a time, made once."""
    import torch

    from cogexport.write.safetensors_file import write_safetensors

    make_once(path, lambda partial: write_safetensors(partial, random_tensors(parts, getattr(torch, dtype)),
                                                      metadata))


def write_random_shards(folder: Path, stem: str, names: dict, shards: int, dtype: str = "bfloat16") -> list[Path]:
    """A sharded ``save_pretrained``-style release of random weights: ``shards`` safetensors files named as Diffusers
    names them (``<stem>-00001-of-00002.safetensors``), the names split in order, and their index; made once."""
    import torch

    from cogexport.write.safetensors_file import write_safetensors

    tensors = random_tensors([("", names)], getattr(torch, dtype))
    ordered, per_shard = list(tensors), -(-len(tensors) // shards)
    paths, weight_map = [], {}
    for index in range(shards):
        path = folder / f"{stem}-{index + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {name: tensors[name] for name in ordered[index * per_shard:(index + 1) * per_shard]}
        make_once(path, lambda partial, chunk=chunk: write_safetensors(partial, chunk, {"format": "pt"}))
        weight_map.update(dict.fromkeys(chunk, path.name))
        paths.append(path)
    total = sum(tensor.shape.numel() * tensor.dtype.itemsize for tensor in tensors.values())
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / f"{stem}.safetensors.index.json").write_text(json.dumps(index_file, indent=2, sort_keys=True) + "\n")
    return paths


def save_random_model_states(path: Path, names: dict, under: str = "module", dtype: str = "bfloat16") -> None:
    """A ``torch.save({under: state dict})`` release of random weights, made once."""
    import torch

    def write(partial: Path) -> None:
        state = {name: tensor.load() for name, tensor in random_tensors([("", names)], getattr(torch, dtype)).items()}
        torch.save({under: state}, partial)

    make_once(path, write)


def release_setup(release: Path, weights: Path, config_dir: Path, model) -> dict:
    """What the harness learns from --prepare; writes the Diffusers config folder the reference path loads with."""
    model.save_config(config_dir)
    return {"release": str(release), "weights": str(weights), "release_bytes": weights.stat().st_size,
            "config_dir": str(config_dir), "parameters": parameter_count(model)}


# --------------------------------------------------------------------------------------------------------------
# The reference path (runs in its own process)

def reference_export(release: Path, class_name: str, config_dir: Path, output: Path,
                     patch: Callable[[], None] | None = None, unwrap_module: bool = False) -> None:
    """What a user of Diffusers runs: from_single_file with a local config, in bf16, then save_pretrained.
    ``unwrap_module``: the file is a torch.save {"module": state dict}, which from_single_file does not unwrap, so
    it is loaded (mmap) and its module passed instead. ``patch``: run first (a converter told a size it assumes)."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    import diffusers
    import torch

    if patch is not None:
        patch()
    source = str(release)
    if unwrap_module:
        source = torch.load(release, map_location="cpu", mmap=True, weights_only=True)["module"]
    model = getattr(diffusers, class_name).from_single_file(source, config=str(config_dir),
                                                             torch_dtype=torch.bfloat16, local_files_only=True)
    del source
    model.save_pretrained(output, max_shard_size="5GB")


def from_pretrained_export(class_name: str, release: Path, output: Path) -> None:
    """What a user of Diffusers runs on a release folder that is already in Diffusers' names (a save_pretrained
    folder, its config.json beside): from_pretrained in bf16, then save_pretrained."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    import diffusers
    import torch

    model = getattr(diffusers, class_name).from_pretrained(release, torch_dtype=torch.bfloat16)
    model.save_pretrained(output, max_shard_size="5GB")


# --------------------------------------------------------------------------------------------------------------
# Another project's script as the reference (a converter Diffusers keeps in its repository, not in the package)

MIRRORS = Path("/work/.mirror")
DIFFUSERS_REPO = MIRRORS / "huggingface+diffusers" / "repo"  # a git directory of huggingface/diffusers


def extract_source(repo: Path, path: str, into: Path) -> dict:
    """``path`` of ``repo``'s HEAD (a checkout's working file, or a git directory's blob) into ``into``; its commit."""
    git = ["git", f"--git-dir={repo / '.git'}"] if (repo / ".git").exists() else ["git", f"--git-dir={repo}"]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    target = into / commit[:12] / Path(path).name
    if not target.exists():
        source = (repo / path).read_bytes() if (repo / ".git").exists() else subprocess.run(
            [*git, "show", f"HEAD:{path}"], check=True, capture_output=True).stdout
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source)
    return {"path": str(target), "commit": commit}


def keep_reference_source(repo: Path, path: str, work: Path, config_dir: Path) -> dict:
    """``extract_source`` into ``work``, its place noted in the config folder the reference path is handed."""
    source = extract_source(repo, path, work / "reference-sources")
    (config_dir / "reference-source.json").write_text(json.dumps(source))
    return source


def kept_reference_source(config_dir: Path) -> str:
    """The script ``keep_reference_source`` extracted for this config folder."""
    return json.loads((config_dir / "reference-source.json").read_text())["path"]


def take_subfolder(written: Path, output: Path) -> None:
    """Move the files a script wrote into ``written`` (its OUT/transformer) up into ``output`` (a rename each), and
    remove the emptied folders up to ``output``."""
    for path in written.iterdir():
        path.rename(output / path.name)
    while written != output:
        written.rmdir()
        written = written.parent


def load_source(path: str, name: str) -> types.ModuleType:
    """The other project's script as a module (its ``__main__`` block not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------------------------
# Comparing the two outputs (in a helper process)

def compare_outputs(ours: Path, reference: Path) -> dict:
    """Streamed tensor-by-tensor comparison of cogexport's folder with the reference path's; raises on any
    difference. The reference casts everything to bf16 (from_single_file, converters), or keeps some tensors fp32
    (from_pretrained's _keep_in_fp32_modules, a conversion script keeping the release's dtypes): a tensor cogexport
    keeps in fp32 must round to the reference's bf16 one, or equal the reference's fp32 one."""
    import torch
    from safetensors import safe_open

    from benchmark_export import folder_tensors

    ours_files, reference_files = folder_tensors(ours), folder_tensors(reference)
    problems = [f"only in cogexport's: {name}" for name in sorted(ours_files.keys() - reference_files.keys())]
    problems += [f"only in the reference's: {name}" for name in sorted(reference_files.keys() - ours_files.keys())]
    ours_config, reference_config = (json.loads((folder / "config.json").read_text()) for folder in (ours, reference))
    for key in sorted(ours_config.keys() | reference_config.keys()):
        if not key.startswith("_") and ours_config.get(key) != reference_config.get(key):
            problems.append(f"config.json {key}: cogexport's {ours_config.get(key)!r}, the reference's "
                            f"{reference_config.get(key)!r}")
    kept_fp32 = numel = 0
    handles: dict[Path, object] = {}

    def tensor(path: Path, name: str):
        if path not in handles:
            handles[path] = safe_open(path, framework="pt")
        return handles[path].get_tensor(name)

    try:
        for name in sorted(ours_files.keys() & reference_files.keys()):
            a, b = tensor(ours_files[name], name), tensor(reference_files[name], name)
            numel += a.numel()
            if a.shape != b.shape:
                problems.append(f"{name}: shape {tuple(a.shape)} (cogexport) vs {tuple(b.shape)} (reference)")
            elif a.dtype != b.dtype and (b.dtype, a.dtype) != (torch.bfloat16, torch.float32):
                problems.append(f"{name}: dtype {a.dtype} (cogexport) vs {b.dtype} (reference)")
            elif not torch.equal(a.to(b.dtype), b):
                problems.append(f"{name}: values differ")
            else:
                kept_fp32 += a.dtype == torch.float32
    finally:
        handles.clear()
    if problems:
        shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise click.ClickException(f"cogexport and the reference path wrote different models:\n  {shown}")
    return {"tensors": len(ours_files), "numel": numel, "kept_fp32": kept_fp32}


# --------------------------------------------------------------------------------------------------------------
# The run

@dataclass(frozen=True)
class FamilyBenchmark:
    """What one family's script supplies to the shared run."""

    script: Path
    size_args: list[str]  # its size options, passed on to its helper processes
    prepare: Callable[[Path], dict]  # make the release once, in the work dir; returns ``release_setup``'s dict
    reference: Callable[[Path, Path, Path], None]  # the reference path: release, config dir, output
    title: str  # what model, at what size
    release_kind: str = "release file"  # how the release is stored, for the report
    release_dtype: str = "bf16"
    reference_label: str = "reference path"
    cogexport_base: bool = True  # cogexport is given the config folder (--base); else it reads the release's own
    cogexport_args: tuple[str, ...] = ()  # more of cogexport's options (the weights to read, say --ema)
    # more other tools beside the reference path, made from the setup and the work dir: {name: (command, output)}
    more_tools: Callable[[dict, Path], dict[str, tuple[list[str], Path]]] | None = None

    def helper(self, *args: str) -> dict:
        """Run the script's hidden helper mode in a child process (the harness never imports torch); its JSON."""
        return run_json([sys.executable, str(self.script), *self.size_args, *args])

    def tools(self, setup: dict, work: Path) -> dict[str, tuple[list[str], Path]]:
        ours, reference = work / "out-cogexport", work / "out-reference"
        base = ["--base", setup["config_dir"], "--component", "transformer"] if self.cogexport_base else []
        base += self.cogexport_args
        return {
            "cogexport": ([str(Path(sys.executable).parent / "cogexport"), setup["release"], str(ours), *base], ours),
            self.reference_label: ([sys.executable, str(self.script), *self.size_args, "--reference-path",
                                    setup["release"], setup["config_dir"], str(reference)], reference),
            **(self.more_tools(setup, work) if self.more_tools else {}),
        }

    def run(self, work: Path, runs: int, as_json: bool, scaling: bool = True) -> None:
        """Prepare, export once with each tool and compare, then time --runs rounds; print the report. Beside the
        tools: cogexport with --workers 1 and the I/O floor of the same job; then (``scaling``) the scaling table."""
        work.mkdir(parents=True, exist_ok=True)
        setup = self.helper("--prepare", "--work-dir", str(work))
        commands = self.tools(setup, work)
        for command, output in commands.values():  # untimed: the outputs are compared before anything is timed
            shutil.rmtree(output, ignore_errors=True)
            measure(command)
        others = [name for name in commands if name != "cogexport"]
        for name in reversed(others):  # every other tool's output against cogexport's; the reference path's reported
            check = self.helper("--compare", str(commands["cogexport"][1]), str(commands[name][1]))
            if check["numel"] != setup["parameters"]:
                raise click.ClickException(f"outputs hold {check['numel']} elements, the model {setup['parameters']}")
        read = setup["parameters"] * DTYPE_BYTES[self.release_dtype]  # the transformer's bytes in the release
        weights = setup["weights"]  # one file, or the files the weights are spread over (a DCP folder's)
        files = [Path(path) for path in (weights if isinstance(weights, list) else [weights])]
        commands, variants, written = self.with_floor_and_scaling(commands, files, read, work, scaling)
        samples = time_alternately(commands, runs)
        scaled = summarize(time_alternately(variants, runs), 4 * setup["parameters"]) if variants else []
        harness_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # a floor under every measurement

        model_bytes = 4 * setup["parameters"]
        results = summarize(samples, model_bytes)
        goals = goal_lines(results, others)
        if as_json:
            click.echo(json.dumps({"model": self.title, **setup, "fp32_model_bytes": model_bytes,
                                   "harness_peak_rss_bytes": harness_rss, "check": check, "read_bytes": read,
                                   "written_bytes": written, "results": results, "scaling": scaled, "goals": goals},
                                  indent=2))
            return
        click.echo(f"{self.title}: {setup['parameters']:,} parameters, fp32 model {model_bytes / 1e9:.2f} GB; "
                   f"{self.release_kind} {setup['release_bytes'] / 1e9:.2f} GB ({self.release_dtype}) -> Diffusers "
                   f"bf16 transformer, 5GB shards; median of {runs} run(s)")
        click.echo(f"outputs equal: {check['tensors']} tensors ({check['kept_fp32']} kept fp32 by cogexport); "
                   f"every --workers and torchrun run wrote the same bytes; harness peak RSS {harness_rss / 1e6:.0f} MB")
        click.echo(f"I/O floor: dd reads {read / 1e9:.2f} GB of the release (the transformer's bytes) and writes "
                   f"{written / 1e9:.2f} GB (cogexport's output size)\n")
        width = max(len(name) for name in commands) + 2
        print_table(results, "tool", width, lambda row: row["tool"])
        for line in goals:
            click.echo(line)
        if scaled:
            print_scaling(scaled)

    @staticmethod
    def with_floor_and_scaling(commands: dict, release: list[Path], read: int, work: Path,
                               scaling: bool) -> tuple[dict, dict, int]:
        """The tools with cogexport --workers 1 and the I/O floor (dd reading ``read`` bytes of the release's files and
        writing as many as cogexport's output holds) beside them, and the scaling runs; every cogexport run first
        checked (untimed) to write the bytes of cogexport's output, which is then removed."""
        ours_command, ours_output = commands["cogexport"]
        written = tree_bytes(ours_output)
        workers_1 = with_workers(retarget(ours_command, ours_output, work / "out-w1"), 1)
        uncached = without_diffusers_cache(retarget(ours_command, ours_output, work / "out-uncached"))
        rows = {"cogexport": commands["cogexport"], WORKERS_1: (workers_1, work / "out-w1"),
                NO_CACHE: (uncached, work / "out-uncached"),
                **floor_rows(floor_reads(release, read), written, work / "out-floor"),
                START: (start_tool(ours_command), work / "out-start"),
                **{name: tool for name, tool in commands.items() if name != "cogexport"}}
        variants = scaling_tools(ours_command, ours_output, work / "out-scaling") if scaling else {}
        check_variants_identical({WORKERS_1: rows[WORKERS_1], NO_CACHE: rows[NO_CACHE], **variants}, ours_output)
        shutil.rmtree(ours_output, ignore_errors=True)
        return rows, variants, written

    def main(self, work_dir: Path, runs: int, as_json: bool, reference_path: tuple[Path, Path, Path] | None,
             prepare_only: bool, compare_dirs: tuple[Path, Path] | None, scaling: bool = True) -> None:
        """The script's entry: one of the hidden helper modes, or the benchmark."""
        if reference_path:
            self.reference(*reference_path)
        elif prepare_only:
            click.echo(json.dumps(self.prepare(work_dir)))
        elif compare_dirs:
            click.echo(json.dumps(compare_outputs(*compare_dirs)))
        else:
            self.run(work_dir, runs, as_json, scaling)


def benchmark_options(command: Callable) -> Callable:
    """The options every family benchmark takes besides its size, and its hidden helper modes."""
    options = [
        click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_WORK,
                     show_default=True, help="Where the release is made and kept, and outputs are written."),
        click.option("--runs", type=click.IntRange(1), default=3, show_default=True),
        click.option("--json", "as_json", is_flag=True),
        click.option("--scaling/--no-scaling", default=True, show_default=True,
                     help="Also time the scaling table (workers 1, 2, all cores; torchrun 1, 2 processes)."),
        click.option("--reference-path", nargs=3, type=click.Path(path_type=Path), default=None,
                     metavar="RELEASE CONFIG_DIR OUT", help="Only run the reference path (what the benchmark times)."),
        click.option("--prepare", "prepare_only", is_flag=True, hidden=True),
        click.option("--compare", "compare_dirs", nargs=2, type=click.Path(path_type=Path), default=None,
                     hidden=True),
    ]
    for option in reversed(options):
        command = option(command)
    return command
