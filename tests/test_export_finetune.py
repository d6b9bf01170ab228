"""Diffusers-based fine-tunes (CogVideo's finetune/: accelerate + DeepSpeed) export to the fp32 masters, and exports
are byte-identical to Diffusers' own save_pretrained of the same tensors."""

from __future__ import annotations

import pytest
import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, finetune, write_sat_run
from diffusers import CogVideoXTransformer3DModel
from safetensors.torch import load_file, save_file

from cogexport.exporter import export
from cogexport.precision import PrecisionPolicy


@pytest.mark.parametrize("model_type, stage, world_size", [("t2v", 2, 2), ("i2v", 3, 3)])
def test_deepspeed_finetune_exports_the_fp32_masters(model_type, stage, world_size, tmp_path, cli):
    run = finetune(model_type, stage, world_size)
    result = cli("--model-type", model_type, run.checkpoint, tmp_path / "out", "--base", run.base,
                 "--component", "transformer", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert set(written) == set(run.truth["order"])
    for name in run.truth["trainable"]:
        assert torch.equal(written[name], run.tensors[name]), name
    for name in run.truth["buffers"]:  # I2V's learned positions are a buffer, stored in the training dtype
        assert torch.equal(written[name], run.tensors[name].float()), name


def test_ddp_model_safetensors_with_module_prefix(tmp_path):
    original = build_tiny_transformer("5b", num_layers=2, seed=1)
    save_file({f"module.{k}": v.contiguous() for k, v in original.state_dict().items()}, tmp_path / "model.safetensors")
    export(tmp_path / "model.safetensors", tmp_path / "out", base=config_folder(tmp_path / "base", original),
           dtype="fp32")
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert all(torch.equal(written[n], t) for n, t in original.state_dict().items())


@pytest.mark.parametrize("max_shard_size, variant", [("5GB", None), ("20kB", None), ("20kB", "bf16"), ("20kB", "ema.v2"),
                                                     (7000, None)])
def test_bf16_export_is_byte_identical_to_save_pretrained(max_shard_size, variant, tmp_path):
    original = build_tiny_transformer("5b-i2v", num_layers=3, seed=7)
    run = write_sat_run(tmp_path / "run", original.state_dict())
    base = config_folder(tmp_path / "base", original)
    export(tmp_path / "run", tmp_path / "ours", base=base, max_shard_size=max_shard_size, variant=variant)

    # Diffusers' own writer, given the same tensors in the same dtypes.
    policy = PrecisionPolicy.build("bf16", ["norm1.norm", "norm2.norm", "norm_q", "norm_k", "norm_final",
                                            "norm_out.norm", "patch_embed.pos_embedding"], [])
    reference = CogVideoXTransformer3DModel.from_config(original.config)
    reference.load_state_dict({n: t.to(policy.target_dtype(n, t.dtype)) for n, t in run.expected.items()},
                              assign=True)
    reference.save_pretrained(tmp_path / "theirs", max_shard_size=max_shard_size, variant=variant)

    ours = sorted(p.name for p in (tmp_path / "ours").iterdir() if p.name != "README.md")  # (the model card)
    assert ours == sorted(p.name for p in (tmp_path / "theirs").iterdir())
    if max_shard_size == "20kB":
        assert len(ours) > 3
    for name in ours:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name
