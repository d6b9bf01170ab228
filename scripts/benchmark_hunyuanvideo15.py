"""Benchmark ``cogexport`` on a HunyuanVideo 1.5 release folder against the repository script's path, in one run.

    .venv/bin/python scripts/benchmark_hunyuanvideo15.py [--layers 4] [--runs 3] [--json]
    .venv/bin/python scripts/benchmark_hunyuanvideo15.py --reference-path FOLDER CONFIG_DIR OUT   # the reference alone

The 8.3B model (54 double blocks) needs about 33 GB in fp32, more than this machine has, so the benchmark uses a
FULL-WIDTH model (hidden 2048, 16 heads, the real Qwen2.5-VL / ByT5 / SigLIP input widths, text refiner and block
shapes) with FEWER BLOCKS, said in its output. It makes (once, cached in --work-dir) the release layout,
``transformer/480p_t2v/`` with ``diffusion_pytorch_model.safetensors`` of random bf16 weights (the names from
hunyuanvideo15_tiny.original_shapes, independent of cogexport's tables) and the HunyuanVideo_1_5 ``config.json`` the
release keeps beside them, and a Diffusers config folder for that size. Then, each tool in a fresh process, to a bf16
Diffusers folder with 5GB shards (single_file_benchmark.py):

- cogexport: ``cogexport FOLDER OUT`` (its config from the release's config.json; streams one tensor at a time);
- the REFERENCE PATH, reimplemented here because Diffusers ships no single-file loader for HunyuanVideo 1.5 (the class
  is missing from its single-file table): the logic of Diffusers' repository script
  scripts/convert_hunyuan_video1_5_to_diffusers.py (``convert_transformer`` then ``save_pretrained``): ``load_file``
  the release's safetensors whole, rename it as the script does (hunyuanvideo15_tiny.reference_to_diffusers, the
  script's tables with its 54-layer loop following the file's depth), build HunyuanVideo15Transformer3DModel under
  accelerate's ``init_empty_weights``, ``load_state_dict(strict=True, assign=True)``, ``save_pretrained``.

Before anything is timed both folders are compared tensor by tensor (same names, shapes and config; equal values,
cogexport's fp32-kept norm tensors compared after rounding to bf16); any difference fails the benchmark. Then --runs
rounds, alternating. Reported: median wall time and peak PSS and RSS of each tool's process tree
(benchmarking.measure_tree), peak PSS as a multiple of the fp32 model (4 bytes x the Diffusers model's parameter
count) and ratios to cogexport.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, meta_model, release_setup,  # noqa: E402
                                   write_random_safetensors)

WEIGHTS = "diffusion_pytorch_model.safetensors"
RELEASE_LAYERS = 54  # double blocks of the published model


def prepare(work: Path, layers: int) -> dict:
    from hunyuanvideo15_tiny import original_shapes

    from cogexport.models.hunyuanvideo15 import original_config

    config = {"num_layers": layers, "task_type": "t2v"}
    model = meta_model("HunyuanVideo15Transformer3DModel", config)
    release = work / f"hunyuanvideo15-{layers}l" / "transformer" / "480p_t2v"
    write_random_safetensors(release / WEIGHTS, [("", original_shapes(config))])
    (release / "config.json").write_text(json.dumps(original_config(dict(model.config), "t2v"), indent=2))
    return release_setup(release, release / WEIGHTS, work / f"hunyuanvideo15-{layers}l-config", model)


def reference_export(release: Path, config_dir: Path, output: Path) -> None:
    """The repository script's convert_transformer and save_pretrained, on a release folder."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    from accelerate import init_empty_weights
    from diffusers import HunyuanVideo15Transformer3DModel
    from hunyuanvideo15_tiny import reference_to_diffusers
    from safetensors.torch import load_file

    original = load_file(Path(release) / WEIGHTS)
    config = HunyuanVideo15Transformer3DModel.load_config(str(config_dir))
    with init_empty_weights():
        transformer = HunyuanVideo15Transformer3DModel.from_config(config)
    transformer.load_state_dict(reference_to_diffusers(original), strict=True, assign=True)
    del original
    transformer.save_pretrained(output, max_shard_size="5GB")


@click.command()
@click.option("--layers", type=click.IntRange(1, RELEASE_LAYERS), default=4, show_default=True)
@benchmark_options
def main(layers: int, **options) -> None:
    FamilyBenchmark(
        script=Path(__file__).resolve(),
        size_args=["--layers", str(layers)],
        prepare=lambda work: prepare(work, layers),
        reference=reference_export,
        title=f"HunyuanVideo 1.5 at full width (hidden 2048) but NOT full depth: {layers} double blocks (the release "
              f"has {RELEASE_LAYERS}), so it fits this machine",
        release_kind=f"release folder (transformer/480p_t2v/{WEIGHTS} + config.json)",
        reference_label="repository script logic (reimplemented)",
        cogexport_base=False,
    ).main(**options)


if __name__ == "__main__":
    main()
