"""Megatron-Core torch_dist checkpoints as an input (issue 42, item 1).

The run: scripts/make_megatron_checkpoint.py trains megatron-core's own tiny GPTModel at TP=2 x PP=2 on four gloo
ranks and saves iterations 5 and 10 with megatron-core's dist_checkpointing.save (optimizer states and RNG states
beside the model, the common state inside the DCP save); every tensor is gathered whole inside the ranks before each
save. Consolidate must give exactly those, layer by layer (fp32, torch.equal), and never an optimizer's state."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from megatron_fixtures import megatron_bridge_wan, megatron_run
from safetensors.torch import load_file

from cogexport import open_checkpoint


def consolidated(cli, out: Path, *args) -> dict:
    result = cli("consolidate", *args, out)
    assert result.exit_code == 0, result.stderr
    return load_file(out / "model.safetensors")


def test_the_run_folder_reads_the_iteration_its_tracker_names_layer_by_layer_and_no_optimizer_state(cli, tmp_path):
    run = megatron_run()
    result = cli("consolidate", run.run, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "iter_0000010, the iteration latest_checkpointed_iteration.txt names" in result.stderr
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert_same_tensors(written, run.per_layer(10))
    assert "decoder.layers.3.self_attention.linear_qkv.weight" in written  # a stacked key, unstacked
    assert not any(name.startswith(("optimizer", "rng_state", "common_state")) or "_extra_state" in name
                   for name in written)


def test_tag_and_an_iteration_folder_read_that_iteration(cli, tmp_path):
    run = megatron_run()
    assert_same_tensors(consolidated(cli, tmp_path / "tagged", run.run, "--tag", "iter_0000005"), run.per_layer(5))
    assert_same_tensors(consolidated(cli, tmp_path / "folder", run.iteration(5)), run.per_layer(5))


def test_inspect_says_what_each_key_set_is(cli):
    run = megatron_run()
    report = json.loads(cli("inspect", run.run, "--json").stdout)
    assert report["format"] == "megatron" and report["step"] == 10 and report["world_size"] == 4
    assert report["tags"] == ["iter_0000005", "iter_0000010"] and report["sharded_backend"] == "torch_dist v1"
    held = " ".join(report["contents"])
    for phrase in ("optimizer state (never weights)", "RNG states (never weights)", "common state", "_extra_state",
                   "exp_avg, exp_avg_sq"):
        assert phrase in held, held


def test_one_layer_is_read_alone(tmp_path):
    """A stacked tensor's layer is read from the chunks holding that layer: the bytes read are its own."""
    run = megatron_run()
    checkpoint = open_checkpoint(run.run)
    name = "decoder.layers.2.mlp.linear_fc2.weight"
    tensor = checkpoint[name].load()
    assert tensor.shape == run.per_layer(10)[name].shape and bool((tensor == run.per_layer(10)[name]).all())
    assert sum(checkpoint.bytes_read().values()) == tensor.numel() * tensor.element_size()


# -- bad input: one line, exit 2, nothing written ---------------------------------------------------------------
def copied_run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(megatron_run().run, tmp_path / "run"))


def test_a_missing_rank_file_and_a_damaged_metadata_are_refused(cli, tmp_path):
    run = copied_run(tmp_path)
    (run / "iter_0000010" / "__3_0.distcp").unlink()
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], "rank 3's file __3_0.distcp is missing",
                   inputs=[run])
    metadata = run / "iter_0000005" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:-200])
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out", "--tag", "iter_0000005"], ".metadata",
                   "corrupt", inputs=[run])


def test_a_tracker_naming_no_iteration_and_a_dcp_save_labelled_zarr_are_refused(cli, tmp_path):
    run = copied_run(tmp_path)
    (run / "latest_checkpointed_iteration.txt").write_text("20")
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], "names iter_0000020",
                   "iter_0000005, iter_0000010", inputs=[run])
    (run / "iter_0000005" / "metadata.json").write_text('{"sharded_backend": "zarr", "sharded_backend_version": 1}')
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out", "--tag", "iter_0000005"],
                   "names the zarr backend, but it holds no zarr array",
                   inputs=[run])


# -- a Wan trained through Megatron-Bridge: its names and per-head fused projections to Diffusers' ------------------
def test_a_megatron_bridge_wan_exports_to_exactly_the_diffusers_weights_and_diffusers_loads_them(cli, tmp_path):
    from diffusers import WanTransformer3DModel

    run = megatron_bridge_wan()
    result = cli(run.run, tmp_path / "out", "--base", run.base(tmp_path / "base"), "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    # q, k, v and k, v come apart per head: a split into thirds or halves would have these shapes and other values
    assert_same_tensors(load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors"), run.tensors)
    assert_same_tensors(WanTransformer3DModel.from_pretrained(tmp_path / "out").state_dict(), run.tensors)


def test_a_megatron_bridge_run_consolidates_its_model_alone(cli, tmp_path):
    """The bridge's train_state.pt files are training state beside the weights, not a second set of them; the
    optimizer's states and each layer's _extra_state are never written."""
    written = consolidated(cli, tmp_path / "out", megatron_bridge_wan().run)
    assert "decoder.layers.1.full_self_attention.linear_qkv.weight" in written and "head.modulation" in written
    assert not any(name.startswith(("module.", "optimizer")) or "_extra_state" in name for name in written)


def test_a_save_plan_that_would_run_code_is_refused_and_never_runs(cli, tmp_path):
    """The allowlist takes Megatron-Core's saved plans as inert records, and nothing else hidden among them."""
    import pickle

    import torch.distributed.checkpoint as dcp
    from test_dcp_bad_input import RunsCode

    run, marker = copied_run(tmp_path), tmp_path / "payload-ran"
    folder = run / "iter_0000010"
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    metadata.all_local_plans[0].items.append(RunsCode(marker))
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], ".metadata", "posix.system",
                   "would run code", inputs=[run])
    assert not marker.exists()


def test_the_bridge_table_run_backwards_gives_the_bridges_layout_again(cli, tmp_path):
    """Diffusers' weights through the table inverted are the tensors the bridge's layout saved (its per-head fusing
    included), layer by layer as the reader hands them out."""
    from cogexport.keymap.plan import plan_translation
    from cogexport.keymap.table import load_table
    from cogexport.lazy import LazyTensor

    run = megatron_bridge_wan()
    source = {name: LazyTensor(t.shape, t.dtype, lambda t=t: t, name) for name, t in run.tensors.items()}
    counts = {"num_attention_heads": run.truth["config"]["num_attention_heads"]}
    plan = plan_translation(load_table("wan/megatron_bridge_transformer").inverted(), source, None, counts)
    assert_same_tensors({name: tensor.load() for name, tensor in plan.tensors.items()},
                        consolidated(cli, tmp_path / "out", run.run))


def test_an_older_iteration_with_common_pt_beside_it_reads_the_same_weights(cli, tmp_path):
    """Megatron-Core before the common state moved into the DCP save wrote it to common.pt: training state beside the
    weights, never read (nor taken for a second set of weights)."""
    import torch

    run = megatron_run()
    folder = Path(shutil.copytree(run.iteration(5), tmp_path / "iter_0000005"))
    torch.save({"iteration": 5, "checkpoint_version": 3.0}, folder / "common.pt")
    assert_same_tensors(consolidated(cli, tmp_path / "out", folder), run.per_layer(5))
    report = json.loads(cli("inspect", folder, "--json").stdout)
    assert any("common.pt" in held for held in report["contents"]), report["contents"]


def _refiled(folder: Path, refile) -> None:
    """The iteration's .metadata re-pickled with keys filed under others (``refile``: its keys -> {old: new}), the
    bytes untouched."""
    import dataclasses
    import pickle

    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    paths = refile(list(metadata.state_dict_metadata))
    metadata.state_dict_metadata = {paths.get(k, k): v for k, v in metadata.state_dict_metadata.items()}
    metadata.storage_data = {dataclasses.replace(i, fqn=paths.get(i.fqn, i.fqn)): where
                             for i, where in metadata.storage_data.items()}
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize("refile, named", [
    (lambda keys: {k: f"ema.{k}" for k in keys if not k.startswith(("optimizer", "rng_state", "common_state"))},
     "the optimizer holds state for 'embedding.word_embeddings.weight'"),
    (lambda keys: {"optimizer.state.exp_avg.output_layer.weight": "output_layer.weight.exp_avg"},
     "'output_layer.weight.exp_avg' is filed under its tensor 'output_layer.weight'")],
    ids=["the model under ema", "an optimizer state as a weight"])
def test_key_sets_filed_under_the_wrong_kind_are_refused(refile, named, cli, tmp_path):
    """The model moved under a group Megatron never saves, or an optimizer state among the model's keys: written as
    the model, either would be wrong; the optimizer's own keys and the module tree give it away."""
    run = copied_run(tmp_path)
    folder = run / "iter_0000010"
    _refiled(folder, refile)
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], named, inputs=[run])


def test_a_megatron_bridge_wan_exported_under_torchrun_is_exactly_the_diffusers_weights(tmp_path):
    """Two ranks launched by torch's own launcher, each writing its share of the files (small shards: more files
    than ranks), read from the bridge's TP=2 iteration: exactly the model, nothing left staged."""
    from conftest import leftovers
    from test_torchrun import torchrun

    run = megatron_bridge_wan()
    done = torchrun(2, run.run, tmp_path / "out", "--base", run.base(tmp_path / "base"), "--dtype", "fp32",
                    "--max-shard-size", "40KB")
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted((tmp_path / "out").glob("*.safetensors"))
    assert len(files) >= 3, files
    assert_same_tensors({name: t for file in files for name, t in load_file(file).items()}, run.tensors)
    assert leftovers(tmp_path) == []


# -- a bf16 run's fp32 masters (optimizer.state.fp32_param.*): what the optimizer stepped, read as the weights ------
def test_a_bf16_run_consolidates_to_its_fp32_masters_and_says_so(cli, tmp_path):
    """Each trained bf16 parameter's fp32 master, bit for bit; the norms' fp32 weights (their own masters) and the
    frozen bf16 output layer (never stepped, no master) as saved; the note names which is which."""
    from megatron_fixtures import megatron_bf16_run

    run = megatron_bf16_run()
    result = cli("consolidate", run.run, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    masters, saved = run.per_layer("master."), run.per_layer("model.")
    expected = {name: masters.get(name, tensor.float()) for name, tensor in saved.items()}
    assert_same_tensors(load_file(tmp_path / "out" / "model.safetensors"), expected)
    assert masters and all(not torch.equal(masters[n], saved[n].float()) for n in masters)  # finer than bf16
    assert "read the fp32 masters (optimizer.state.fp32_param.*) of 9 parameters" in result.stderr
    assert "1 bf16 tensor without one (never stepped: frozen) read as saved: output_layer.weight" in result.stderr


@pytest.mark.parametrize("refile, named", [
    (lambda keys: {"optimizer.state.fp32_param.decoder.layers.mlp.linear_fc2.bias":
                   "optimizer.state.fp32_param.decoder.layers.self_attention.linear_proj.bias",
                   "optimizer.state.fp32_param.decoder.layers.self_attention.linear_proj.bias":
                   "optimizer.state.fp32_param.decoder.layers.mlp.linear_fc2.bias"},
     "does not round to the model's saved bf16 copy"),
    (lambda keys: {"optimizer.state.fp32_param.embedding.word_embeddings.weight":
                   "optimizer.state.main_param.embedding.word_embeddings.weight"},
     "trained 'embedding.word_embeddings.weight' (bf16) but holds no fp32 master of it")],
    ids=["two masters swapped", "a master missing"])
def test_masters_that_do_not_fit_their_copies_are_refused(refile, named, cli, tmp_path):
    from megatron_fixtures import megatron_bf16_run

    run = Path(shutil.copytree(megatron_bf16_run().run, tmp_path / "run"))
    _refiled(run / "iter_0000003", refile)
    assert_refused(cli, tmp_path, ["consolidate", run, tmp_path / "out"], named, inputs=[run])


# -- the distributed optimizer's layouts (megatron-core's DistributedOptimizer cannot be built on CPU: the names are
# its source's, given to the bf16 run's own tensors by re-filing its .metadata, bytes untouched) ------------------
def _bf16_run_refiled(tmp_path: Path, refile) -> Path:
    from megatron_fixtures import megatron_bf16_run

    run = Path(shutil.copytree(megatron_bf16_run().run, tmp_path / "run"))
    _refiled(run / "iter_0000003", refile)
    return run


def _renamed(keys, old: str, new: str) -> dict:
    return {key: new + key[len(old):] for key in keys if key.startswith(old)}


def test_fully_reshardable_masters_under_param_are_read_as_the_weights(cli, tmp_path):
    """fully_reshardable (megatron-core 0.14+) gathers the masters from the flat buckets and saves them as
    optimizer.state.param.<key> in the model's shapes: read as fp32_param is, bit for bit, and named so."""
    from megatron_fixtures import megatron_bf16_run

    run = _bf16_run_refiled(tmp_path, lambda keys: _renamed(keys, "optimizer.state.fp32_param.",
                                                               "optimizer.state.param."))
    result = cli("consolidate", run, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    fixture = megatron_bf16_run()
    masters, saved = fixture.per_layer("master."), fixture.per_layer("model.")
    assert_same_tensors(load_file(tmp_path / "out" / "model.safetensors"),
                        {name: masters.get(name, tensor.float()) for name, tensor in saved.items()})
    assert "read the fp32 masters (optimizer.state.param.*) of 9 parameters" in result.stderr


def test_masters_under_both_names_are_refused_and_flat_buckets_never_read_as_weights(cli, tmp_path):
    from megatron_fixtures import megatron_bf16_run

    # one master under fully_reshardable's name, the others under fp32_param: no one layout
    both = _bf16_run_refiled(tmp_path, lambda keys: _renamed([k for k in keys if k.endswith("linear_fc2.bias")],
                                                             "optimizer.state.fp32_param.", "optimizer.state.param."))
    assert_refused(cli, tmp_path, ["consolidate", both, tmp_path / "out"], "holds fp32 masters under both",
                   inputs=[both])
    shutil.rmtree(both)
    # the masters under the distributed optimizer's per-DP-group names: optimizer state, never weights
    buckets = _bf16_run_refiled(tmp_path, lambda keys: _renamed(
        keys, "optimizer.state.fp32_param.", "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.param."))
    result = cli("consolidate", buckets, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    saved = megatron_bf16_run().per_layer("model.")
    assert_same_tensors(load_file(tmp_path / "out" / "model.safetensors"), {n: t.float() for n, t in saved.items()})
    assert "flat buckets, optimizer.distributed.*" in result.stderr and "not read" in result.stderr
