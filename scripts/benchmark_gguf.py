"""Benchmark GGUF output on a full-width Wan transformer: wall time and peak memory of ``cogexport RELEASE OUT --to gguf
--quant Q`` on an original-layout release (random N(0, 0.02) weights of the variant's exact names and shapes, fp32
like the 2.1 releases), for each ``--quant``.

    python scripts/benchmark_gguf.py [--runs 3]                         # Wan2.1-T2V-1.3B, Q8_0 and Q4_K_M
    python scripts/benchmark_gguf.py --variant Wan2.1-T2V-14B --layers 2   # a full-width 14B subset (--base made)

Each output is checked before anything is timed: the file is read back by the gguf package (GgufCheckpoint) and a
sample of tensors of every type is compared byte for byte with its source quantized by the reference
(cogexport.quantize.check). Then, in turn, each in a fresh process measured by scripts/benchmarking.py (peak PSS and
RSS of the process tree, wall time; the harness never imports torch): cogexport, cogexport ``--workers 1`` (first
checked to write the same bytes), the I/O floors (the release's bytes read, the GGUF file's bytes written: dd, and a
kernel copy) and the command's start (``--help``); medians of ``--runs``. ``--scaling`` adds the table of worker
threads and torchrun processes (each first checked to write the same bytes). No other tool runs here: ComfyUI-GGUF's
converter is not installable on these machines. The peak is reported against the fp32 size of the model (the issue's
bound: at most 0.25x).

The figures, with the day and commit they were measured at: docs/benchmarks.md#gguf.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import (ROOT, START, WORKERS_1, check_variants_identical, floor_reads, floor_rows,  # noqa: E402
                          goal_lines, measure_tree, print_scaling, print_table, retarget, run_json, scaling_tools,
                          start_tool, summarize, time_alternately, with_workers)

DEFAULT_WORK = ROOT / ".bench" / "gguf"


def prepare(variant: str, layers: int | None, release: Path) -> dict:
    """Write the random release once (and, for a subset of blocks, the config folder --base needs: not a published
    size); returns its facts (tensor count, fp32 bytes)."""
    from single_file_benchmark import meta_model, original_names, write_random_safetensors

    from cogexport.models.family import family_named

    family = family_named("wan")
    config = family.transformer_config(family.variant_named(variant))
    if layers:
        config["num_layers"] = layers
    model = meta_model(family.transformer.class_name, config)
    names = original_names(model, "wan/original_transformer")
    write_random_safetensors(release, [("", names)], dtype="float32")
    base = release.parent.parent / f"{release.parent.name}-config"
    if layers:
        model.save_config(base)
    count = sum(math.prod(shape) for shape in names.values())
    return {"tensors": len(names), "parameters": count, "fp32_bytes": 4 * count,
            "base": str(base) if layers else None}


def check(release: Path, output: Path, per_type: int) -> dict:
    """A sample of ``per_type`` tensors of each type, compared with the reference; raises on any difference."""
    from cogexport.checkpoint.gguf_file import GgufCheckpoint
    from cogexport.checkpoint.safetensors_files import SafetensorsCheckpoint
    from cogexport.quantize.check import check_gguf

    with SafetensorsCheckpoint(release) as source, GgufCheckpoint(output) as stored:
        sample, taken = {}, {}
        for name, kind in stored.types.items():
            if taken.get(kind, 0) < per_type:
                sample[name], taken[kind] = stored[name], taken.get(kind, 0) + 1
        view = _Subset(stored, sample)
        checks = check_gguf(view, source)
    bad = [c.name for c in checks if not c.exact]
    if bad:
        raise click.ClickException(f"{output}: {len(bad)} tensors differ from the reference: {', '.join(bad[:5])}")
    return {c.type: round(c.rms_relative, 5) for c in checks}


class _Subset(dict):
    """A GgufCheckpoint restricted to some names (check_gguf reads types, stored shapes and bytes from it)."""

    def __init__(self, checkpoint, names: dict) -> None:
        super().__init__(names)
        self.types, self.stored_shapes = checkpoint.types, checkpoint.stored_shapes
        self.stored_bytes = checkpoint.stored_bytes


def quant_tools(facts: dict, release: Path, quant: str, work: Path) -> tuple[dict, Path]:
    """cogexport's command for one quant and where it writes; the GGUF file it writes once made."""
    out = work / f"out-{quant}"
    base = ["--base", facts["base"]] if facts["base"] else []
    command = [str(Path(sys.executable).parent / "cogexport"), str(release.parent), str(out), "--to", "gguf",
               "--quant", quant, *base]
    return {"cogexport": (command, out)}, out


def timed_rows(facts: dict, release: Path, quant: str, work: Path, me: list[str], runs: int,
               scaling: bool) -> dict:
    """One quant: cogexport once (untimed) and its file checked against the reference quantizers, then cogexport,
    --workers 1 (checked to write the same bytes), the I/O floors and the start timed in turn, ``runs`` rounds."""
    commands, out = quant_tools(facts, release, quant, work)
    command = commands["cogexport"][0]
    shutil.rmtree(out, ignore_errors=True)
    measure_tree(command)
    gguf_file = next(out.glob("*.gguf"))
    errors = run_json(me + ["--mode", "check", "--output", str(gguf_file)])
    written = gguf_file.stat().st_size
    rows = {**commands, WORKERS_1: (with_workers(retarget(command, out, work / "out-w1"), 1), work / "out-w1"),
            **floor_rows(floor_reads([release], release.stat().st_size), written, work / "out-floor"),
            START: (start_tool(command), work / "out-start")}
    variants = scaling_tools(command, out, work / "out-scaling") if scaling else {}
    check_variants_identical({WORKERS_1: rows[WORKERS_1], **variants}, out)
    shutil.rmtree(out, ignore_errors=True)
    results = summarize(time_alternately(rows, runs), facts["fp32_bytes"])
    scaled = summarize(time_alternately(variants, runs), facts["fp32_bytes"]) if variants else []
    return {"quant": quant, "file_bytes": written, "rms_relative_sample": errors, "results": results,
            "scaling": scaled, "goals": goal_lines(results, [])}


def report(facts: dict, variant: str, layers: int | None, runs: int, measured: list[dict]) -> None:
    click.echo(f"{variant}{f' ({layers} blocks)' if layers else ''}: {facts['parameters']:,} parameters, fp32 release "
               f"{facts['fp32_bytes'] / 1e9:.2f} GB -> GGUF; median of {runs} run(s); every file checked against the "
               "reference quantizers first")
    for one in measured:
        click.echo(f"\n{one['quant']}: file {one['file_bytes'] / 1e9:.2f} GB, sampled RMS error (relative) "
                   f"{one['rms_relative_sample']}; I/O floor: the release's bytes read, the file's bytes written")
        print_table(one["results"], "tool", 34, lambda row: row["tool"])
        for line in one["goals"]:
            click.echo(line)
        if one["scaling"]:
            print_scaling(one["scaling"])


@click.command()
@click.option("--variant", default="Wan2.1-T2V-1.3B", show_default=True)
@click.option("--layers", type=int, default=None, help="keep this many blocks (a full-width subset)")
@click.option("--quant", "quants", multiple=True, default=("Q8_0", "Q4_K_M"), show_default=True)
@click.option("--runs", type=int, default=3, show_default=True)
@click.option("--scaling/--no-scaling", default=False, show_default=True,
              help="the table of worker threads and torchrun processes (each run of a K quant takes minutes)")
@click.option("--work", type=click.Path(path_type=Path), default=DEFAULT_WORK, show_default=True)
@click.option("--check-per-type", type=int, default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--mode", type=click.Choice(["run", "prepare", "check"]), default="run", hidden=True)
@click.option("--output", type=click.Path(path_type=Path), default=None, hidden=True)
def main(variant, layers, quants, runs, scaling, work, check_per_type, as_json, mode, output):
    release = work / f"{variant}{f'-{layers}-layers' if layers else ''}" / "diffusion_pytorch_model.safetensors"
    if mode == "prepare":
        return click.echo(json.dumps(prepare(variant, layers, release)))
    if mode == "check":
        return click.echo(json.dumps(check(release, output, check_per_type)))
    me = [sys.executable, __file__, "--variant", variant, "--work", str(work), "--check-per-type", str(check_per_type)]
    me += ["--layers", str(layers)] if layers else []
    facts = run_json(me + ["--mode", "prepare"])
    measured = [timed_rows(facts, release, quant, work, me, runs, scaling) for quant in quants]
    if as_json:
        return click.echo(json.dumps({"variant": variant, "layers": layers, **facts, "quants": measured}, indent=1))
    report(facts, variant, layers, runs, measured)


if __name__ == "__main__":
    main()
