"""Benchmark ``cogexport`` on an LTX-2 19B single-file release (every model the release holds in one file, random bf16
weights) -> Diffusers bf16 transformer, against the reference path, in one run.

    .venv/bin/python scripts/benchmark_ltx2.py [--runs 3] [--layers 48] [--work-dir .bench] [--json]
    .venv/bin/python scripts/benchmark_ltx2.py --reference-path RELEASE CONFIG_DIR OUT   # the reference alone

Full width always (the 19B's 32 x 128 video and 32 x 64 audio streams); full depth by default: 48 layers, 18.9B
parameters in the transformer (75.5 GB in fp32; the release file 43.3 GB in bf16), beside it the text connectors, both VAEs and the vocoder of the
release at their full sizes, as ltx-2-19b-dev.safetensors holds them. ``--layers N`` makes the transformer N layers
deep (the other models stay full size) for a quick check. cogexport:
``cogexport RELEASE OUT --base CONFIG_DIR --component transformer``. The reference path: Diffusers'
``LTX2VideoTransformer3DModel.from_single_file(RELEASE, config=CONFIG_DIR, torch_dtype=bfloat16)`` (the config must be
given: Diffusers' own detection takes an LTX-2 release for LTX-Video) then ``save_pretrained``. Both outputs are
compared tensor by tensor before anything is timed (single_file_benchmark.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, original_names,  # noqa: E402
                                   reference_export, release_setup, write_random_safetensors)

VARIANT = "LTX-2-19B-dev"
FULL_LAYERS = 48
BESIDE = ("connectors", "vae", "audio_vae", "vocoder")  # the release's other models, at full size


def meta_component(family, component: str, config: dict):
    """A model of the family on the meta device (its class may be a pipeline's own: the connectors, the vocoder)."""
    import torch

    from cogexport.models.family import model_class

    with torch.device("meta"):
        return model_class(family.components[component].class_name).from_config(config)


def prepare(work: Path, layers: int) -> dict:
    from cogexport.models import ltx2
    from cogexport.models.family import family_named

    family = family_named("ltx2")
    variant = family.variant_named(VARIANT)
    configs = {name: family.component_config(name, variant) for name in ("transformer", *BESIDE)}
    configs["transformer"] = {**configs["transformer"], "num_layers": layers}
    models = {name: meta_component(family, name, config) for name, config in configs.items()}
    parts = []
    for name, model in models.items():
        layout = family.components[name].original
        parts.append((layout.prefix, original_names(model, layout.table)))
    release = work / f"ltx-2-19b-{layers}-layers.safetensors"
    metadata = ltx2.original_metadata(configs["transformer"], "t2v", {name: configs[name] for name in BESIDE})
    write_random_safetensors(release, parts, metadata)
    setup = release_setup(release, release, work / f"ltx-2-19b-{layers}-layers-config", models["transformer"])
    return {**setup, "layers": layers}


@click.command()
@click.option("--layers", type=click.IntRange(1), default=FULL_LAYERS, show_default=True,
              help="Transformer layers (48: the full 19B).")
@benchmark_options
def main(layers: int, **options) -> None:
    FamilyBenchmark(
        script=Path(__file__).resolve(), size_args=["--layers", str(layers)],
        prepare=lambda work: prepare(work, layers),
        reference=lambda release, config_dir, output: reference_export(release, "LTX2VideoTransformer3DModel",
                                                                       config_dir, output),
        title=f"LTX-2 19B ({layers} layers{'' if layers == FULL_LAYERS else ', reduced depth'}, full width) single "
              "file with its connectors, VAEs and vocoder",
    ).main(**options)


if __name__ == "__main__":
    main()
