"""Benchmark ``cogexport`` on an imaginaire run of Cosmos Predict 2.5 against NVIDIA's and Diffusers' path, in one run.

    .venv/bin/python scripts/benchmark_cosmos.py [--layers 4] [--runs 3] [--json]
        [--nvidia-repo DIR] [--diffusers-repo DIR]

Cosmos Predict 2.5 2B is about 8 GB in fp32 (28 blocks); the benchmark uses it at FULL WIDTH (hidden 2048, the
100352-wide text projection) with FEWER BLOCKS by default, said in its output (``--layers 28`` is the full depth,
where the machine allows: the reference path holds the whole run in memory twice). It makes (once, cached in
--work-dir) one iteration of an imaginaire run of random weights saved as NVIDIA's trainer saves it: FSDP2 on 2 gloo
ranks, ``net.*`` in bf16 and its EMA ``net_ema.*`` in fp32 (scripts/make_cosmos_bench_run.py). Then, each tool in a
fresh process, the EMA to a bf16 Diffusers transformer with 5GB shards (what the Hub's Diffusers repos hold):

- cogexport: ``cogexport RUN OUT --base CONFIG_DIR --component transformer --ema`` (the run folder: the iteration
  latest_checkpoint.txt names; streams the EMA's tensors out of the DCP files);
- the REFERENCE PATH, NVIDIA's documented two steps, each its own process, run from the two projects' sources
  (--nvidia-repo, --diffusers-repo: a checkout or a bare git directory, whose HEAD is extracted into --work-dir):
  1. cosmos-predict2.5's ``scripts/convert_distcp_to_pt.py ITERATION/model OUT/convert_distcp_to_pt``: its ``main``
     as it is (``dcp_to_torch_save`` to ``model.pt``, then ``model_ema_fp32.pt`` and ``model_ema_bf16.pt``). Its
     argument parser, tyro, is used if installed; if not, a stand-in builds the same ``Args`` from the command line.
  2. Diffusers' ``scripts/convert_cosmos_to_diffusers.py`` on ``model_ema_bf16.pt`` with ``--transformer_type
     Cosmos-2.5-Predict-Base-2B``: the script's own ``get_state_dict``, ``convert_transformer``, ``.to(bf16)`` and
     ``save_pretrained`` called as its main block calls them, its config table told the block count (it only knows
     the full 28). Stood in for: the main block itself, which then downloads Wan 2.1's VAE from the Hub and saves it
     into the same folder; the transformer is what is compared and timed.

Before anything is timed both folders are compared tensor by tensor (single_file_benchmark.compare_outputs: same
names, shapes and config, equal values); any difference fails the benchmark. Then --runs rounds, alternating, with
cogexport --workers 1, the I/O floor (the EMA's bytes read from the DCP files, cogexport's output's bytes written)
and cogexport's start beside them. Reported: median wall time and peak PSS and RSS of each tool's process tree
(benchmarking.measure_tree), peak PSS as a multiple of the fp32 model and ratios to cogexport.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import types
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import SCRIPTS  # noqa: E402
from single_file_benchmark import (DIFFUSERS_REPO, MIRRORS, FamilyBenchmark, benchmark_options,  # noqa: E402
                                   extract_source, load_source)

FULL_LAYERS = 28
NVIDIA_SCRIPT, DIFFUSERS_SCRIPT = "scripts/convert_distcp_to_pt.py", "scripts/convert_cosmos_to_diffusers.py"
TRANSFORMER_TYPE = "Cosmos-2.5-Predict-Base-2B"  # the Diffusers converter's name for the 2B model
DEFAULT_REPOS = {"nvidia": MIRRORS / "nvidia-cosmos+cosmos-predict2.5" / "repo", "diffusers": DIFFUSERS_REPO}


# --------------------------------------------------------------------------------------------------------------
# Making the run and fetching the reference's sources (in the --prepare helper process)

def make_run(work: Path, layers: int) -> Path:
    """make_cosmos_bench_run.py's OUT for ``layers`` blocks, made once per work dir."""
    folder = work / f"cosmos-2.5-2b-{layers}l-imaginaire"
    done = folder / "complete"
    if not done.exists():
        click.echo(f"making the {layers}-block imaginaire run (FSDP2, 2 ranks; minutes)...", err=True)
        subprocess.run([sys.executable, str(SCRIPTS / "make_cosmos_bench_run.py"), str(folder), "--layers",
                        str(layers)], check=True, stdout=subprocess.DEVNULL)
        done.write_text("")
    return folder


def prepare(work: Path, layers: int, repos: dict[str, Path]) -> dict:
    from diffusers import CosmosTransformer3DModel

    from single_file_benchmark import meta_model, parameter_count

    folder = make_run(work, layers)
    model = meta_model("CosmosTransformer3DModel", CosmosTransformer3DModel.load_config(folder / "base"))
    shards = sorted((folder / "run" / "checkpoints" / "iter_000000001" / "model").glob("*.distcp"))
    sources = {"nvidia": extract_source(repos["nvidia"], NVIDIA_SCRIPT, work / "reference-sources"),
               "diffusers": extract_source(repos["diffusers"], DIFFUSERS_SCRIPT, work / "reference-sources")}
    (folder / "base" / "reference-sources.json").write_text(json.dumps(sources))
    return {"release": str(folder / "run"), "weights": [str(path) for path in shards],
            "release_bytes": sum(path.stat().st_size for path in shards), "config_dir": str(folder / "base"),
            "parameters": parameter_count(model), "sources": sources}


# --------------------------------------------------------------------------------------------------------------
# The reference path: two processes, as NVIDIA documents it

def reference_export(run: Path, config_dir: Path, output: Path) -> None:
    """NVIDIA's convert_distcp_to_pt.py on the newest iteration's model/, then Diffusers' converter on its bf16 EMA
    file; each step a fresh process, as a user runs them (their intermediate files inside ``output``)."""
    sources = json.loads((config_dir / "reference-sources.json").read_text())
    iteration = (run / "checkpoints" / "latest_checkpoint.txt").read_text().strip()
    converted = output / "convert_distcp_to_pt"
    script = str(Path(__file__).resolve())
    steps = [[sys.executable, script, "--nvidia-step", sources["nvidia"]["path"],
              str(run / "checkpoints" / iteration / "model"), str(converted)],
             [sys.executable, script, "--diffusers-step", sources["diffusers"]["path"],
              str(converted / "model_ema_bf16.pt"), str(config_dir), str(output)]]
    converted.mkdir(parents=True, exist_ok=True)  # NVIDIA's script writes into an existing folder
    for step in steps:
        if subprocess.run(step).returncode != 0:
            raise click.ClickException(f"{shlex.join(step)} failed")


class _Positional:
    """tyro.conf.Positional[T]: T, the marking only tells tyro's parser the argument has no flag."""

    def __class_getitem__(cls, item):
        return item


def tyro_stand_in() -> types.ModuleType:
    """What convert_distcp_to_pt.py asks of tyro: ``conf.Positional[T]`` (read as T) and ``cli(Args)``, its two
    positional arguments from the command line and ``ema`` left at its default (True), as tyro parses them."""
    tyro = types.ModuleType("tyro")
    tyro.conf = types.SimpleNamespace(Positional=_Positional)
    tyro.cli = lambda cls, description=None: cls(input_dir=sys.argv[1], output_dir=Path(sys.argv[2]))
    return tyro


def run_nvidia_step(source: str, model_dir: str, output: str) -> None:
    try:
        import tyro  # noqa: F401
    except ImportError:
        sys.modules["tyro"] = tyro_stand_in()
    sys.argv = [source, model_dir, output]
    load_source(source, "convert_distcp_to_pt").main()


def run_diffusers_step(source: str, ema_bf16: str, config_dir: str, output: str) -> None:
    """The transformer steps of convert_cosmos_to_diffusers.py's main block, with its config table's block count
    set to the run's (the rest of its 2B config is Predict 2.5's, which the comparison of config.json checks)."""
    import torch

    converter = load_source(source, "convert_cosmos_to_diffusers")
    layers = json.loads((Path(config_dir) / "config.json").read_text())["num_layers"]
    converter.TRANSFORMER_CONFIGS[TRANSFORMER_TYPE]["num_layers"] = layers
    state_dict = converter.get_state_dict(torch.load(ema_bf16, map_location="cpu", weights_only=False))
    transformer = converter.convert_transformer(TRANSFORMER_TYPE, state_dict=state_dict, weights_only=False)
    transformer = transformer.to(dtype=torch.bfloat16)
    transformer.save_pretrained(output, safe_serialization=True, max_shard_size="5GB")


@click.command()
@click.option("--layers", type=click.IntRange(1, FULL_LAYERS), default=4, show_default=True)
@click.option("--nvidia-repo", type=click.Path(exists=True, path_type=Path), default=DEFAULT_REPOS["nvidia"],
              show_default=True, help="nvidia-cosmos/cosmos-predict2.5: a checkout or a git directory.")
@click.option("--diffusers-repo", type=click.Path(exists=True, path_type=Path), default=DEFAULT_REPOS["diffusers"],
              show_default=True, help="huggingface/diffusers: a checkout or a git directory.")
@click.option("--nvidia-step", nargs=3, default=None, hidden=True)
@click.option("--diffusers-step", nargs=4, default=None, hidden=True)
@benchmark_options
def main(layers: int, nvidia_repo: Path, diffusers_repo: Path, nvidia_step: tuple | None,
         diffusers_step: tuple | None, **options) -> None:
    if nvidia_step:
        return run_nvidia_step(*nvidia_step)
    if diffusers_step:
        return run_diffusers_step(*diffusers_step)
    depth = "at full depth" if layers == FULL_LAYERS else f"but NOT full depth: {layers} blocks (the model has 28)"
    repos = {"nvidia": nvidia_repo.resolve(), "diffusers": diffusers_repo.resolve()}
    FamilyBenchmark(
        script=Path(__file__).resolve(),
        size_args=["--layers", str(layers), "--nvidia-repo", str(repos["nvidia"]),
                   "--diffusers-repo", str(repos["diffusers"])],
        prepare=lambda work: prepare(work, layers, repos),
        reference=reference_export,
        title=f"Cosmos Predict 2.5 2B at full width (hidden 2048) {depth}",
        release_kind="imaginaire iteration (model/: net bf16 + net_ema fp32, FSDP2 2 ranks)",
        release_dtype="fp32",
        reference_label="NVIDIA convert_distcp_to_pt + Diffusers converter",
        cogexport_args=("--ema",),
    ).main(**options)


if __name__ == "__main__":
    main()
