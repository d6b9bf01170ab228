"""Benchmark GGUF output on a full-width Wan transformer: wall time and peak memory of quantizing an original-layout
release (random N(0, 0.02) weights of the variant's exact names and shapes, fp32 like the 2.1 releases) to each
``--quant``, with the library pieces ``--to gguf`` is made of (SafetensorsCheckpoint -> plan_gguf -> write_gguf).

    python scripts/benchmark_gguf.py                                   # Wan2.1-T2V-1.3B, Q8_0 and Q4_K_M
    python scripts/benchmark_gguf.py --variant Wan2.1-T2V-14B --layers 2   # a full-width 14B subset

Each output is checked before anything is reported: the file is read back by the gguf package (GgufCheckpoint) and
a sample of tensors of every type is compared byte for byte with its source quantized by the reference
(cogexport.quantize.check). Each quantization then runs in a fresh process, measured by scripts/benchmarking.py
(peak PSS and RSS of the process tree, wall time); the harness never imports torch. The peak is reported against the
fp32 size of the model (the issue's bound: at most 0.25x).

The figures, with the day and commit they were measured at: docs/benchmarks.md#gguf.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import ROOT, measure_tree, run_json  # noqa: E402

DEFAULT_WORK = ROOT / ".bench" / "gguf"


def prepare(variant: str, layers: int | None, release: Path) -> dict:
    """Write the random release once; returns its facts (tensor count, fp32 bytes)."""
    from single_file_benchmark import meta_model, original_names, write_random_safetensors

    from cogexport.models.family import family_named

    family = family_named("wan")
    config = family.transformer_config(family.variant_named(variant))
    if layers:
        config["num_layers"] = layers
    names = original_names(meta_model(family.transformer.class_name, config), "wan/original_transformer")
    write_random_safetensors(release, [("", names)], dtype="float32")
    count = sum(math.prod(shape) for shape in names.values())
    return {"tensors": len(names), "parameters": count, "fp32_bytes": 4 * count}


def quantize(release: Path, output: Path, quant: str) -> dict:
    from cogexport.checkpoint.safetensors_files import SafetensorsCheckpoint
    from cogexport.quantize.policy import plan_gguf, quantization_policy
    from cogexport.write.gguf_file import write_gguf

    with SafetensorsCheckpoint(release) as source:
        plan = plan_gguf(dict(source), quantization_policy("wan"), quant)
        written = write_gguf(output, plan)
    return {"bytes": written, "types": plan.type_counts(), "notes": len(plan.notes)}


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


@click.command()
@click.option("--variant", default="Wan2.1-T2V-1.3B", show_default=True)
@click.option("--layers", type=int, default=None, help="keep this many blocks (a full-width subset)")
@click.option("--quant", "quants", multiple=True, default=("Q8_0", "Q4_K_M"), show_default=True)
@click.option("--work", type=click.Path(path_type=Path), default=DEFAULT_WORK, show_default=True)
@click.option("--check-per-type", type=int, default=3, show_default=True)
@click.option("--mode", type=click.Choice(["run", "prepare", "quantize", "check"]), default="run", hidden=True)
@click.option("--output", type=click.Path(path_type=Path), default=None, hidden=True)
def main(variant, layers, quants, work, check_per_type, mode, output):
    release = work / f"{variant}{f'-{layers}-layers' if layers else ''}" / "diffusion_pytorch_model.safetensors"
    if mode == "prepare":
        return click.echo(json.dumps(prepare(variant, layers, release)))
    if mode == "quantize":
        return click.echo(json.dumps(quantize(release, output, quants[0])))
    if mode == "check":
        return click.echo(json.dumps(check(release, output, check_per_type)))
    me = [sys.executable, __file__, "--variant", variant, "--work", str(work), "--check-per-type", str(check_per_type)]
    me += ["--layers", str(layers)] if layers else []
    facts = run_json(me + ["--mode", "prepare"])
    rows = []
    for quant in quants:
        out = release.parent / f"model-{quant}.gguf"
        measured = measure_tree(me + ["--mode", "quantize", "--quant", quant, "--output", str(out)])
        errors = run_json(me + ["--mode", "check", "--output", str(out)])
        peak = measured.peak_pss_bytes or measured.peak_bytes
        rows.append({"quant": quant, "seconds": round(measured.seconds, 1), "peak_pss_mb": round(peak / 2**20),
                     "peak_rss_mb": round(measured.peak_bytes / 2**20), "peak_vs_fp32": round(peak / facts["fp32_bytes"], 3),
                     "file_mb": round(out.stat().st_size / 2**20), "rms_relative_sample": errors})
    click.echo(json.dumps({"variant": variant, "layers": layers, **facts, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
