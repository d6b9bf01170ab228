"""Benchmark ``cogexport`` on a HunyuanVideo FramePack release folder against the path Diffusers' own FramePack example
takes, in one run.

    .venv/bin/python scripts/benchmark_framepack.py [--double-blocks 2] [--single-blocks 4] [--runs 3] [--json]
    .venv/bin/python scripts/benchmark_framepack.py --reference-path RELEASE CONFIG_DIR OUT   # the reference alone

The release (lllyasviel/FramePackI2V_HY: 13B, 20 double and 40 single blocks, about 26 GB in bf16) is a
``save_pretrained`` folder of diffusers_helper's HunyuanVideoTransformer3DModelPacked: Diffusers' tensor names in
bf16 shards with their index, and a config.json naming the Packed class. The benchmark makes (once, cached in
--work-dir) that folder at FULL WIDTH (hidden 3072, the real text, SigLIP and history-embedder widths) with FEWER
BLOCKS by default (2 double and 4 single: the release's one to two), said in its output, random bf16 weights in two
shards. Then, each tool in a fresh process, to a bf16 Diffusers folder with 5GB shards (single_file_benchmark.py):

- cogexport: ``cogexport RELEASE OUT`` (the config beside the weights gives the size);
- the reference path: ``HunyuanVideoFramepackTransformer3DModel.from_pretrained(RELEASE, torch_dtype=torch.bfloat16)``
  (what Diffusers' FramePack documentation loads the release with: Diffusers has no single-file loader or conversion
  script for the class) then ``save_pretrained``.

The outputs are compared tensor by tensor before anything is timed (cogexport keeps the q/k norms and the text
refiner's LayerNorms in fp32: compared after rounding to bf16).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, from_pretrained_export,  # noqa: E402
                                   meta_model, release_setup, write_random_shards)

VARIANT = "FramePackI2V_HY"
RELEASE_DOUBLE, RELEASE_SINGLE = 20, 40  # the release's blocks
SHARDS = 2


def model_config(double_blocks: int, single_blocks: int) -> dict:
    from cogexport.models.family import family_named

    family = family_named("framepack")
    config = family.transformer_config(family.variant_named(VARIANT))
    return {**config, "num_layers": double_blocks, "num_single_layers": single_blocks}


def write_release(folder: Path, config: dict):
    """lllyasviel's release folder of a model of ``config``: random bf16 shards of Diffusers' names (the Packed
    class's are the same) with their index, and the Packed class's config.json; made once. Returns the shards and
    the model on the meta device."""
    import json

    import diffusers
    from framepack_tiny import release_config

    model = meta_model("HunyuanVideoFramepackTransformer3DModel", config)
    names = {name: tensor.shape for name, tensor in model.state_dict().items()}
    shards = write_random_shards(folder, "diffusion_pytorch_model", names, SHARDS)
    (folder / "config.json").write_text(json.dumps(release_config(dict(model.config), diffusers.__version__),
                                                   indent=2) + "\n")
    return shards, model


def prepare(work: Path, double_blocks: int, single_blocks: int) -> dict:
    """The release folder, and a Diffusers config folder (unused by both tools: each reads the release's own)."""
    folder = work / f"framepack-{double_blocks}d{single_blocks}s" / "release"
    shards, model = write_release(folder, model_config(double_blocks, single_blocks))
    setup = release_setup(folder, shards[0], folder.parent / "diffusers-config", model)
    return {**setup, "weights": [str(path) for path in shards],
            "release_bytes": sum(path.stat().st_size for path in shards)}


def reference_export(release: Path, config_dir: Path, output: Path) -> None:
    """Diffusers' FramePack example's load of the release folder, then save_pretrained."""
    from_pretrained_export("HunyuanVideoFramepackTransformer3DModel", release, output)


@click.command()
@click.option("--double-blocks", type=click.IntRange(1, RELEASE_DOUBLE), default=2, show_default=True)
@click.option("--single-blocks", type=click.IntRange(1, RELEASE_SINGLE), default=4, show_default=True)
@benchmark_options
def main(double_blocks: int, single_blocks: int, **options) -> None:
    full = (double_blocks, single_blocks) == (RELEASE_DOUBLE, RELEASE_SINGLE)
    depth = "at full depth" if full else (f"but NOT full depth: {double_blocks} of {RELEASE_DOUBLE} double and "
                                          f"{single_blocks} of {RELEASE_SINGLE} single blocks")
    FamilyBenchmark(
        script=Path(__file__).resolve(),
        size_args=["--double-blocks", str(double_blocks), "--single-blocks", str(single_blocks)],
        prepare=lambda work: prepare(work, double_blocks, single_blocks),
        reference=reference_export,
        title=f"{VARIANT} at full width (hidden 3072) {depth}",
        release_kind=f"release folder ({SHARDS} shards, config.json naming the Packed class)",
        reference_label="from_pretrained",
        cogexport_base=False,  # the release's config.json gives the size
    ).main(**options)


if __name__ == "__main__":
    main()
