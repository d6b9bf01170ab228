"""Benchmark ``cogexport`` on a SANA-Video release file against Diffusers' conversion script, in one run.

    .venv/bin/python scripts/benchmark_sana_video.py [--layers 8] [--runs 3] [--diffusers-repo DIR] [--json]
    .venv/bin/python scripts/benchmark_sana_video.py --reference-path RELEASE CONFIG_DIR OUT   # the reference alone

The release (NVlabs' ``SANA_Video_2B_480p.pth``: 20 blocks, 2240 wide) is a ``torch.save`` of ``{"state_dict": ...}``
in SanaMSVideo's names. The benchmark makes (once, cached in --work-dir) that file at FULL WIDTH (2240, the Gemma-2
caption width 2304) with FEWER BLOCKS by default (8 of 20), said in its output, random fp32 weights (this script's
choice: the release's own dtype was not read), without the four tensors Diffusers has no place for (the null caption,
``pos_embed``, the logvar head: a few MB, whose sizes in the release were not established). Then, each tool in a fresh
process, to a bf16 Diffusers folder with 5GB shards (single_file_benchmark.py):

- cogexport: ``cogexport RELEASE OUT --base CONFIG_DIR --component transformer`` (a cut model's size is the config's);
- the reference path: Diffusers' repository script ``scripts/convert_sana_video_to_diffusers.py`` (from
  --diffusers-repo's HEAD, extracted into --work-dir), its ``main`` run from its own source by
  ``sana_video_judge.convert`` with ``--dtype bf16`` and the script's accelerate ``init_empty_weights``; stood in for:
  its hard-coded layer count (20), told the file's, and its ``transformer/`` folder taken as the output folder.

The outputs are compared tensor by tensor before anything is timed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (DIFFUSERS_REPO, FamilyBenchmark, benchmark_options,  # noqa: E402
                                   keep_reference_source, kept_reference_source, meta_model, original_names,
                                   release_setup, save_random_model_states, take_subfolder)

VARIANT = "SANA-Video_2B_480p"
RELEASE_FILE = "SANA_Video_2B_480p.pth"
RELEASE_LAYERS = 20
CONVERTER = "scripts/convert_sana_video_to_diffusers.py"


def write_release(path: Path, config: dict):
    """The release file of a model of ``config`` (random fp32 weights in SanaMSVideo's names, under "state_dict"),
    made once; returns the model on the meta device."""
    from cogexport.models.family import family_named

    family = family_named("sana_video")
    model = meta_model(family.transformer.class_name, config)
    layout = family.transformer.original
    save_random_model_states(path, original_names(model, layout.table), under=layout.under, dtype="float32")
    return model


def prepare(work: Path, layers: int, diffusers_repo: Path) -> dict:
    """The release file and a Diffusers config folder, where the conversion script was extracted to."""
    from cogexport.models.family import family_named

    family = family_named("sana_video")
    config = {**family.transformer_config(family.variant_named(VARIANT)), "num_layers": layers}
    release = work / f"sana-video-2b-{layers}-layers" / RELEASE_FILE
    model = write_release(release, config)
    setup = release_setup(release, release, release.parent / "diffusers-config", model)
    keep_reference_source(diffusers_repo, CONVERTER, work, Path(setup["config_dir"]))
    return setup


def converter_export(release: Path, config_dir: Path, output: Path) -> None:
    """Diffusers' conversion script's main on the release, in bf16 (see the module docstring)."""
    from sana_video_judge import convert

    config = json.loads((config_dir / "config.json").read_text())
    convert(Path(kept_reference_source(config_dir)), release, config, output / "script", dtype="bf16",
            empty_init=True)
    take_subfolder(output / "script" / "transformer", output)


@click.command()
@click.option("--layers", type=click.IntRange(1, RELEASE_LAYERS), default=8, show_default=True)
@click.option("--diffusers-repo", type=click.Path(exists=True, path_type=Path), default=DIFFUSERS_REPO,
              show_default=True, help="huggingface/diffusers (a checkout or a git directory): the reference's script.")
@benchmark_options
def main(layers: int, diffusers_repo: Path, **options) -> None:
    depth = "at full depth" if layers == RELEASE_LAYERS else \
        f"but NOT full depth: {layers} of {RELEASE_LAYERS} blocks"
    repo = diffusers_repo.resolve()
    FamilyBenchmark(
        script=Path(__file__).resolve(),
        size_args=["--layers", str(layers), "--diffusers-repo", str(repo)],
        prepare=lambda work: prepare(work, layers, repo),
        reference=converter_export,
        title=f"{VARIANT} at full width (2240) {depth}",
        release_kind=f"release file ({RELEASE_FILE}, torch.save of its state_dict)",
        release_dtype="fp32",
        reference_label="convert_sana_video_to_diffusers.py",
    ).main(**options)


if __name__ == "__main__":
    main()
