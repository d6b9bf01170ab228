"""Benchmark ``cogexport`` SAT -> Diffusers transformer export against the reference path, in one run.

    .venv/bin/python scripts/benchmark_export.py [--runs 3] [--layers 30] [--work-dir .bench] [--json]
    .venv/bin/python scripts/benchmark_export.py --reference-path RUN_DIR OUT [--layers N]   # the reference alone

Makes (once, cached in --work-dir) a CogVideoX-2b SAT training run (full size: ~3.4 GB of random bf16 weights, with
SAT's frozen 2B position table and a token T5 and VAE, as a fine-tuned SAT engine holds them). Its transformer is
written from Diffusers-named weights, each drawn from a generator seeded by its name, through the hand-written
Diffusers-to-SAT writer (make_sat_checkpoint.py): those weights are the ground truth, and the check regenerates
them name by name, so nothing holds the whole model to check it. ``--layers 2`` keeps the 2B width with fewer
layers (exported with ``--base``, being no published size), to try the benchmark quickly.

The two tools export the transformer to a bf16 Diffusers folder with 5GB shards:

- cogexport: ``cogexport --model-type t2v RUN_DIR OUT --component transformer`` (streams one tensor at a time);
- the reference path: ``convert_transformer`` of Diffusers' scripts/convert_cogvideox_to_diffusers.py step for
  step, written here from what it does: torch.load the whole file (mmap=True), build CogVideoXTransformer3DModel
  (fp32, random init) and cast it with .to(bfloat16), rename the state dict in place (q/k/v chunked, adaLN
  regrouped, RoPE tables and token embeddings dropped), load_state_dict(strict=True), save_pretrained
  (safe_serialization, max_shard_size="5GB"). With the three changes a real SAT training file needs before that
  script accepts it (../shared/fixtures/sat-real/README.md): weights_only=False, only model.diffusion_model.* passed
  in, and the 2B position table dropped.

First, untimed, each tool exports once and its output is checked against the ground truth: every tensor of the
Diffusers model, nothing else, equal (torch.equal) to the truth in the dtype the tool must write (the reference
path: all bf16; cogexport: bf16, and fp32 for exactly the LayerNorm parameters, found from the model's modules),
and config.json equal to the model's config; any difference fails the benchmark before anything is timed. Then
each tool runs --runs times, alternating, each in a fresh process. Reported: median wall time, median peak memory
of the tool's whole process tree (benchmarking.py says how it is sampled), as a multiple of the fp32 model size
(from the Diffusers model's parameter count), and ratios vs cogexport.
Timing is not a test: these machines are noisy, so only medians of several runs are quoted.
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import sys
import zlib
from collections import OrderedDict
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import (NO_CACHE, ROOT, START, WORKERS_1, check_variants_identical, floor_reads,  # noqa: E402
                          floor_rows, goal_lines, measure_tree, print_scaling, print_table, retarget, run_json,
                          scaling_tools, start_tool, summarize, time_alternately, tree_bytes, with_workers,
                          without_diffusers_cache)

VARIANT, FULL_LAYERS = "2b", 30
SAT_PREFIX = "model.diffusion_model."
MODEL_STATES = "mp_rank_00_model_states.pt"
ITERATION = 1000


class TruthMismatch(Exception):
    """An exported folder differs from the ground truth; the message lists how."""


def transformer_config(layers: int) -> dict:
    from cogvideox_tiny_configs import full_transformer_config

    return full_transformer_config(VARIANT, layers)


def meta_model(config: dict):
    """The Diffusers transformer on the meta device: names, shapes and module types, nothing allocated."""
    import torch
    from diffusers import CogVideoXTransformer3DModel

    with torch.device("meta"):
        return CogVideoXTransformer3DModel(**config)


def truth_tensor(name: str, shape):
    """The ground truth of one Diffusers tensor: N(0, 0.02) in bf16 from a generator seeded by its name."""
    import torch

    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.empty(shape, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=generator)


def layer_norm_parameters(model) -> set[str]:
    """Every parameter of a LayerNorm: what cogexport must keep in fp32 in a CogVideoX-2b transformer (README)."""
    import torch

    return {f"{module_name}.{name}" for module_name, module in model.named_modules()
            if isinstance(module, torch.nn.LayerNorm) for name, _ in module.named_parameters(recurse=False)}


# --------------------------------------------------------------------------------------------------------------
# The benchmark's SAT run (made once, in a helper process)


def write_run(run_dir: Path, config: dict) -> None:
    """The SAT run whose transformer holds the ground truth; peak memory about 1.4 copies of the bf16 weights."""
    import torch

    from make_sat_checkpoint import (SAT_T5_PREFIX, SAT_VAE_PREFIX, diffusers_to_sat_transformer,
                                     droppable_sat_keys, fake_sat_vae_state_dict, fake_t5_state_dict,
                                     save_model_states)

    shapes = {name: tensor.shape for name, tensor in meta_model(config).state_dict().items()}
    module = OrderedDict((SAT_PREFIX + key, tensor) for key, tensor in diffusers_to_sat_transformer(
        {name: truth_tensor(name, shape) for name, shape in shapes.items()}).items())
    generator = torch.Generator().manual_seed(1)
    hidden, head_dim = config["num_attention_heads"] * config["attention_head_dim"], config["attention_head_dim"]
    # SAT keeps CogVideoX 1.0's sin-cos position table as a frozen parameter: (latent frames x patches + text) rows.
    rows = ((config["sample_frames"] - 1) // config["temporal_compression_ratio"] + 1) * \
        (config["sample_height"] // config["patch_size"]) * (config["sample_width"] // config["patch_size"]) + \
        config["max_text_seq_length"]
    module[SAT_PREFIX + "mixins.pos_embed.pos_embedding"] = torch.randn(1, rows, hidden, generator=generator)
    for prefix, extras in [(SAT_PREFIX, droppable_sat_keys(hidden, head_dim, generator)),
                           (SAT_T5_PREFIX, fake_t5_state_dict(generator)),
                           (SAT_VAE_PREFIX, fake_sat_vae_state_dict(generator))]:
        module.update((prefix + key, tensor) for key, tensor in extras.items())
    module = OrderedDict((key, tensor.to(torch.bfloat16)) for key, tensor in module.items())
    save_model_states(run_dir / str(ITERATION), module, ITERATION)
    (run_dir / "latest").write_text(str(ITERATION))


def prepare(work: Path, layers: int) -> dict:
    """Make the SAT run (once) and, below full size, the --base config folder cogexport needs."""
    name = f"bench-sat-{VARIANT}-{'full' if layers == FULL_LAYERS else f'{layers}layers'}"
    run_dir, marker, base = work / name, work / f"{name}.done", work / f"{name}-base"
    if not marker.exists() or not run_dir.is_dir():  # a marker left by a run since removed is no run
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        click.echo(f"making the {VARIANT} SAT run with {layers} layers in {run_dir} (full size: ~3.4 GB, about a "
                   "minute)...", err=True)
        write_run(run_dir, transformer_config(layers))
        if layers != FULL_LAYERS:
            meta_model(transformer_config(layers)).save_config(base)
        marker.write_text("")  # written last: marks the run complete
    model = meta_model(transformer_config(layers))
    return {"run_dir": str(run_dir), "base": str(base) if layers != FULL_LAYERS else None,
            "sat_file_bytes": (run_dir / str(ITERATION) / MODEL_STATES).stat().st_size,
            "parameters": sum(p.numel() for p in model.parameters())}


# --------------------------------------------------------------------------------------------------------------
# The reference path (runs in its own process)

# SAT name (after the prefix) -> Diffusers name; facts page section 3. q/k/v and adaLN are split separately below.
SAT_RENAMES = [
    (r"transformer\.layers\.(\d+)\.input_layernorm\.", r"transformer_blocks.\1.norm1.norm."),
    (r"transformer\.layers\.(\d+)\.attention\.dense\.", r"transformer_blocks.\1.attn1.to_out.0."),
    (r"transformer\.layers\.(\d+)\.post_attention_layernorm\.", r"transformer_blocks.\1.norm2.norm."),
    (r"transformer\.layers\.(\d+)\.mlp\.dense_h_to_4h\.", r"transformer_blocks.\1.ff.net.0.proj."),
    (r"transformer\.layers\.(\d+)\.mlp\.dense_4h_to_h\.", r"transformer_blocks.\1.ff.net.2."),
    (r"mixins\.adaln_layer\.query_layernorm_list\.(\d+)\.", r"transformer_blocks.\1.attn1.norm_q."),
    (r"mixins\.adaln_layer\.key_layernorm_list\.(\d+)\.", r"transformer_blocks.\1.attn1.norm_k."),
    (r"transformer\.final_layernorm\.", "norm_final."),
    (r"time_embed\.0\.", "time_embedding.linear_1."),
    (r"time_embed\.2\.", "time_embedding.linear_2."),
    (r"mixins\.patch_embed\.", "patch_embed."),
    (r"mixins\.final_layer\.norm_final\.", "norm_out.norm."),
    (r"mixins\.final_layer\.linear\.", "proj_out."),
    (r"mixins\.final_layer\.adaLN_modulation\.1\.", "norm_out.linear."),
]
# Dropped: RoPE tables, SAT's token position table, word embeddings (what the script drops), and the 2B position
# table, which Diffusers rebuilds (the change a real 2B SAT file needs).
SAT_DROPPED = re.compile(
    r"mixins\.pos_embed\.freqs_(sin|cos)|transformer\.position_embeddings\.weight|.*embed_tokens.*"
    r"|mixins\.pos_embed\.pos_embedding"
)
QKV = re.compile(r"transformer\.layers\.(\d+)\.attention\.query_key_value\.(weight|bias)")
ADALN = re.compile(r"mixins\.adaln_layer\.adaLN_modulations\.(\d+)\.1\.(weight|bias)")
# SAT's 12 adaLN chunks are (shift, scale, gate) x (attention, MLP), then the same for the text stream; Diffusers'
# norm1 (attention) and norm2 (MLP) each take shift, scale, gate, text shift, text scale, text gate.
ADALN_GROUPS = {"norm1": (0, 1, 2, 6, 7, 8), "norm2": (3, 4, 5, 9, 10, 11)}


def rename_in_place(state_dict: dict) -> None:
    """SAT names to Diffusers names, in the loaded dict itself, as the script does."""
    import torch

    for key in list(state_dict):
        tensor = state_dict.pop(key)
        if not key.startswith(SAT_PREFIX):
            continue  # the frozen T5 and VAE of a fine-tuned engine: not passed to the script
        name = key[len(SAT_PREFIX):]
        if SAT_DROPPED.fullmatch(name):
            continue
        if match := QKV.fullmatch(name):
            layer, part = match.groups()
            for proj, chunk in zip(("to_q", "to_k", "to_v"), tensor.chunk(3, dim=0)):
                state_dict[f"transformer_blocks.{layer}.attn1.{proj}.{part}"] = chunk
        elif match := ADALN.fullmatch(name):
            layer, part = match.groups()
            chunks = tensor.chunk(12, dim=0)
            for norm, picks in ADALN_GROUPS.items():
                state_dict[f"transformer_blocks.{layer}.{norm}.linear.{part}"] = torch.cat([chunks[c] for c in picks])
        else:
            for pattern, replacement in SAT_RENAMES:
                renamed, count = re.subn(f"^{pattern}", replacement, name)
                if count:
                    state_dict[renamed] = tensor
                    break
            else:
                raise KeyError(f"SAT key with no Diffusers name: {name}")


def reference_export(run_dir: Path, output: Path, config: dict) -> None:
    import torch
    from diffusers import CogVideoXTransformer3DModel

    def convert_transformer():  # its locals (the state dict, the mapped file) are freed on return, as in the script
        tag = (run_dir / "latest").read_text().strip()
        # weights_only=False: SAT files pickle numpy RNG state (this one is the benchmark's own file).
        state_dict = torch.load(run_dir / tag / MODEL_STATES, map_location="cpu", mmap=True,
                                weights_only=False)["module"]
        transformer = CogVideoXTransformer3DModel(**config).to(dtype=torch.bfloat16)
        rename_in_place(state_dict)
        transformer.load_state_dict(state_dict, strict=True)
        return transformer

    convert_transformer().save_pretrained(output, safe_serialization=True, max_shard_size="5GB")


# --------------------------------------------------------------------------------------------------------------
# Checking an exported folder against the ground truth


def folder_tensors(folder: Path) -> dict[str, Path]:
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    if index.exists():
        return {key: folder / file for key, file in json.loads(index.read_text())["weight_map"].items()}
    from safetensors import safe_open

    single = folder / "diffusion_pytorch_model.safetensors"
    with safe_open(single, framework="pt") as handle:
        return {key: single for key in handle.keys()}


def check_export(folder: Path, config: dict, all_bf16: bool) -> dict:
    """Every tensor of ``folder`` against the ground truth, one at a time; raises TruthMismatch on any difference.
    ``all_bf16``: the reference path casts everything; cogexport keeps exactly the LayerNorm parameters in fp32."""
    import torch
    from safetensors import safe_open

    model = meta_model(config)
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    kept = set() if all_bf16 else layer_norm_parameters(model)
    files = folder_tensors(folder)
    problems = [f"{name}: missing" for name in shapes if name not in files]
    problems += [f"{name}: not in the model" for name in files if name not in shapes]
    config = json.loads((folder / "config.json").read_text())
    for key, value in model.config.items():
        if not key.startswith("_") and config.get(key) != value:
            problems.append(f"config.json {key}: {config.get(key)!r}, the model's is {value!r}")
    handles = {}
    try:
        for name in sorted(shapes.keys() & files.keys()):
            if files[name] not in handles:
                handles[files[name]] = safe_open(files[name], framework="pt")
            got = handles[files[name]].get_tensor(name)
            dtype = torch.float32 if name in kept else torch.bfloat16
            if got.dtype != dtype:
                problems.append(f"{name}: dtype {got.dtype}, expected {dtype}")
            elif got.shape != shapes[name]:
                problems.append(f"{name}: shape {tuple(got.shape)}, expected {tuple(shapes[name])}")
            elif not torch.equal(got, truth_tensor(name, shapes[name]).to(dtype)):
                problems.append(f"{name}: values differ from the ground truth")
    finally:
        handles.clear()
    if problems:
        raise TruthMismatch(f"{folder} differs from the ground truth in {len(problems)} place(s): "
                            + "; ".join(problems[:10]) + (" ..." if len(problems) > 10 else ""))
    return {"tensors": len(files), "kept_fp32": len(kept), "numel": sum(s.numel() for s in shapes.values())}


# --------------------------------------------------------------------------------------------------------------
# The benchmark


def helper(*args: str) -> dict:
    """This script's hidden helper modes, in a child process (the harness never imports torch); their JSON."""
    return run_json([sys.executable, str(Path(__file__).resolve()), *args])


def tools(setup: dict, work: Path, layers: int) -> dict[str, tuple[list[str], Path]]:
    cogexport = str(Path(sys.executable).parent / "cogexport")
    ours, reference = work / "out-cogexport", work / "out-reference"
    base = ["--base", setup["base"]] if setup["base"] else []
    return {
        "cogexport": ([cogexport, "--model-type", "t2v", setup["run_dir"], str(ours), "--component", "transformer",
                       *base], ours),
        "reference path": ([sys.executable, str(Path(__file__).resolve()), "--reference-path", setup["run_dir"],
                            str(reference), "--layers", str(layers)], reference),
    }


def with_floor_and_scaling(commands: dict, setup: dict, work: Path, params: int,
                           scaling: bool) -> tuple[dict, dict, dict]:
    """The main rows with cogexport --workers 1 and the I/O floor beside the tools, and the scaling table's runs,
    each first checked (untimed) to write the same bytes as cogexport's output, which is then removed."""
    ours_command, ours_output = commands["cogexport"]
    written = tree_bytes(ours_output)
    read = 2 * params  # the transformer's bf16 bytes in the SAT file
    sat_file = Path(setup["run_dir"]) / str(ITERATION) / MODEL_STATES
    workers_1 = with_workers(retarget(ours_command, ours_output, work / "out-w1"), 1)
    uncached = without_diffusers_cache(retarget(ours_command, ours_output, work / "out-uncached"))
    main_rows = {"cogexport": commands["cogexport"], WORKERS_1: (workers_1, work / "out-w1"),
                 NO_CACHE: (uncached, work / "out-uncached"),
                 **floor_rows(floor_reads([sat_file], read), written, work / "out-floor"),
                 START: (start_tool(ours_command), work / "out-start"),
                 "reference path": commands["reference path"]}
    variants = scaling_tools(ours_command, ours_output, work / "out-scaling") if scaling else {}
    check_variants_identical({WORKERS_1: main_rows[WORKERS_1], NO_CACHE: main_rows[NO_CACHE], **variants},
                             ours_output)
    shutil.rmtree(ours_output, ignore_errors=True)
    return main_rows, variants, {"read_bytes": read, "written_bytes": written}


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark run is made and kept, and outputs are written.")
@click.option("--scaling/--no-scaling", default=True, show_default=True,
              help="Also time the scaling table (workers 1, 2, all cores; torchrun 1, 2 processes).")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--layers", type=click.IntRange(1, FULL_LAYERS), default=FULL_LAYERS, show_default=True,
              help="Transformer layers at the 2B width (fewer: to try the benchmark quickly).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--reference-path", nargs=2, type=click.Path(path_type=Path), default=None,
              metavar="RUN_DIR OUT", help="Only run the reference path (what the benchmark times).")
@click.option("--prepare", "prepare_only", is_flag=True, hidden=True)
@click.option("--check", type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--all-bf16", is_flag=True, hidden=True)
def main(work_dir: Path, scaling: bool, runs: int, layers: int, as_json: bool,
         reference_path: tuple[Path, Path] | None, prepare_only: bool, check: Path | None, all_bf16: bool) -> None:
    if reference_path:
        reference_export(*reference_path, transformer_config(layers))
        return
    if prepare_only:
        click.echo(json.dumps(prepare(work_dir, layers)))
        return
    if check:
        try:
            click.echo(json.dumps(check_export(check, transformer_config(layers), all_bf16)))
        except TruthMismatch as mismatch:
            raise click.ClickException(str(mismatch)) from None
        return

    work_dir.mkdir(parents=True, exist_ok=True)
    setup = helper("--prepare", "--work-dir", str(work_dir), "--layers", str(layers))
    params, model_bytes = setup["parameters"], 4 * setup["parameters"]
    commands = tools(setup, work_dir, layers)
    checks = {}
    for name, (command, output) in commands.items():  # untimed: each output checked before anything is timed
        shutil.rmtree(output, ignore_errors=True)
        measure_tree(command)
        checks[name] = helper("--check", str(output), "--layers", str(layers),
                              *(["--all-bf16"] if name == "reference path" else []))
    commands, variants, floor = with_floor_and_scaling(commands, setup, work_dir, params, scaling)
    samples = time_alternately(commands, runs)
    scaled = summarize(time_alternately(variants, runs), model_bytes) if variants else []
    harness_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not part of any measurement

    results = summarize(samples, model_bytes)
    goals = goal_lines(results, ["reference path"])
    if as_json:
        click.echo(json.dumps({"variant": VARIANT, "layers": layers, "parameters": params,
                               "fp32_model_bytes": model_bytes, "sat_file_bytes": setup["sat_file_bytes"],
                               "harness_peak_rss_bytes": harness_rss, "checks": checks, "io_floor": floor,
                               "results": results, "scaling": scaled, "goals": goals}, indent=2))
        return
    report(setup, layers, runs, checks, floor, harness_rss, results, goals, scaled)


def report(setup: dict, layers: int, runs: int, checks: dict, floor: dict, harness_rss: int, results: list,
           goals: list, scaled: list) -> None:
    params, model_bytes = setup["parameters"], 4 * setup["parameters"]
    click.echo(f"CogVideoX-{VARIANT} width, {layers} layers: {params:,} parameters, fp32 model {model_bytes / 1e9:.2f} "
               f"GB; SAT bf16 ({setup['sat_file_bytes'] / 1e9:.2f} GB file) -> Diffusers bf16, 5GB shards; median of "
               f"{runs} runs")
    click.echo(f"every tool's output: all {checks['cogexport']['tensors']} tensors equal the ground truth (the weights "
               f"the SAT run was written from): the reference path's in bf16, cogexport's in bf16 but for the "
               f"{checks['cogexport']['kept_fp32']} LayerNorm tensors it keeps in fp32; every --workers and torchrun "
               f"run wrote the same bytes as cogexport's; harness peak RSS {harness_rss / 1e6:.0f} MB")
    click.echo(f"I/O floor: dd reads {floor['read_bytes'] / 1e9:.2f} GB of the SAT file (the transformer's bytes) and "
               f"writes {floor['written_bytes'] / 1e9:.2f} GB (cogexport's output size)\n")
    print_table(results, "tool", 23, lambda row: row["tool"])
    for line in goals:
        click.echo(line)
    if scaled:
        print_scaling(scaled)


if __name__ == "__main__":
    main()
