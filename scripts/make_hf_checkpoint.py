"""Make real saves of PyTorch's Hugging Face storage writer (``torch.distributed.checkpoint.HuggingFaceStorageWriter``)
on CPU gloo ranks, in every layout it writes, with ground truth.

    python scripts/make_hf_checkpoint.py OUT --model wan-t2v --world-size 3

MODEL is trained ``--steps`` steps under FSDP2 (``fully_shard`` per block, then the root: uneven dim-0 shards, and
empty ones where a tensor has fewer rows than there are ranks) with AdamW. After the last step the same sharded
state dict (``get_model_state_dict``: DTensors) is saved with ``dcp.save`` through the writer in each layout:

    OUT/distributed/     save_distributed=True: shard-{rank+1:05d}-model-00001-of-00001.safetensors per rank, each
                         holding that rank's pieces under the full names with their ``saved_offsets`` in the header
                         metadata entry DCP_SHARDING_INFO; no index, no .metadata
    OUT/mapping/         the same with fqn_to_index_mapping (the state dict cut into three runs of names): each rank
                         writes shard-R-model-K-of-00003.safetensors for K = 1..3
    OUT/lone/            a mapping putting the one-row ``scale_shift_table`` alone in file 2 (Wan): past 2 ranks, the
                         ranks beyond its row hold empty pieces at the same place, the writer keeps one of them, and
                         the others write no file 2 at all
    OUT/consolidated/    save_distributed=True, enable_consolidation=True: the per-rank files in sharded/, and
                         torch's consolidate_safetensors_files' model-00001-of-00001.safetensors + model.safetensors.
                         index.json beside it (not for the toy: torch's consolidator cannot take integer tensors)
    OUT/torchtitan/      a torchtitan run folder: checkpoint/step-1 a plain DCP save after step 1 (model keys at the
                         top level, optimizer flattened, train state), checkpoint/step-2 its last-step Hugging Face
                         save with a mapping: the per-rank files in step-2/sharded/, then
                         consolidate_safetensors_files_on_every_rank into step-2/ (as torchtitan's dcp_save does)

Ground truth (OUT/truth.safetensors, OUT/truth.json), gathered inside training after the last step with
``get_model_state_dict(full_state_dict=True)``, as scripts/make_dcp_checkpoint.py records it; truth.json's
"checkpoint" names the per-rank folder, "mapping" the fqn_to_index_mapping used.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_cpu import spawn_ranks  # noqa: E402
from make_dcp_checkpoint import build_model, mesh, record_truth, shard_fsdp2, training_loss  # noqa: E402

LAYOUTS = ("distributed", "mapping", "lone", "consolidated", "torchtitan")
LONE = "scale_shift_table"
MODELS = ("toy", "wan-t2v", "bench", "bench-small")  # bench: the ~1.9 GB model of scripts/benchmark_dcp.py


def name_mapping(names: list[str], files: int = 3) -> dict[str, int]:
    """fqn_to_index_mapping cutting the state dict into ``files`` runs of consecutive names (file indices from 1)."""
    return {name: 1 + position * files // len(names) for position, name in enumerate(names)}


def hf_save(state: dict, folder: Path, mapping: dict[str, int] | None = None, consolidate: bool = False) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    writer = HuggingFaceStorageWriter(str(folder), save_distributed=True, fqn_to_index_mapping=mapping,
                                      enable_consolidation=consolidate)
    dcp.save(state, storage_writer=writer)


def torchtitan_dcp_step(model, optimizer, folder: Path, step: int) -> None:
    """A torchtitan interval save: the model's keys at the top level, the optimizer flattened, the train state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
        get_optimizer_state_dict

    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    dcp.save({**get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer, options=flat),
              "train_state": {"step": step}}, checkpoint_id=str(folder))


def torchtitan_hf_step(state: dict, folder: Path, mapping: dict[str, int]) -> None:
    """torchtitan's last-step save in Hugging Face format with an adapter's mapping: per-rank files in sharded/, then
    every rank consolidates its share of the output files."""
    import torch.distributed as dist
    from torch.distributed.checkpoint._consolidate_hf_safetensors import \
        consolidate_safetensors_files_on_every_rank

    hf_save(state, folder / "sharded", mapping)
    dist.barrier()
    consolidate_safetensors_files_on_every_rank(input_dir=str(folder / "sharded"), output_dir=str(folder),
                                                fqn_to_index_mapping=mapping, num_threads=1)


def train_and_save(rank: int, world_size: int, rendezvous: str, spec: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world_size)
    try:
        plain = build_model(spec)
        if spec["model"].startswith("bench"):  # one FSDP unit per Linear: no rank ever gathers the whole 1.9 GB
            from torch.distributed.fsdp import fully_shard

            for layer in plain.layers:
                fully_shard(layer, mesh=mesh(world_size))
        model = shard_fsdp2(plain, spec, world_size)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        out = Path(spec["out"])
        for step in range(1, spec["steps"] + 1):
            training_loss(model, plain, spec, step, rank).backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == spec["steps"] - 1 and "torchtitan" in spec["layouts"]:
                torchtitan_dcp_step(model, optimizer, out / "torchtitan" / "checkpoint" / f"step-{step}", step)
        state = get_model_state_dict(model)
        mapping = name_mapping(list(state))
        for layout in spec["layouts"]:
            if layout == "torchtitan":
                torchtitan_hf_step(state, out / "torchtitan" / "checkpoint" / f"step-{spec['steps']}", mapping)
            elif layout == "lone":
                hf_save(state, out / layout, {name: 2 if name == LONE else 1 for name in state})
            else:
                hf_save(state, out / layout, mapping if layout == "mapping" else None, layout == "consolidated")
            dist.barrier()
        if spec["truth"]:
            record_truth(model, optimizer, plain, spec, rank, "distributed")
            if rank == 0:
                truth = json.loads((out / "truth.json").read_text())
                (out / "truth.json").write_text(json.dumps({**truth, "mapping": mapping,
                                                            "layouts": spec["layouts"]}, indent=1, default=str))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@click.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", type=click.Choice(MODELS), default="wan-t2v", show_default=True)
@click.option("--world-size", type=click.IntRange(1, 16), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=2, show_default=True, help="At least 2 for torchtitan.")
@click.option("--layout", "layouts", multiple=True, type=click.Choice(LAYOUTS),
              help="Layouts to write (repeatable; default: all the model allows).")
@click.option("--truth/--no-truth", default=True, show_default=True, help="Write truth.safetensors and truth.json.")
def main(out: Path, model: str, world_size: int, steps: int, layouts: tuple[str, ...], truth: bool) -> None:
    """Train MODEL a few steps on CPU ranks and save it through HuggingFaceStorageWriter in each layout, into OUT."""
    # torch's consolidator sizes elements with torch.finfo, so the toy's integer buffer cannot be consolidated; only
    # Wan has the one-row table
    allowed = {"toy": ("distributed", "mapping"), "wan-t2v": LAYOUTS}.get(model, ("distributed", "mapping",
                                                                                 "consolidated", "torchtitan"))
    layouts = layouts or allowed
    if not set(layouts) <= set(allowed):
        raise click.UsageError(f"--model {model} can be saved in {', '.join(allowed)} only")
    if "torchtitan" in layouts and steps < 2:
        raise click.UsageError("the torchtitan layout needs --steps 2 or more (step 1 is its plain DCP save)")
    out.mkdir(parents=True, exist_ok=True)
    spec = {"out": str(out.resolve()), "model": model, "world_size": world_size, "steps": steps,
            "layouts": list(layouts), "truth": truth, "writer": "hf-storage", "lora_rank": None, "compile": False}
    spawn_ranks(train_and_save, world_size, spec)
    click.echo(f"wrote {', '.join(str(out / layout) for layout in layouts)}", err=True)


if __name__ == "__main__":
    main()
