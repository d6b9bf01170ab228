"""Benchmark ``cogexport`` on an LTX-2 19B single-file release (every model the release holds in one file, random bf16
weights) -> Diffusers bf16 transformer, against the reference path, in one run; or (``--version 2.5``) on LTX-2.5's
transformer file against Diffusers' conversion script.

    .venv/bin/python scripts/benchmark_ltx2.py [--runs 3] [--layers 48] [--work-dir .bench] [--json]
    .venv/bin/python scripts/benchmark_ltx2.py --version 2.5 --layers 4 [--diffusers-repo DIR] [--runs 3]
    .venv/bin/python scripts/benchmark_ltx2.py --reference-path RELEASE CONFIG_DIR OUT   # the reference alone

Full width always (the 19B's 32 x 128 video and 32 x 64 audio streams); full depth by default: 48 layers, 18.9B
parameters in the transformer (75.5 GB in fp32; the release file 43.3 GB in bf16), beside it the text connectors, both VAEs and the vocoder of the
release at their full sizes, as ltx-2-19b-dev.safetensors holds them. ``--layers N`` makes the transformer N layers
deep (the other models stay full size) for a quick check. cogexport:
``cogexport RELEASE OUT --base CONFIG_DIR --component transformer``. The reference path: Diffusers'
``LTX2VideoTransformer3DModel.from_single_file(RELEASE, config=CONFIG_DIR, torch_dtype=bfloat16)`` (the config must be
given: Diffusers' own detection takes an LTX-2 release for LTX-Video) then ``save_pretrained``. Both outputs are
compared tensor by tensor before anything is timed (single_file_benchmark.py).

LTX-2.5 (22B: 48 layers, 2.3's widths) ships one file per model; ``--version 2.5`` makes its transformer file
(``ltx-2.5-22b-dev-transformer``: the transformer alone under ``model.diffusion_model.``, its header config) at full
width, ``--layers`` deep (about 0.9 GB of bf16 a layer). The installed single-file converter knows only 2.0's names, so
the reference path is Diffusers' repository script ``scripts/convert_ltx2_to_diffusers.py`` (from --diffusers-repo's
HEAD, a checkout or a git directory, extracted into --work-dir), run as a user runs it on that file: ``--version 2.5
--dit --original_state_dict_repo_id none --checkpoint_path FILE --combined_filename FILE --dit_dtype bf16``, its
``main`` as it is. Stood in for: its config table's layer count (it knows only the full 48), told the file's, and the
``transformer/`` folder it writes taken as the output folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (DIFFUSERS_REPO, FamilyBenchmark, benchmark_options,  # noqa: E402
                                   keep_reference_source, kept_reference_source, load_source, original_names,
                                   reference_export, release_setup, take_subfolder, write_random_safetensors)

VARIANT = "LTX-2-19B-dev"
VARIANT_25 = "LTX-2.5-22B-dev"
CONVERTER = "scripts/convert_ltx2_to_diffusers.py"
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


def prepare_25(work: Path, layers: int, diffusers_repo: Path) -> dict:
    """LTX-2.5's transformer file (random bf16 weights, its header config), made once; beside its Diffusers config
    folder, where Diffusers' conversion script was extracted to."""
    from cogexport.models import ltx2
    from cogexport.models.family import family_named

    family = family_named("ltx2")
    config = {**family.component_config("transformer", family.variant_named(VARIANT_25)), "num_layers": layers}
    model = meta_component(family, "transformer", config)
    layout = family.components["transformer"].original
    release = work / f"ltx-2.5-22b-dev-transformer-{layers}-layers.safetensors"
    write_random_safetensors(release, [(layout.prefix, original_names(model, layout.table))],
                             ltx2.original_metadata(config, "t2v", {}))
    setup = release_setup(release, release, work / f"ltx-2.5-22b-{layers}-layers-config", model)
    source = keep_reference_source(diffusers_repo, CONVERTER, work, Path(setup["config_dir"]))
    return {**setup, "layers": layers, "source": source}


def converter_export(release: Path, config_dir: Path, output: Path) -> None:
    """Diffusers' conversion script on the transformer file, as a user runs it (see the module docstring)."""
    source = kept_reference_source(config_dir)
    converter = load_source(source, "convert_ltx2_to_diffusers")
    layers = json.loads((config_dir / "config.json").read_text())["num_layers"]
    published = converter.get_ltx2_transformer_config

    def told_the_depth(version: str):
        config, renames, special = published(version)
        config["diffusers_config"]["num_layers"] = layers
        return config, renames, special

    converter.get_ltx2_transformer_config = told_the_depth
    sys.argv = [source, "--version", "2.5", "--dit", "--original_state_dict_repo_id", "none",
                "--checkpoint_path", str(release), "--combined_filename", release.name, "--dit_dtype", "bf16",
                "--output_path", str(output / "script")]
    converter.main(converter.get_args())
    take_subfolder(output / "script" / "transformer", output)


@click.command()
@click.option("--version", type=click.Choice(["2.0", "2.5"]), default="2.0", show_default=True,
              help="2.0: the 19B single file; 2.5: the 22B transformer file, against Diffusers' conversion script.")
@click.option("--layers", type=click.IntRange(1), default=FULL_LAYERS, show_default=True,
              help="Transformer layers (48: the full model).")
@click.option("--diffusers-repo", type=click.Path(exists=True, path_type=Path), default=DIFFUSERS_REPO,
              show_default=True,
              help="huggingface/diffusers (a checkout or a git directory), whose script is --version 2.5's reference.")
@benchmark_options
def main(version: str, layers: int, diffusers_repo: Path, **options) -> None:
    depth = "" if layers == FULL_LAYERS else ", reduced depth"
    if version == "2.5":
        repo = diffusers_repo.resolve()
        benchmark = FamilyBenchmark(
            script=Path(__file__).resolve(),
            size_args=["--version", version, "--layers", str(layers), "--diffusers-repo", str(repo)],
            prepare=lambda work: prepare_25(work, layers, repo), reference=converter_export,
            title=f"LTX-2.5 22B ({layers} layers{depth}, full width) transformer file",
            reference_label="convert_ltx2_to_diffusers.py --version 2.5")
    else:
        benchmark = FamilyBenchmark(
            script=Path(__file__).resolve(), size_args=["--layers", str(layers)],
            prepare=lambda work: prepare(work, layers),
            reference=lambda release, config_dir, output: reference_export(
                release, "LTX2VideoTransformer3DModel", config_dir, output),
            title=f"LTX-2 19B ({layers} layers{depth}, full width) single file with its connectors, VAEs and vocoder")
    benchmark.main(**options)


if __name__ == "__main__":
    main()
