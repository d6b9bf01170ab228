"""Benchmark ``cogexport`` on a Kandinsky 5 release file against the repository's loading logic, in one run.

    .venv/bin/python scripts/benchmark_kandinsky5.py [--visual-blocks 16] [--runs 3] [--json]
    .venv/bin/python scripts/benchmark_kandinsky5.py --reference-path FILE CONFIG_DIR OUT   # the reference alone

The Lite model (2B: 32 visual blocks) is about 8 GB in fp32; the benchmark uses the Lite model at FULL WIDTH
(model_dim 1792, the real Qwen2.5-VL and CLIP input widths, 2 text blocks) with FEWER VISUAL BLOCKS by default, said in
its output (``--visual-blocks 32`` is the full depth, where the machine allows). It makes (once, cached in --work-dir)
the release layout, ``model/kandinsky5lite_t2v_sft_5s.safetensors`` of random bf16 weights (the names from
kandinsky5_tiny.original_shapes, the kandinsky-5 repo's module tree), and a Diffusers config folder for that size.
Then, each tool in a fresh process, to a bf16 Diffusers folder with 5GB shards (single_file_benchmark.py):

- cogexport: ``cogexport FILE OUT --base CONFIG_DIR --component transformer`` (streams one tensor at a time);
- the REFERENCE PATH, reimplemented here because Diffusers ships no single-file loader for Kandinsky 5 (the class has
  FromOriginalModelMixin but no single-file mapping): what the kandinsky-5 repo's get_T2V_pipeline does with the
  release (``load_file`` it whole, ``load_state_dict(state_dict, assign=True)`` into the model built empty), with
  Diffusers' Kandinsky5Transformer3DModel (accelerate's ``init_empty_weights``) and ``save_pretrained``.

Before anything is timed both folders are compared tensor by tensor (same names, shapes and config; equal values,
cogexport's fp32-kept tensors compared after rounding to bf16); any difference fails the benchmark. Then --runs
rounds, alternating. Reported: median wall time and peak PSS and RSS of each tool's process tree
(benchmarking.measure_tree), peak PSS as a multiple of the fp32 model and ratios to cogexport.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, meta_model, release_setup,  # noqa: E402
                                   write_random_safetensors)

RELEASE_FILE = "kandinsky5lite_t2v_sft_5s.safetensors"
RELEASE_BLOCKS = 32  # visual blocks of the published Lite model


def lite_config(visual_blocks: int) -> dict:
    from cogexport.models.family import family_named

    family = family_named("kandinsky5")
    config = family.transformer_config(family.variant_named("Kandinsky-5.0-T2V-Lite-sft-5s"))
    return {**config, "num_visual_blocks": visual_blocks}


def prepare(work: Path, visual_blocks: int) -> dict:
    from kandinsky5_tiny import original_shapes

    config = lite_config(visual_blocks)
    release = work / f"kandinsky5-lite-{visual_blocks}v" / "model" / RELEASE_FILE
    write_random_safetensors(release, [("", original_shapes(config))])
    return release_setup(release, release, work / f"kandinsky5-lite-{visual_blocks}v-config",
                         meta_model("Kandinsky5Transformer3DModel", config))


def reference_export(release: Path, config_dir: Path, output: Path) -> None:
    """The kandinsky-5 repo's loading of a release file, into Diffusers' class, then save_pretrained."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    from accelerate import init_empty_weights
    from diffusers import Kandinsky5Transformer3DModel
    from safetensors.torch import load_file

    state_dict = load_file(release)
    with init_empty_weights():
        transformer = Kandinsky5Transformer3DModel.from_config(Kandinsky5Transformer3DModel.load_config(config_dir))
    transformer.load_state_dict(state_dict, strict=True, assign=True)
    del state_dict
    transformer.save_pretrained(output, max_shard_size="5GB")


@click.command()
@click.option("--visual-blocks", type=click.IntRange(1, RELEASE_BLOCKS), default=16, show_default=True)
@benchmark_options
def main(visual_blocks: int, **options) -> None:
    depth = "at full depth" if visual_blocks == RELEASE_BLOCKS else \
        f"but NOT full depth: {visual_blocks} visual blocks (the release has {RELEASE_BLOCKS})"
    FamilyBenchmark(
        script=Path(__file__).resolve(),
        size_args=["--visual-blocks", str(visual_blocks)],
        prepare=lambda work: prepare(work, visual_blocks),
        reference=reference_export,
        title=f"Kandinsky 5 Lite at full width (model_dim 1792) {depth}",
        release_kind=f"release file (model/{RELEASE_FILE})",
        reference_label="repository loading logic (reimplemented)",
    ).main(**options)


if __name__ == "__main__":
    main()
