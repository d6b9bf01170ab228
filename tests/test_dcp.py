"""PyTorch distributed checkpoints (DCP) as accelerate (FSDP1, FSDP2), torchtitan, finetrainers and plain dcp.save
write them: consolidated and exported to the weights gathered inside training, bit for bit, reading only the model's
chunks; optimizer states readable by parameter; inspect says what the save is and holds."""

from __future__ import annotations

import json

import pytest
import torch
from dcp_fixtures import dcp_checkpoint
from diffusers import CogVideoXTransformer3DModel
from safetensors.torch import load_file
from test_lora import assert_all_equal, diffusers_fuse, merged

from cogexport import open_checkpoint
from cogexport.precision import PrecisionPolicy
from cogexport.exporter import export
from cogexport.write import byte_copy

# (writer, world size): ranks that do not divide the toy's sizes (13, 29, 7, 2 rows: zero-size chunks at 3 ranks),
# FSDP1's flat parameters through accelerate, the plain save's dim-1 shard of side.weight.
TOY_SAVES = [("plain", 3), ("torchtitan", 3), ("accelerate-fsdp1", 3), ("accelerate-fsdp2", 2)]
COGVIDEOX_SAVES = [("accelerate-fsdp1", 2, False), ("accelerate-fsdp2", 2, False), ("torchtitan", 3, False),
                   ("plain", 2, True)]


@pytest.mark.parametrize("writer, world_size", TOY_SAVES)
def test_consolidate_equals_the_weights_gathered_in_training(writer, world_size, tmp_path, cli):
    run = dcp_checkpoint(writer, "toy", world_size)
    result = cli("consolidate", run.run, tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    # a run folder of steps 1 and 2 says which it read (the plain save overwrote one folder at every step)
    assert ("took the newest step" in result.stderr) == (writer != "plain"), result.stderr
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert set(written) == set(run.weights)  # the module's own names
    for name, tensor in run.weights.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name


@pytest.mark.parametrize("writer, world_size", TOY_SAVES)
def test_row_shards_are_copied_file_to_file_chunk_by_chunk(writer, world_size, tmp_path, cli):
    """A weight cut into blocks of whole rows (FSDP's dim-0 shards) is its chunks' bytes end to end: each copied
    from its rank's file in the kernel, through its record's CRC-32, none loaded. The plain and torchtitan saves'
    dim-1 shards of side.weight are not contiguous in the whole tensor: that one alone is loaded and assembled."""
    run = dcp_checkpoint(writer, "toy", world_size)
    byte_copy.COUNTS.reset()
    result = cli("consolidate", run.run, tmp_path / "out", "--workers", "1")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(written[name], tensor) for name, tensor in run.weights.items())
    loaded = {"side.weight"} if writer in ("plain", "torchtitan") else set()
    assert sum(byte_copy.COUNTS.bytes.values()) == sum(t.nbytes for n, t in run.weights.items() if n not in loaded)


@pytest.mark.parametrize("writer, world_size", TOY_SAVES)
def test_reads_only_the_model_chunks_and_keeps_optimizer_states_readable(writer, world_size):
    run = dcp_checkpoint(writer, "toy", world_size)
    with open_checkpoint(run.run) as checkpoint:
        assert list(checkpoint) == list(run.weights)  # the module's own names, in its state_dict order
        # the step comes from the step folder's name; a plain save's "step" entry is a pickle, never loaded
        assert (checkpoint.info.tag, checkpoint.info.step) == (run.last_step.name, None if writer == "plain" else 2)
        assert checkpoint.info.facts.world_size == world_size
        for name in checkpoint:
            checkpoint[name].load()
        assert sum(checkpoint.bytes_read().values()) == sum(t.nbytes for t in run.weights.values())
        assert set(checkpoint.info.trainable) == {n for n in run.truth["trainable"]}
        states = run.optimizer
        assert states and {f"{name}.{state}" for name in checkpoint.optimizer_tensors
                           for state in checkpoint.optimizer_states(name)} == set(states)
        for key, tensor in states.items():
            name, state = key.rsplit(".", 1)
            assert torch.equal(checkpoint.optimizer_states(name)[state].load(), tensor), key
        assert "exp_avg" not in checkpoint  # optimizer states never mix into the weights


def test_tag_picks_another_step_and_a_step_folder_needs_none(tmp_path):
    run = dcp_checkpoint("torchtitan", "toy", 3)
    with open_checkpoint(run.run, "step-1") as first, open_checkpoint(run.run / "checkpoint" / "step-2") as last:
        assert (first.info.tag, first.info.step) == ("step-1", 1)
        assert not any("newest step" in note for note in first.info.notes + last.info.notes)
        assert not torch.equal(first["block.0.weight"].load(), last["block.0.weight"].load())
        assert torch.equal(last["block.0.weight"].load(), run.weights["block.0.weight"])


def test_inspect_describes_the_save(cli):
    run = dcp_checkpoint("torchtitan", "toy", 3)
    report = json.loads(cli("inspect", run.run, "--json").stdout)
    assert report["format"] == "dcp" and report["writer"] == "torchtitan"
    assert (report["world_size"], report["step"], report["tag"]) == (3, 2, "step-2")
    assert report["contents"][:2] == ["model (14 tensors)", "optimizer states exp_avg, exp_avg_sq, step of 10 parameters"]
    assert {"lr scheduler", "train state", "dataloader state"} <= set(report["contents"])
    # the BytesIO loss history is listed by name, never unpickled
    assert report["client_state"]["train_state.global_avg_losses"] == "pickle, not loaded"
    assert report["stored_dtypes"] == ["fp32", "int64"]
    text = cli("inspect", run.run).stdout
    assert "saved by torchtitan, world size 3" in text and "frozen_proj.weight" in text


def _expected_export(weights: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    policy = PrecisionPolicy.build(dtype, ["norm1.norm", "norm2.norm", "norm_q", "norm_k", "norm_final",
                                           "norm_out.norm", "patch_embed.pos_embedding"], [])
    return {name: t.to(policy.target_dtype(name, t.dtype)) for name, t in weights.items()}


@pytest.mark.parametrize("writer, world_size, compiled", COGVIDEOX_SAVES)
def test_cogvideox_exports_the_trained_weights_and_loads_with_diffusers(writer, world_size, compiled, tmp_path, cli):
    run = dcp_checkpoint(writer, "cogvideox-2b", world_size, compile=compiled)
    base = run.base(tmp_path / "base")
    result = cli(run.run, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert set(written) == set(run.weights)
    for name, tensor in run.weights.items():
        assert torch.equal(written[name], tensor), name
    model = CogVideoXTransformer3DModel.from_pretrained(tmp_path / "out")
    assert all(torch.equal(model.state_dict()[n], t) for n, t in run.weights.items())
    verified = cli("verify", tmp_path / "out", "--against", run.run)
    assert verified.exit_code == 0 and "64 exact" in verified.stdout, verified.stdout + verified.stderr


def test_compiled_model_keys_lose_orig_mod():
    run = dcp_checkpoint("plain", "cogvideox-2b", 2, compile=True)
    with open_checkpoint(run.run) as checkpoint:
        assert set(checkpoint) == set(run.weights)  # saved as model.transformer_blocks.0._orig_mod.norm1...
        assert checkpoint.info.facts.writer == "torch.distributed.checkpoint (dcp.save)"


def test_finetrainers_bf16_save_exports_and_says_it_is_bf16(tmp_path, cli):
    run = dcp_checkpoint("finetrainers", "cogvideox-2b", 2)
    base = run.base(tmp_path / "base")
    assert all(t.dtype == torch.bfloat16 for t in run.weights.values())
    result = cli(run.run, tmp_path / "out", "--base", base, "--tag", "finetrainers_step_2")
    assert result.exit_code == 0, result.stderr
    assert "the saved model weights are bf16, not fp32" in result.stderr
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    expected = _expected_export(run.weights, "bf16")
    assert set(written) == set(expected)
    for name, tensor in expected.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name], tensor), name
    CogVideoXTransformer3DModel.from_pretrained(tmp_path / "out")
    report = json.loads(cli("inspect", run.last_step, "--json").stdout)
    assert report["writer"] == "finetrainers (ptd backend)" and report["stored_dtypes"] == ["bf16"]
    assert report["stored_bytes"] * 2 == report["fp32_bytes"]
    assert "bytes as saved (bf16)" in cli("inspect", run.last_step).stdout


def test_export_straight_from_the_python_api_with_pipeline_defaults(tmp_path):
    run = dcp_checkpoint("accelerate-fsdp2", "cogvideox-2b", 2)
    result = export(run.last_step, tmp_path / "out", base=run.base(tmp_path / "base"))
    assert result.source["format"] == "dcp" and result.source["tag"] == run.last_step.name
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    for name, tensor in _expected_export(run.weights, "bf16").items():
        assert torch.equal(written[name], tensor), name


def test_peft_lora_inside_a_dcp_save(tmp_path, cli):
    """The adapter Diffusers loads from the export fuses to W + (alpha/r) B A of the weights taken in training, and so
    does --lora fuse."""
    run = dcp_checkpoint("accelerate-fsdp2", "cogvideox-2b", 2, lora_rank=4)
    rank, alpha = 4, 8  # what make_dcp_checkpoint.py gives the adapter (alpha = 2 * rank); a DCP save records neither
    result = cli(run.run, tmp_path / "adapter", "--base", run.base(tmp_path / "base"), "--lora-alpha", alpha, "--dtype",
                 "fp32", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["lora"]["rank"] == rank
    written = load_file(tmp_path / "adapter" / "pytorch_lora_weights.safetensors")
    lora = [name for name in run.weights if ".lora_" in name]
    assert lora and set(written) == {"transformer." + name.replace(".default", "") for name in lora}
    for name in lora:
        assert torch.equal(written["transformer." + name.replace(".default", "")], run.weights[name]), name

    base = {name.replace(".base_layer", ""): t for name, t in run.weights.items() if ".lora_" not in name}
    pairs = {name[: -len(".lora_A.default.weight")]: (run.weights[name], run.weights[name.replace("lora_A", "lora_B")])
             for name in lora if ".lora_A." in name}
    expected = merged(base, pairs, alpha, rank)
    assert_all_equal(diffusers_fuse(tmp_path / "adapter", run.truth["config"], base), expected)
    fused = cli(run.run, tmp_path / "fused", "--base", run.base(tmp_path / "base2"), "--lora", "fuse",
                "--lora-alpha", alpha, "--dtype", "fp32", "--component", "transformer")
    assert fused.exit_code == 0, fused.stderr
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), expected)


# (model, writer, family, pipeline, transformer, adapted modules)
FAMILY_LORA_SAVES = [("wan-t2v", "accelerate-fsdp2", "Wan", "WanPipeline", "WanTransformer3DModel", 16),
                     ("wan-t2v", "finetrainers", "Wan", "WanPipeline", "WanTransformer3DModel", 16),
                     ("hunyuanvideo-t2v", "accelerate-fsdp2", "HunyuanVideo", "HunyuanVideoPipeline",
                      "HunyuanVideoTransformer3DModel", 22),
                     ("ltx-2b", "accelerate-fsdp2", "LTX-Video", "LTXPipeline", "LTXVideoTransformer3DModel", 16)]


@pytest.mark.parametrize("model, writer, family, pipeline, transformer, modules", FAMILY_LORA_SAVES,
                         ids=["wan", "wan-finetrainers", "hunyuanvideo", "ltx-video"])
def test_peft_lora_of_each_family_inside_a_dcp_save(model, writer, family, pipeline, transformer, modules, tmp_path,
                                                    cli):
    """A LoRA on a Wan, HunyuanVideo or LTX-Video transformer trained under FSDP2 (accelerate's save_state;
    finetrainers' dcp.save of a bf16 model): the adapter the family's Diffusers loader loads from the export, and
    --lora fuse, give W + (alpha/r) B A of the weights gathered in training."""
    import diffusers
    from lora_helpers import diffusers_fused

    model_class = getattr(diffusers, transformer)
    run = dcp_checkpoint(writer, model, 2, lora_rank=4)
    rank, alpha = 4, 8  # what make_dcp_checkpoint.py gives the adapter; a DCP save records neither
    base = tmp_path / "base"
    model_class.from_config(run.truth["config"]).save_config(base)
    result = cli(run.run, tmp_path / "adapter", "--base", base, "--lora-alpha", alpha, "--json")
    assert result.exit_code == 0, result.stderr
    lora = json.loads(result.stdout)["lora"]
    assert (lora["family"], lora["format"], lora["rank"], lora["modules"]) == (family, "peft-checkpoint", rank, modules)
    written = load_file(tmp_path / "adapter" / "pytorch_lora_weights.safetensors")
    trained = [name for name in run.weights if ".lora_" in name]
    assert trained and set(written) == {"transformer." + name.replace(".default", "") for name in trained}
    for name in trained:  # the adapters as trained (fp32 masters, or finetrainers' bf16), in the dtype trained in
        assert torch.equal(written["transformer." + name.replace(".default", "")], run.weights[name]), name
        assert written["transformer." + name.replace(".default", "")].dtype == run.weights[name].dtype, name

    weights = {name.replace(".base_layer", ""): t for name, t in run.weights.items() if ".lora_" not in name}
    pairs = {name[: -len(".lora_A.default.weight")]: (run.weights[name], run.weights[name.replace("lora_A", "lora_B")])
             for name in trained if ".lora_A." in name}
    expected = merged(weights, pairs, alpha, rank)
    fused = diffusers_fused(getattr(diffusers, pipeline), model_class, run.truth["config"], weights,
                            tmp_path / "adapter" / "pytorch_lora_weights.safetensors")
    assert_all_equal(fused, expected)
    result = cli(run.run, tmp_path / "fused", "--base", base, "--lora", "fuse", "--lora-alpha", alpha, "--dtype",
                 "fp32")
    assert result.exit_code == 0, result.stderr
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), expected)


# (model, writer, Diffusers transformer class): full fine-tunes of the other families under FSDP2
FAMILY_FULL_SAVES = [("wan-t2v", "accelerate-fsdp2", "WanTransformer3DModel"),
                     ("wan-t2v", "finetrainers", "WanTransformer3DModel"),
                     ("hunyuanvideo-t2v", "accelerate-fsdp2", "HunyuanVideoTransformer3DModel"),
                     ("ltx-2b", "torchtitan", "LTXVideoTransformer3DModel")]


@pytest.mark.parametrize("model, writer, transformer", FAMILY_FULL_SAVES,
                         ids=["wan", "wan-finetrainers", "hunyuanvideo", "ltx-video-torchtitan"])
def test_full_fine_tune_of_each_family_exports_the_trained_weights(model, writer, transformer, tmp_path, cli):
    """A Wan, HunyuanVideo or LTX-Video transformer fine-tuned whole under FSDP2: every exported tensor equals the
    weights gathered in training (finetrainers' bf16 as saved), verify agrees, and Diffusers loads the folder."""
    import diffusers

    model_class = getattr(diffusers, transformer)
    run = dcp_checkpoint(writer, model, 2)
    base = tmp_path / "base"
    model_class.from_config(run.truth["config"]).save_config(base)
    result = cli(run.run, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert set(written) == set(run.weights)
    for name, tensor in run.weights.items():
        assert torch.equal(written[name], tensor.float()), name
    checked = cli("verify", tmp_path / "out", "--against", run.run)
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    loaded = model_class.from_pretrained(tmp_path / "out").state_dict()
    assert all(torch.equal(loaded[name], written[name]) for name in written)
