"""Benchmark ``cogexport`` SAT -> Diffusers transformer export against the reference path, in one run.

    .venv/bin/python scripts/benchmark_export.py [--runs 3] [--work-dir .bench] [--json]
    .venv/bin/python scripts/benchmark_export.py --reference-path RUN_DIR OUT    # the reference path alone

Makes (once, cached in --work-dir) a full-size CogVideoX-2b SAT training run (~3.4 GB of random bf16 weights plus
a token T5 and VAE, as a fine-tuned SAT engine holds them), then exports its transformer to a bf16 Diffusers folder
with 5GB shards --runs times, alternating the two tools, each in a fresh process:

- cogexport: ``cogexport --model-type t2v RUN_DIR OUT --component transformer`` (streams one tensor at a time);
- the reference path: what the Diffusers SAT-to-Diffusers conversion script does (facts page, sections 3 and 8),
  written here from the facts: torch.load the whole file (mmap), rename in memory, build the fp32 model with random
  init, load_state_dict(strict=True), cast to bf16, save_pretrained.

After the first round both output folders are compared tensor by tensor (same keys and shapes; equal values,
with cogexport's fp32-kept norm tensors compared after rounding to bf16); any difference fails the benchmark.
Reported: median wall time, median peak RSS (the kernel's ru_maxrss of the child, via wait4), peak RSS as a
multiple of the fp32 model size (computed from the Diffusers model's parameter count), and ratios vs cogexport.
Timing is not a test: these machines are noisy, so only medians of several runs are quoted.
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import ROOT, SCRIPTS, measure, print_table, summarize  # noqa: E402

VARIANT = "2b"
SAT_PREFIX = "model.diffusion_model."
MODEL_STATES = "mp_rank_00_model_states.pt"

# --------------------------------------------------------------------------------------------------------------
# The reference path (runs in its own process)

# SAT name (after the prefix) -> Diffusers name; facts page section 3. qkv and adaLN are split separately below.
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
    (r"ofs_embed\.0\.", "ofs_embedding.linear_1."),
    (r"ofs_embed\.2\.", "ofs_embedding.linear_2."),
    (r"mixins\.patch_embed\.", "patch_embed."),
    (r"mixins\.pos_embed\.pos_embedding", "patch_embed.pos_embedding"),
    (r"mixins\.final_layer\.norm_final\.", "norm_out.norm."),
    (r"mixins\.final_layer\.linear\.", "proj_out."),
    (r"mixins\.final_layer\.adaLN_modulation\.1\.", "norm_out.linear."),
]
# Recomputed or unused by Diffusers: RoPE tables, SAT's token position table, word embeddings (facts page, section 2).
SAT_DROPPED = re.compile(
    r"mixins\.pos_embed\.freqs_(sin|cos)|transformer\.position_embeddings\.weight|.*embed_tokens.*"
)
QKV = re.compile(r"transformer\.layers\.(\d+)\.attention\.query_key_value\.(weight|bias)")
ADALN = re.compile(r"mixins\.adaln_layer\.adaLN_modulations\.(\d+)\.1\.(weight|bias)")
# SAT's 12 adaLN chunks are (shift, scale, gate) x (attention, MLP), then the same for the text stream; Diffusers'
# norm1 (attention) and norm2 (MLP) each take shift, scale, gate, text shift, text scale, text gate.
ADALN_GROUPS = {"norm1": (0, 1, 2, 6, 7, 8), "norm2": (3, 4, 5, 9, 10, 11)}


def sat_to_diffusers(module: dict) -> dict:
    import torch

    out = {}
    for key, tensor in module.items():
        if not key.startswith(SAT_PREFIX):
            continue  # the frozen T5 and VAE of a fine-tuned engine: filtered, never renamed
        name = key[len(SAT_PREFIX):]
        if SAT_DROPPED.fullmatch(name):
            continue
        if match := QKV.fullmatch(name):
            layer, part = match.groups()
            for proj, chunk in zip(("to_q", "to_k", "to_v"), tensor.chunk(3, dim=0)):
                out[f"transformer_blocks.{layer}.attn1.{proj}.{part}"] = chunk
        elif match := ADALN.fullmatch(name):
            layer, part = match.groups()
            chunks = tensor.chunk(12, dim=0)
            for norm, picks in ADALN_GROUPS.items():
                out[f"transformer_blocks.{layer}.{norm}.linear.{part}"] = torch.cat([chunks[c] for c in picks])
        else:
            for pattern, replacement in SAT_RENAMES:
                renamed, count = re.subn(f"^{pattern}", replacement, name)
                if count:
                    out[renamed] = tensor
                    break
            else:
                raise KeyError(f"SAT key with no Diffusers name: {name}")
    return out


def reference_load(run_dir: Path):
    """The fp32 model holding the run's weights; the SAT dicts go out of scope (are freed) on return."""
    import torch
    from diffusers import CogVideoXTransformer3DModel

    sys.path.insert(0, str(SCRIPTS))
    from cogvideox_tiny_configs import full_transformer_config

    tag = (run_dir / "latest").read_text().strip()
    # mmap=True as the Diffusers script does (no copy into anonymous memory; touched pages still count in RSS).
    # weights_only=False: SAT files pickle numpy RNG state (this one is our own generated file).
    checkpoint = torch.load(run_dir / tag / MODEL_STATES, map_location="cpu", mmap=True, weights_only=False)
    state_dict = sat_to_diffusers(checkpoint["module"])
    model = CogVideoXTransformer3DModel(**full_transformer_config(VARIANT))  # fp32, random init, as the script does
    model.load_state_dict(state_dict, strict=True)
    return model


def reference_export(run_dir: Path, output: Path) -> None:
    import torch

    model = reference_load(run_dir).to(torch.bfloat16)
    model.save_pretrained(output, max_shard_size="5GB")


# --------------------------------------------------------------------------------------------------------------
# Checking that both tools wrote the same tensors


def folder_tensors(folder: Path) -> dict[str, Path]:
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    if index.exists():
        return {key: folder / file for key, file in json.loads(index.read_text())["weight_map"].items()}
    from safetensors import safe_open

    single = folder / "diffusion_pytorch_model.safetensors"
    with safe_open(single, framework="pt") as handle:
        return {key: single for key in handle.keys()}


def compare_outputs(ours: Path, reference: Path) -> dict:
    """Streamed tensor-by-tensor comparison; raises on any difference. Returns counts for the report."""
    import torch
    from safetensors import safe_open

    ours_files, ref_files = folder_tensors(ours), folder_tensors(reference)
    problems = [f"only in cogexport: {k}" for k in sorted(ours_files.keys() - ref_files.keys())]
    problems += [f"only in reference: {k}" for k in sorted(ref_files.keys() - ours_files.keys())]
    ours_config, ref_config = (json.loads((f / "config.json").read_text()) for f in (ours, reference))
    for key in sorted(ours_config.keys() | ref_config.keys()):
        if not key.startswith("_") and ours_config.get(key) != ref_config.get(key):
            problems.append(f"config.json {key}: cogexport {ours_config.get(key)!r}, reference {ref_config.get(key)!r}")
    kept_fp32 = numel = 0
    handles = {}
    try:
        def tensor(path: Path, key: str) -> torch.Tensor:
            if path not in handles:
                handles[path] = safe_open(path, framework="pt")
            return handles[path].get_tensor(key)

        for key in sorted(ours_files.keys() & ref_files.keys()):
            a, b = tensor(ours_files[key], key), tensor(ref_files[key], key)
            numel += a.numel()
            if a.shape != b.shape:
                problems.append(f"{key}: shape {tuple(a.shape)} (cogexport) vs {tuple(b.shape)} (reference)")
            elif b.dtype != torch.bfloat16 or a.dtype not in (torch.bfloat16, torch.float32):
                problems.append(f"{key}: dtype {a.dtype} (cogexport) vs {b.dtype} (reference)")
            else:
                if a.dtype == torch.float32:
                    kept_fp32 += 1
                # The reference rounds everything to bf16; cogexport's fp32 norms must round to the same values.
                if not torch.equal(a.to(torch.bfloat16), b):
                    problems.append(f"{key}: values differ")
    finally:
        handles.clear()
    if problems:
        shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise click.ClickException(f"cogexport and the reference path wrote different models:\n  {shown}")
    return {"tensors": len(ours_files), "numel": numel, "kept_fp32": kept_fp32}


# --------------------------------------------------------------------------------------------------------------
# The benchmark


def helper(*args: str) -> dict:
    """Run this script's hidden helper mode in a child process (the harness never imports torch) and return the
    JSON it prints."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"{' '.join(args)} failed (its error is above)")
    return json.loads(done.stdout)


def prepare(work: Path) -> dict:
    """Make the SAT run (once) and count the model's parameters; runs in a helper process."""
    import torch
    from diffusers import CogVideoXTransformer3DModel

    sys.path.insert(0, str(SCRIPTS))
    from cogvideox_tiny_configs import full_transformer_config

    run_dir = work / f"bench-sat-{VARIANT}-full"
    marker = work / f"bench-sat-{VARIANT}-full.done"
    if not marker.exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        click.echo(f"making the full-size {VARIANT} SAT run in {run_dir} (~3.4 GB, under a minute)...", err=True)
        from make_sat_checkpoint import write_full_size_run

        write_full_size_run(run_dir, VARIANT)
        marker.write_text("")  # written last: marks the run complete
    with torch.device("meta"):  # shapes only, nothing allocated
        model = CogVideoXTransformer3DModel(**full_transformer_config(VARIANT))
    sat_file = run_dir / (run_dir / "latest").read_text().strip() / MODEL_STATES
    return {"run_dir": str(run_dir), "sat_file_bytes": sat_file.stat().st_size,
            "parameters": sum(p.numel() for p in model.parameters())}


def tools(run_dir: Path, work: Path) -> dict[str, tuple[list[str], Path]]:
    cogexport = str(Path(sys.executable).parent / "cogexport")
    ours, reference = work / "out-cogexport", work / "out-reference"
    return {
        "cogexport": ([cogexport, "--model-type", "t2v", str(run_dir), str(ours), "--component", "transformer"], ours),
        "reference path": ([sys.executable, str(Path(__file__).resolve()), "--reference-path", str(run_dir),
                            str(reference)], reference),
    }


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark run is made and kept, and outputs are written.")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--reference-path", nargs=2, type=click.Path(path_type=Path), default=None,
              metavar="RUN_DIR OUT", help="Only run the reference path (what the benchmark times).")
@click.option("--prepare", "prepare_only", is_flag=True, hidden=True)
@click.option("--compare", nargs=2, type=click.Path(path_type=Path), default=None, hidden=True)
def main(work_dir: Path, runs: int, as_json: bool, reference_path: tuple[Path, Path] | None, prepare_only: bool,
         compare: tuple[Path, Path] | None) -> None:
    if reference_path:
        reference_export(*reference_path)
        return
    if prepare_only:
        click.echo(json.dumps(prepare(work_dir)))
        return
    if compare:
        click.echo(json.dumps(compare_outputs(*compare)))
        return

    work_dir.mkdir(parents=True, exist_ok=True)
    setup = helper("--prepare", "--work-dir", str(work_dir))
    params, model_bytes = setup["parameters"], 4 * setup["parameters"]
    commands = tools(Path(setup["run_dir"]), work_dir)
    samples: dict[str, list[tuple[float, int]]] = {name: [] for name in commands}
    check = None
    for round_ in range(runs):
        for name, (command, output) in commands.items():
            shutil.rmtree(output, ignore_errors=True)
            samples[name].append(measure(command))
        if round_ == 0:  # check before spending time on more rounds
            check = helper("--compare", *(str(output) for _, output in commands.values()))
            if check["numel"] != params:
                raise click.ClickException(f"outputs hold {check['numel']} elements, the model has {params}")
    for _, output in commands.values():
        shutil.rmtree(output, ignore_errors=True)
    harness_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # a floor under every measurement

    results = summarize(samples, model_bytes)
    if as_json:
        click.echo(json.dumps({"variant": VARIANT, "parameters": params, "fp32_model_bytes": model_bytes,
                               "sat_file_bytes": setup["sat_file_bytes"], "harness_peak_rss_bytes": harness_rss,
                               "check": check, "results": results}, indent=2))
        return
    click.echo(f"CogVideoX-{VARIANT}: {params:,} parameters, fp32 model {model_bytes / 1e9:.2f} GB; SAT bf16 "
               f"({setup['sat_file_bytes'] / 1e9:.2f} GB file) -> Diffusers bf16, 5GB shards; median of {runs} runs")
    click.echo(f"outputs equal: {check['tensors']} tensors ({check['kept_fp32']} kept fp32 by cogexport); "
               f"harness peak RSS {harness_rss / 1e6:.0f} MB\n")
    print_table(results, "tool", 16, lambda row: row["tool"])

if __name__ == "__main__":
    main()
