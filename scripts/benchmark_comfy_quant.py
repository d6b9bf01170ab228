"""Benchmark cogexport's quantizers of ComfyUI's formats (``--to comfyui --quant nvfp4 | mxfp8 | int8 | fp8``) beside
comfy-kitchen's eager ones (what ComfyUI quantizes with on a machine without its GPU kernels, and the reference of the
bytes): nanoseconds per value on the same weights, one thread, medians of ``--runs``.

    python scripts/benchmark_comfy_quant.py [--rows 5120 --columns 13824 --dtype bf16 --runs 5]

The weights are N(0, 0.02) of Wan2.1-14B's feed-forward shape by default (5120 x 13824). Before anything is timed,
every tensor a layer stores is compared with comfy-kitchen's byte for byte (fp8: the share of equal bytes is
reported, the two scaled-fp8 rules differing: docs/quantized.md). cogexport's writer makes a layer's tensors one at a
time from the source weight (the file keeps them apart), so its figure is the sum of its parts, each timed alone;
comfy-kitchen's is one ``QuantizedTensor.from_float``. Needs comfy-kitchen, a test dependency.

The figures, with the day and commit they were measured at: docs/benchmarks.md#comfyui-quantized-formats.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cogexport.quantize.comfy_quant import comfy_quantization  # noqa: E402

KITCHEN_LAYOUTS = {"nvfp4": "TensorCoreNVFP4Layout", "mxfp8": "TensorCoreMXFP8Layout", "int8": "TensorWiseINT8Layout",
                   "fp8": "TensorCoreFP8Layout"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def ours(quant: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    return {part.name: part.make(weight, "weight") for part in comfy_quantization(quant).parts}


def kitchens(quant: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    from comfy_kitchen.tensor import QuantizedTensor

    state = QuantizedTensor.from_float(weight, KITCHEN_LAYOUTS[quant]).state_dict("w.weight")
    return {name.removeprefix("w."): tensor for name, tensor in state.items()}


def equal_share(quant: str, weight: torch.Tensor) -> float:
    """The share of the bytes cogexport stores that are comfy-kitchen's (1.0: every one)."""
    mine, theirs = ours(quant, weight), kitchens(quant, weight)
    same = total = 0
    for name, tensor in mine.items():
        a, b = (t.reshape(-1).contiguous().view(torch.uint8) for t in (tensor, theirs[name]))
        same, total = same + int((a == b).sum()), total + a.numel()
    return same / total


def median_seconds(run, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(quant: str, weight: torch.Tensor, runs: int) -> dict:
    parts = {part.name: median_seconds(lambda part=part: part.make(weight, "weight"), runs)
             for part in comfy_quantization(quant).parts}
    kitchen = median_seconds(lambda: kitchens(quant, weight), runs)
    values = weight.numel()
    return {"quant": quant, "equal_bytes": equal_share(quant, weight),
            "parts_ns": {name: seconds / values * 1e9 for name, seconds in parts.items()},
            "cogexport_ns": sum(parts.values()) / values * 1e9, "kitchen_ns": kitchen / values * 1e9}


@click.command()
@click.option("--rows", type=int, default=5120, show_default=True)
@click.option("--columns", type=int, default=13824, show_default=True)
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="bf16", show_default=True)
@click.option("--quant", "quants", multiple=True, default=("nvfp4", "mxfp8", "int8", "fp8"), show_default=True)
@click.option("--runs", type=int, default=5, show_default=True)
def main(rows, columns, dtype, quants, runs):
    torch.set_num_threads(1)
    weight = (torch.randn(rows, columns, generator=torch.Generator().manual_seed(0)) * 0.02).to(DTYPES[dtype])
    click.echo(f"{rows} x {columns} {dtype} weights, one thread, medians of {runs} runs (ns per value)")
    click.echo(f"{'quant':8s} {'cogexport':>10s} {'comfy-kitchen':>14s} {'ratio':>7s} {'equal bytes':>12s}  parts")
    for quant in quants:
        row = measure(quant, weight, runs)
        parts = ", ".join(f"{name} {ns:.2f}" for name, ns in row["parts_ns"].items())
        click.echo(f"{quant:8s} {row['cogexport_ns']:10.2f} {row['kitchen_ns']:14.2f} "
                   f"{row['kitchen_ns'] / row['cogexport_ns']:6.2f}x {row['equal_bytes']:11.2%}  {parts}")


if __name__ == "__main__":
    main()
