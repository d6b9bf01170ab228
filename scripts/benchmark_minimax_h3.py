"""Benchmark ``cogexport`` on MiniMax-H3's transformer, from the release's partition or a Comfy-Org single file, against
Diffusers' own single-file converter, in one run.

    .venv/bin/python scripts/benchmark_minimax_h3.py [--layout release|comfy] [--blocks 2] [--runs 3] [--json]
    .venv/bin/python scripts/benchmark_minimax_h3.py --layout L --reference-path RELEASE CONFIG_DIR OUT  # it alone

The published transformer (FL2VA or Ref2VA: the same tensors) is 50 blocks of 5376 (56 heads of 128, a 14336-wide
SwiGLU), 33B parameters; the benchmark keeps it at FULL WIDTH with FEWER BLOCKS (``--blocks``, 2 by default: 2.1B
parameters, 4.3 GB in the release's dtypes), said in its output; the two text refiner blocks are full depth. It makes
(once, cached in --work-dir) random weights N(0, 0.02) in the release's mixed precision (the patch projections, the
timestep MLP, the output heads and ``rope.inv_freq`` fp32, the rest bf16), in one of the two published layouts:

- ``--layout release``: a release partition, ``FL2VA/transformer/`` of MiniMaxAI/MiniMax-H3: the tensors in the order
  the original module registers them, cut into ``model-0000i-of-0000n.safetensors`` shards by huggingface_hub's
  splitter at ``--release-shard-size`` (2GB by default, so that the subset is in several shards as the release is;
  the release's own are about 5 GB), the index, and the ``MiniMaxH3DiTModel`` config.json; qkv_proj's rows
  interleaved per head. cogexport: ``cogexport PARTITION OUT`` (the config.json beside the shards is its config and
  says the row order). The reference path: what a Diffusers user runs on a sharded checkpoint, every shard loaded
  into one state dict (safetensors' ``load_file``), then
  ``MiniMaxH3Transformer3DModel.from_single_file(state_dict, config=CONFIG_DIR, qkv_layout="interleaved",
  torch_dtype=bfloat16)`` and ``save_pretrained``.
- ``--layout comfy``: Comfy-Org's single file (``minimax_h3_fl2va_bf16.safetensors``: the same names, qkv_proj's rows
  stacked [q; k; v]). cogexport: ``cogexport FILE OUT --base CONFIG_DIR --component transformer``. The reference
  path: ``from_single_file(FILE, config=CONFIG_DIR, torch_dtype=bfloat16)`` (its default qkv_layout, "stacked"),
  then ``save_pretrained``.

For the release layout a second reference runs beside it: Diffusers' conversion script for the release folder
(``scripts/convert_minimax_h3_to_diffusers.py`` of its repository, --diffusers-repo: a checkout or a git directory,
whose HEAD's file is extracted into --work-dir), its transformer steps as its ``main`` calls them (streaming the
shards a tensor at a time); it keeps the release's fp32 tensors fp32 and writes its 5 GiB shards with an index.

The tools write a bf16 Diffusers folder with 5GB shards (from_single_file casts every tensor; cogexport and the
conversion script keep the release's fp32 tensors fp32, as the class's _keep_in_fp32_modules names them), each
compared with cogexport's tensor by tensor before anything is timed (single_file_benchmark.compare_outputs: same
names, shapes and config; equal values, cogexport's fp32 tensors rounded where the other tool wrote bf16); any
difference fails the benchmark. Then --runs rounds, alternating, beside cogexport --workers 1, the I/O floors and
cogexport's start (single_file_benchmark.FamilyBenchmark).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from single_file_benchmark import (FamilyBenchmark, benchmark_options, make_once, meta_model,  # noqa: E402
                                   parameter_count, reference_export)

CLASS = "MiniMaxH3Transformer3DModel"
VARIANT = "MiniMax-H3-FL2VA"
RELEASE_BLOCKS = 50
COMFY_FILE = "minimax_h3_fl2va_bf16.safetensors"
# the release's fp32 tensors (Diffusers' conversion script checks the same prefixes); everything else is bf16
RELEASE_FP32 = ("video_patch_proj.", "audio_patch_proj.", "time_embedder.", "final_layer.video_out.",
                "final_layer.audio_out.", "rope.")
QKV_LAYOUT = {"release": "interleaved", "comfy": "stacked"}  # each layout's row order, as Diffusers' converter says
CONVERSION_SCRIPT = "scripts/convert_minimax_h3_to_diffusers.py"  # in Diffusers' repository, not its package
DEFAULT_DIFFUSERS_REPO = Path("/work/.mirror/huggingface+diffusers/repo")
SCRIPT_LABEL = "Diffusers convert_minimax_h3_to_diffusers.py"


# --------------------------------------------------------------------------------------------------------------
# Making the release (in the --prepare helper process)

def published_config(blocks: int) -> dict:
    """MiniMaxH3Transformer3DModel's config of the published transformer, ``blocks`` deep."""
    from cogexport.models.family import family_named

    family = family_named("minimax_h3")
    return {**family.transformer_config(family.variant_named(VARIANT)), "num_layers": blocks}


def release_tensors(model) -> dict:
    """Lazy random tensors under the release's names (the release table run backwards on the meta model), in the
    release's dtypes and its module's order, ``rope.inv_freq`` (which the Diffusers model recomputes) among them."""
    import torch

    from cogexport.keymap.plan import plan_translation
    from cogexport.keymap.table import load_table
    from cogexport.lazy import LazyTensor
    from cogexport.models.minimax_h3 import original_order

    meta = {name: LazyTensor(t.shape, torch.bfloat16, lambda: None) for name, t in model.state_dict().items()}
    shapes = {name: tensor.shape for name, tensor in plan_translation(
        load_table("minimax_h3/release_transformer").inverted(), meta, None, dict(model.config)).tensors.items()}
    shapes["rope.inv_freq"] = torch.Size([model.config.rope_freq_dim])
    generator = torch.Generator().manual_seed(0)

    def noise(shape, dtype):
        return lambda: (torch.randn(shape, generator=generator) * 0.02).to(dtype)

    dtypes = {name: torch.float32 if name.startswith(RELEASE_FP32) else torch.bfloat16 for name in shapes}
    return {name: LazyTensor(shapes[name], dtypes[name], noise(shapes[name], dtypes[name]))
            for name in original_order(list(shapes))}


def write_partition(folder: Path, tensors: dict, config: dict, shard_size: str) -> list[Path]:
    """A release partition in ``folder``: the shards as huggingface_hub cuts them, their index, the config.json."""
    from cogexport.models.minimax_h3 import original_config
    from cogexport.write.safetensors_file import write_safetensors
    from cogexport.write.shards import SAFETENSORS_METADATA, plan_shards

    plan = plan_shards(tensors, "model.safetensors", shard_size)
    for name, names in plan.files.items():
        make_once(folder / name, lambda partial, names=names: write_safetensors(
            partial, {n: tensors[n] for n in names}, SAFETENSORS_METADATA))
    if plan.is_sharded:
        (folder / plan.index_name).write_text(json.dumps(plan.index, indent=2))
    (folder / "config.json").write_text(json.dumps(original_config(config, "fl2va"), indent=2))
    return [folder / name for name in plan.files]


def write_release(root: Path, layout: str, config: dict, shard_size: str = "2GB") -> tuple[Path, list[Path]]:
    """The release of random weights in ``layout`` under ``root``: (what cogexport is given, its weight files)."""
    from cogexport.write.safetensors_file import write_safetensors

    model = meta_model(CLASS, config)
    tensors = release_tensors(model)
    if layout == "release":
        folder = root / "FL2VA" / "transformer"
        return folder, write_partition(folder, tensors, dict(model.config), shard_size)
    path = root / COMFY_FILE  # the same names; random rows need no reordering to be in the stacked order
    make_once(path, lambda partial: write_safetensors(partial, tensors))
    return path, [path]


def prepare(work: Path, layout: str, blocks: int, shard_size: str, diffusers_repo: Path) -> dict:
    config = published_config(blocks)
    release, weights = write_release(work / f"minimax-h3-{blocks}b-{layout}", layout, config, shard_size)
    model = meta_model(CLASS, config)
    config_dir = work / f"minimax-h3-{blocks}b-config"
    model.save_config(config_dir)
    if layout == "release":  # the conversion script, from Diffusers' repository at its HEAD
        from benchmark_cosmos import extract_source

        source = extract_source(diffusers_repo, CONVERSION_SCRIPT, work / "reference-sources")
        (config_dir / "conversion-script.json").write_text(json.dumps(source))
    return {"release": str(release), "weights": [str(path) for path in weights],
            "release_bytes": sum(path.stat().st_size for path in weights), "config_dir": str(config_dir),
            "parameters": parameter_count(model)}


# --------------------------------------------------------------------------------------------------------------
# The reference path (its own process)

def sharded_reference_export(partition: Path, config_dir: Path, output: Path) -> None:
    """Diffusers' single-file converter on the release's shards: they loaded into one state dict (the converter takes
    a file or a dict), told the per-head row order, in bf16, then save_pretrained."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    import diffusers
    import torch
    from safetensors.torch import load_file

    index = json.loads((partition / "model.safetensors.index.json").read_text())
    state_dict = {}
    for shard in sorted(set(index["weight_map"].values())):
        state_dict.update(load_file(partition / shard))
    model = getattr(diffusers, CLASS).from_single_file(state_dict, config=str(config_dir), qkv_layout="interleaved",
                                                       torch_dtype=torch.bfloat16, local_files_only=True)
    del state_dict
    model.save_pretrained(output, max_shard_size="5GB")


def conversion_script_export(partition: Path, config_dir: Path, output: Path) -> None:
    """Diffusers' conversion script for the release folder (``--checkpoint_path FL2VA``): the transformer steps of its
    ``main`` as it calls them (``convert_transformer``, streaming the shards, then ``write_transformer_config``), its
    config table's keys given the release's values (it knows the published 50 blocks). Not run: its VAE, scheduler and
    index steps (the benchmark's release holds the transformer only). It keeps the release's fp32 tensors fp32."""
    import os

    os.environ["HF_HUB_OFFLINE"] = "1"
    from benchmark_cosmos import load_source
    from diffusers import __version__

    source = json.loads((config_dir / "conversion-script.json").read_text())["path"]
    converter = load_source(source, "convert_minimax_h3_to_diffusers")
    given = json.loads((config_dir / "config.json").read_text())
    config = {key: given[key] for key in converter.MINIMAX_H3_TRANSFORMER_CONFIG}  # its keys, at the release's size
    converter.convert_transformer(str(partition.parent), str(output), config, 5 * 1024**3)  # its default shard size
    converter.write_transformer_config(str(output), config, __version__)


def conversion_script_tool(script: Path, size_args: list[str]):
    """The conversion script's row (the release layout's second reference), run by this script's hidden mode."""
    def tool(setup: dict, work: Path) -> dict:
        output = work / "out-conversion-script"
        return {SCRIPT_LABEL: ([sys.executable, str(script), *size_args, "--conversion-script", setup["release"],
                                setup["config_dir"], str(output)], output)}

    return tool


def layout_reference(layout: str):
    if layout == "release":
        return sharded_reference_export
    return lambda release, config_dir, output: reference_export(release, CLASS, config_dir, output)


@click.command()
@click.option("--layout", type=click.Choice(sorted(QKV_LAYOUT)), default="release", show_default=True,
              help="release: the release's partition (shards, index, config.json; qkv interleaved per head); comfy: "
                   "Comfy-Org's single file (qkv stacked).")
@click.option("--blocks", type=click.IntRange(1, RELEASE_BLOCKS), default=2, show_default=True)
@click.option("--release-shard-size", default="2GB", show_default=True,
              help="Where the release partition's shards are cut (huggingface_hub's splitter).")
@click.option("--diffusers-repo", type=click.Path(path_type=Path), default=DEFAULT_DIFFUSERS_REPO,
              show_default=True, help="huggingface/diffusers (a checkout or a git directory): its conversion script "
                                      "is the release layout's second reference.")
@click.option("--conversion-script", nargs=3, type=click.Path(path_type=Path), default=None, hidden=True)
@benchmark_options
def main(layout: str, blocks: int, release_shard_size: str, diffusers_repo: Path, conversion_script: tuple | None,
         **options) -> None:
    if conversion_script:
        return conversion_script_export(*conversion_script)
    depth = "at full depth" if blocks == RELEASE_BLOCKS else \
        f"but NOT full depth: {blocks} blocks (the release has {RELEASE_BLOCKS})"
    kind = {"release": f"release partition (FL2VA/transformer/: shards of {release_shard_size}, index, config.json; "
                       "qkv interleaved per head)",
            "comfy": f"Comfy-Org single file ({COMFY_FILE}; qkv stacked)"}[layout]
    script = Path(__file__).resolve()
    size_args = ["--layout", layout, "--blocks", str(blocks), "--release-shard-size", release_shard_size,
                 "--diffusers-repo", str(diffusers_repo.resolve())]
    FamilyBenchmark(
        script=script,
        size_args=size_args,
        prepare=lambda work: prepare(work, layout, blocks, release_shard_size, diffusers_repo.resolve()),
        reference=layout_reference(layout),
        title=f"MiniMax-H3 transformer at full width (hidden 5376, 56 heads of 128, FFN 14336) {depth}",
        release_kind=kind,
        reference_label=f"Diffusers from_single_file (qkv_layout={QKV_LAYOUT[layout]})",
        cogexport_base=layout == "comfy",
        more_tools=conversion_script_tool(script, size_args) if layout == "release" else None,
    ).main(**options)


if __name__ == "__main__":
    main()
