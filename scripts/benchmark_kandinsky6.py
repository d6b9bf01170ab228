"""Benchmark ``cogexport`` on a Kandinsky 6 published transformer folder against Diffusers' own loading, in one run.

    .venv/bin/python scripts/benchmark_kandinsky6.py [--visual-blocks 16] [--runs 3] [--json]
    .venv/bin/python scripts/benchmark_kandinsky6.py --reference-path RELEASE CONFIG_DIR OUT   # the reference alone

The release (kandinskylab/Kandinsky-6.0-Lite-5s-Diffusers: 3.2B parameters, 32 visual blocks) publishes its
transformer as a ``save_pretrained`` folder in Diffusers' names ("the renamed DiT keys"): there is no other layout of
the published weights to convert, and Diffusers has no single-file loader or conversion script for the class. The
benchmark makes (once, cached in --work-dir) that folder at FULL WIDTH (model_dim 1792, audio 896, the real Qwen2.5-VL
and CLIP widths, 2 text blocks) with FEWER VISUAL BLOCKS by default (16 of 32), said in its output: random bf16
weights (this script's choice of dtype) in two shards with their index and Diffusers' config.json. Then, each tool in
a fresh process, to a bf16 Diffusers folder with 5GB shards (single_file_benchmark.py):

- cogexport: ``cogexport RELEASE OUT`` (the config beside the weights gives the size; cogexport keeps the time
  embeddings, modulations and norms in fp32);
- the reference path: ``Kandinsky6Transformer3DModel.from_pretrained(RELEASE, torch_dtype=torch.bfloat16)`` then
  ``save_pretrained``, what a user of Diffusers runs to re-save the model.

The outputs are compared tensor by tensor before anything is timed (the tensors cogexport keeps in fp32 compared after
rounding to bf16).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, from_pretrained_export,  # noqa: E402
                                   meta_model, release_setup, write_random_shards)

VARIANT = "Kandinsky-6.0-Lite-5s"
CLASS = "Kandinsky6Transformer3DModel"
RELEASE_BLOCKS = 32  # visual blocks of the published Lite model
SHARDS = 2


def write_release(folder: Path, config: dict):
    """The published transformer folder of a model of ``config``: random bf16 shards with their index and the
    class's config.json, made once. Returns the shards and the model on the meta device."""
    model = meta_model(CLASS, config)
    names = {name: tensor.shape for name, tensor in model.state_dict().items()}
    shards = write_random_shards(folder, "diffusion_pytorch_model", names, SHARDS)
    model.save_config(folder)
    return shards, model


def prepare(work: Path, visual_blocks: int) -> dict:
    """The release folder, and a Diffusers config folder (unused by both tools: each reads the folder's own)."""
    from cogexport.models.family import family_named

    family = family_named("kandinsky6")
    config = {**family.transformer_config(family.variant_named(VARIANT)), "num_visual_blocks": visual_blocks}
    folder = work / f"kandinsky6-lite-{visual_blocks}v" / "transformer"
    shards, model = write_release(folder, config)
    setup = release_setup(folder, shards[0], folder.parent / "diffusers-config", model)
    return {**setup, "weights": [str(path) for path in shards],
            "release_bytes": sum(path.stat().st_size for path in shards)}


def reference_export(release: Path, config_dir: Path, output: Path) -> None:
    from_pretrained_export(CLASS, release, output)


@click.command()
@click.option("--visual-blocks", type=click.IntRange(1, RELEASE_BLOCKS), default=16, show_default=True)
@benchmark_options
def main(visual_blocks: int, **options) -> None:
    depth = "at full depth" if visual_blocks == RELEASE_BLOCKS else \
        f"but NOT full depth: {visual_blocks} of {RELEASE_BLOCKS} visual blocks"
    FamilyBenchmark(
        script=Path(__file__).resolve(),
        size_args=["--visual-blocks", str(visual_blocks)],
        prepare=lambda work: prepare(work, visual_blocks),
        reference=reference_export,
        title=f"Kandinsky 6 Lite at full width (model_dim 1792) {depth}",
        release_kind=f"published transformer folder ({SHARDS} shards, Diffusers' names)",
        reference_label="from_pretrained",
        cogexport_base=False,  # the folder's config.json gives the size
    ).main(**options)


if __name__ == "__main__":
    main()
