"""What benchmark_ltx_video.py and benchmark_mochi.py share: a full-width release file of random bf16 weights in the
original layout, the reference path (Diffusers' ``from_single_file`` with a local config, then ``save_pretrained``),
and the run: each tool in a fresh process, alternating, outputs compared equal after the first round, then peak RSS
and wall time (scripts/benchmarking.py), medians of --runs.

The release file is written by cogexport's streaming safetensors writer (one random tensor at a time), with the names
of the family's original table run backwards over the Diffusers model built on the meta device.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import ROOT, measure, print_table, summarize  # noqa: E402


def original_names(class_name: str, config: dict, table: str) -> tuple[dict, int]:
    """{original name: shape} of a Diffusers model built on the meta device, and its parameter count."""
    import diffusers
    import torch

    from cogexport.keymap.plan import plan_translation
    from cogexport.keymap.table import load_table
    from cogexport.lazy import LazyTensor

    with torch.device("meta"):
        model = getattr(diffusers, class_name).from_config(config)
    lazy = {n: LazyTensor(t.shape, torch.bfloat16, lambda: None) for n, t in model.state_dict().items()}
    names = plan_translation(load_table(table).inverted(), lazy, None, {}).tensors
    return {name: tensor.shape for name, tensor in names.items()}, sum(p.numel() for p in model.parameters())


def write_random_release(path: Path, parts: list[tuple[str, dict]], metadata: dict | None = None) -> int:
    """One safetensors file of random bf16 tensors: each part is (prefix, {name: shape}). Returns its size."""
    import torch

    from cogexport.lazy import LazyTensor
    from cogexport.write.safetensors_file import write_safetensors

    generator = torch.Generator().manual_seed(0)

    def noise(shape):
        return lambda: (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)

    tensors = {prefix + name: LazyTensor(torch.Size(shape), torch.bfloat16, noise(shape))
               for prefix, names in parts for name, shape in names.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    write_safetensors(partial, tensors, metadata)
    partial.rename(path)
    return path.stat().st_size


def reference_export(release: Path, class_name: str, config_dir: Path, output: Path,
                     patch: Callable[[], None] | None = None) -> None:
    """What a user of Diffusers runs: from_single_file with a local config, in bf16, then save_pretrained."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    import diffusers
    import torch

    if patch is not None:
        patch()
    model = getattr(diffusers, class_name).from_single_file(str(release), config=str(config_dir),
                                                             torch_dtype=torch.bfloat16)
    model.save_pretrained(output, max_shard_size="5GB")


def helper(script: Path, *args: str) -> dict:
    """Run SCRIPT's hidden helper mode in a child process (the harness never imports torch); its printed JSON."""
    done = subprocess.run([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"{' '.join(args)} failed (its error is above)")
    return json.loads(done.stdout)


def run_benchmark(script: Path, work: Path, runs: int, as_json: bool, title: str, extra: list[str]) -> None:
    """Prepare (in a helper process), then time cogexport and the reference path alternately."""
    work.mkdir(parents=True, exist_ok=True)
    setup = helper(script, "--prepare", "--work-dir", str(work), *extra)
    model_bytes = 4 * setup["parameters"]
    ours, reference = work / "out-cogexport", work / "out-reference"
    cogexport = str(Path(sys.executable).parent / "cogexport")
    commands = {
        "cogexport": ([cogexport, setup["release"], str(ours), "--base", setup["config_dir"], "--component",
                       "transformer"], ours),
        "reference path": ([sys.executable, str(script), "--reference-path", setup["release"], setup["config_dir"],
                            str(reference), *extra], reference),
    }
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in commands}
    check = None
    for round_ in range(runs):
        for name, (command, output) in commands.items():
            shutil.rmtree(output, ignore_errors=True)
            samples[name].append(measure(command))
        if round_ == 0:  # outputs equal before anything is timed twice
            check = helper(script, "--compare", str(ours), str(reference))
            if check["numel"] != setup["parameters"]:
                raise click.ClickException(f"outputs hold {check['numel']} elements, the model {setup['parameters']}")
    for _, output in commands.values():
        shutil.rmtree(output, ignore_errors=True)
    results = summarize(samples, model_bytes)
    if as_json:
        click.echo(json.dumps({**setup, "fp32_model_bytes": model_bytes, "check": check, "results": results}, indent=2))
        return
    click.echo(f"{title}: {setup['parameters']:,} parameters, fp32 model {model_bytes / 1e9:.2f} GB; release file "
               f"{setup['release_bytes'] / 1e9:.2f} GB (bf16) -> Diffusers bf16 transformer, 5GB shards; median of "
               f"{runs} run(s)")
    click.echo(f"outputs equal: {check['tensors']} tensors ({check['kept_fp32']} kept fp32 by cogexport)\n")
    print_table(results, "tool", 16, lambda row: row["tool"])


def compare(ours: Path, reference: Path) -> dict:
    from benchmark_export import compare_outputs

    return compare_outputs(ours, reference)


DEFAULT_WORK = ROOT / ".bench"
