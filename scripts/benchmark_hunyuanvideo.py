"""Benchmark ``cogexport`` on a HunyuanVideo release-layout file against the reference path, in one run.

    .venv/bin/python scripts/benchmark_hunyuanvideo.py [--double-layers 2 --single-layers 4] [--runs 3] [--json]
    .venv/bin/python scripts/benchmark_hunyuanvideo.py --reference-path FILE CONFIG_DIR OUT   # the reference alone

The 13B model (20 double + 40 single blocks) needs about 51 GB in fp32, more than this machine has, so the benchmark
uses a FULL-WIDTH model (hidden 3072, 24 heads, the real embedders, text refiner and block shapes) with FEWER BLOCKS,
said in its output. It makes (once, cached in --work-dir) the release layout,
``transformers/mp_rank_00_model_states.pt`` holding ``{"module": state dict}`` of random bf16 weights (as the release
stores them; the names from hunyuanvideo_tiny.original_shapes, independent of cogexport's tables), and a config folder
for that size. Then, each tool in a fresh process, to a bf16 Diffusers folder with 5GB shards
(single_file_benchmark.py):

- cogexport: ``cogexport FILE OUT --base CONFIG_DIR --component transformer`` (streams one tensor at a time);
- the reference path, as a user of Diffusers does it: ``torch.load`` the file (mmap) and take its ``module`` (Diffusers'
  ``from_single_file`` does not unwrap it), ``HunyuanVideoTransformer3DModel.from_single_file(that dict,
  config=CONFIG_DIR, torch_dtype=torch.bfloat16)`` (Diffusers' own converter), ``save_pretrained``.

Before anything is timed both folders are compared tensor by tensor (same names, shapes and config; equal values,
cogexport's fp32-kept norm tensors compared after rounding to bf16); any difference fails the benchmark. Then --runs
rounds, alternating. Reported: median wall time and peak PSS and RSS of each tool's process tree
(benchmarking.measure_tree), peak PSS as a multiple of the fp32 model (4 bytes x the Diffusers model's parameter count) and ratios to cogexport.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, meta_model, reference_export,  # noqa: E402
                                   release_setup, save_random_model_states)

MODEL_STATES = "mp_rank_00_model_states.pt"
RELEASE_LAYERS = (20, 40)  # double, single blocks of the published model


def prepare(work: Path, double_layers: int, single_layers: int) -> dict:
    from hunyuanvideo_tiny import original_shapes

    config = {"num_layers": double_layers, "num_single_layers": single_layers}
    name = f"hunyuanvideo-{double_layers}d{single_layers}s"
    release = work / name / "transformers" / MODEL_STATES
    save_random_model_states(release, original_shapes(config))
    return release_setup(release, release, work / f"{name}-config",
                         meta_model("HunyuanVideoTransformer3DModel", config))


@click.command()
@click.option("--double-layers", type=click.IntRange(1, RELEASE_LAYERS[0]), default=2, show_default=True)
@click.option("--single-layers", type=click.IntRange(1, RELEASE_LAYERS[1]), default=4, show_default=True)
@benchmark_options
def main(double_layers: int, single_layers: int, **options) -> None:
    FamilyBenchmark(
        script=Path(__file__).resolve(),
        size_args=["--double-layers", str(double_layers), "--single-layers", str(single_layers)],
        prepare=lambda work: prepare(work, double_layers, single_layers),
        reference=lambda release, config_dir, output: reference_export(release, "HunyuanVideoTransformer3DModel",
                                                                       config_dir, output, unwrap_module=True),
        title=f"HunyuanVideo at full width (hidden 3072) but NOT full depth: {double_layers} double + {single_layers} "
              f"single blocks (the release has {RELEASE_LAYERS[0]} + {RELEASE_LAYERS[1]}), so it fits this machine",
        release_kind=f"release layout ({MODEL_STATES} with 'module')",
    ).main(**options)


if __name__ == "__main__":
    main()
