"""Benchmark ``cogexport consolidate`` on a Megatron-Core ``torch_dist`` checkpoint beside megatron-core's own load
path and the I/O floor.

    .venv/bin/python scripts/benchmark_megatron.py [--runs 3] [--model bench|bench-small]

Makes (once, cached in --work-dir) a real Megatron-Core save: megatron-core's ``GPTModel`` (local layer spec, fp32)
at tensor parallelism 2 on two CPU gloo ranks, one Adam step, saved by ``dist_checkpointing.save`` with the Adam
states beside the model as Megatron-LM saves them (scripts/make_megatron_checkpoint.py's layout, at the size below;
the same two CUDA calls stood in for). Then:

    cogexport consolidate        iter_0000001 -> model.safetensors (per-layer names)
    megatron-core load           dist_checkpointing.load_plain_tensors(iter_0000001) in one gloo process, its model
                                 tensors saved with safetensors' save_file (stacked names): the way megatron-core
                                 itself reads a save without building the model
    I/O floor (dd), (kernel copy) the model's bytes read and written, nothing parsed

Megatron-Bridge's converter is the one Megatron users would run; it has no row: megatron-bridge 0.4 and later require
Python 3.12 (this venv is 3.11), and 0.3.1, the last for 3.11, was not tried against megatron-core 0.19.2.
Each output is first checked equal to cogexport's tensor by tensor (a stacked tensor against its layers), then every
tool runs --runs times, alternating, each in a fresh process (scripts/benchmarking.py: median wall time, peak PSS and
RSS of the process tree). Timing is not a test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarking import (ROOT, START, compile_cogexport_bytecode, floor_reads, floor_rows,  # noqa: E402
                          measure_tree, print_table, start_tool, summarize)

# (hidden size, layers, ffn size, vocabulary)
MODELS = {"bench": (768, 8, 3072, 16000), "bench-small": (256, 2, 1024, 4000)}
LOAD = "megatron-core load"


def rank_main(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    import warnings

    import torch
    from make_megatron_checkpoint import stand_in_cuda
    from tiny_training import gloo_group

    warnings.filterwarnings("ignore")
    stand_in_cuda()
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.optimizer import (get_param_id_to_sharded_param_map,
                                                            optim_state_to_sharding_state)
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    torch.manual_seed(1234)
    hidden, layers, ffn, vocab = MODELS[spec["model"]]
    with gloo_group(rendezvous, rank, world_size):
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
        config = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=8, ffn_hidden_size=ffn,
                                   use_cpu_initialization=True, params_dtype=torch.float32,
                                   tensor_model_parallel_size=world_size)
        model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=vocab, max_sequence_length=8,
                         share_embeddings_and_output_weights=False)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        (0.5 * sum((p * p).sum() for p in model.parameters())).backward()
        optimizer.step()
        model_state = model.sharded_state_dict()
        optimizer_state = optimizer.state_dict()
        step = next(iter(optimizer_state["state"].values()))["step"]
        optim_state_to_sharding_state(optimizer_state, get_param_id_to_sharded_param_map(model_state,
                                                                                         model.parameters()),
                                      exclude_keys="step")
        optimizer_state["state"]["common_step"] = step
        folder = Path(spec["out"]) / "run" / "iter_0000001"
        if rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        torch.distributed.barrier()
        dist_checkpointing.save({"checkpoint_version": 3.0, "iteration": 1, "model": model_state,
                                 "optimizer": optimizer_state}, str(folder))
        if rank == 0:
            (folder.parent / "latest_checkpointed_iteration.txt").write_text("1")
        parallel_state.destroy_model_parallel()


def make_checkpoint(folder: str, model: str) -> None:
    from tiny_training import launch

    launch(rank_main, folder, world_size=2, model=model)


def bench_checkpoint(work: Path, model: str) -> Path:
    """The save, made once per work dir in a process of its own (the ranks' launcher leaves a resource tracker
    behind, which the harness, reaping every process it started, would wait for)."""
    folder = work / f"megatron-{model}-tp2"
    if not (folder / "complete").exists():
        shutil.rmtree(folder, ignore_errors=True)
        click.echo(f"making the Megatron-Core {model} checkpoint...", err=True)
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                        f"from benchmark_megatron import make_checkpoint; make_checkpoint({str(folder)!r}, "
                        f"{model!r})"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (folder / "complete").write_text("")
    return folder / "run" / "iter_0000001"


# megatron-core's own reading of a save without its model, in one gloo process; its model tensors written out
MEGATRON_LOAD = r"""
import os, sys, tempfile, warnings
warnings.filterwarnings("ignore")
import torch
torch.cuda.synchronize = lambda *args, **kwargs: None  # as the save stands them in
torch.cuda.current_device = lambda: "cpu"
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
from megatron.core import dist_checkpointing
from safetensors.torch import save_file
tensors = dist_checkpointing.load_plain_tensors(sys.argv[1])
os.makedirs(sys.argv[2], exist_ok=True)
save_file({k: v.contiguous() for k, v in tensors.items() if isinstance(v, torch.Tensor)
           and not k.startswith(("optimizer.", "rng_state")) and "_extra_state" not in k},
          os.path.join(sys.argv[2], "model.safetensors"))
dist.destroy_process_group()
"""

COMPARE = r"""
import sys, torch
from safetensors.torch import load_file
ours, theirs = load_file(sys.argv[1]), load_file(sys.argv[2])
count = 0
for key, tensor in theirs.items():
    if ".layers." in key and not key.split(".layers.", 1)[1].split(".")[0].isdigit():  # stacked: [L, ...]
        before, after = key.split(".layers.", 1)
        parts = {f"{before}.layers.{n}.{after}": tensor[n] for n in range(tensor.shape[0])}
    else:
        parts = {key: tensor}
    for name, part in parts.items():
        assert torch.equal(ours.pop(name), part), name
        count += 1
assert not ours, sorted(ours)[:5]
print(count)
"""


def tools(checkpoint: Path, output: Path) -> dict[str, list[str]]:
    return {"cogexport consolidate": [str(Path(sys.executable).parent / "cogexport"), "consolidate", str(checkpoint),
                                      str(output), "--dtype", "fp32"],
            LOAD: [sys.executable, "-c", MEGATRON_LOAD, str(checkpoint), str(output)]}


def check_outputs_equal(checkpoint: Path, work: Path) -> tuple[int, int]:
    """Each tool once, its output compared with cogexport's; the tensors compared and cogexport's output size (the
    fp32 model: what the floor reads and writes)."""
    outputs = {}
    for name in tools(checkpoint, work):
        output = work / f"compare-{name.replace(' ', '-')}"
        shutil.rmtree(output, ignore_errors=True)
        subprocess.run(tools(checkpoint, output)[name], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        outputs[name] = output / "model.safetensors"
    done = subprocess.run([sys.executable, "-c", COMPARE, str(outputs["cogexport consolidate"]), str(outputs[LOAD])],
                          check=True, capture_output=True, text=True)
    size = outputs["cogexport consolidate"].stat().st_size
    for output in outputs.values():
        shutil.rmtree(output.parent, ignore_errors=True)
    return int(done.stdout.strip()), size


@click.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / ".bench",
              show_default=True, help="Where the benchmark checkpoint is made and kept.")
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--model", type=click.Choice(sorted(MODELS)), default="bench", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def main(work_dir: Path, runs: int, model: str, as_json: bool) -> None:
    checkpoint = bench_checkpoint(work_dir, model)
    compile_cogexport_bytecode()
    count, size = check_outputs_equal(checkpoint, work_dir)
    output = work_dir / "output"
    commands = tools(checkpoint, output)
    commands.update({name: command for name, (command, _) in
                     floor_rows(floor_reads(sorted(checkpoint.glob("*.distcp")), size), size, output).items()})
    commands[START] = start_tool(next(iter(commands.values())))
    samples: dict[str, list] = {}
    for _ in range(runs):
        for name, command in commands.items():
            shutil.rmtree(output, ignore_errors=True)
            samples.setdefault(name, []).append(measure_tree(command, dict(os.environ)))
    shutil.rmtree(output, ignore_errors=True)
    results = summarize(samples, size, model=model)
    if as_json:
        click.echo(json.dumps({"fp32_model_bytes": size, "tensors": count, "results": results}, indent=2))
        return
    on_disk = sum(p.stat().st_size for p in checkpoint.glob("*.distcp"))
    click.echo(f"{model}: fp32 model {size / 1e9:.2f} GB ({on_disk / 1e9:.2f} GB of .distcp files with the Adam "
               f"states), Megatron-Core torch_dist at TP 2; outputs equal: {count} tensors; median of {runs} runs")
    print_table(results, "tool", 26, lambda row: row["tool"])


if __name__ == "__main__":
    main()
