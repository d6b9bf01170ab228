"""A Wan full fine-tune in the original names (as musubi-tuner and DiffSynth-Studio train it), two steps under real
DeepSpeed ZeRO-2 on CPU: the export is exactly the fp32 masters taken inside training, as Diffusers' own converter
names them, and the way back gives the masters again under their original names."""

from __future__ import annotations

import torch
from diffusers import WanTransformer3DModel
from wan_fixtures import diffusers_reads_original, wan_finetune, weights

from cogexport.precision import PrecisionPolicy
from cogexport.exporter import export_original


def test_finetune_exports_the_fp32_masters(tmp_path, cli):
    run = wan_finetune()
    assert run.truth["frozen"] == [] and len(run.truth["trainable"]) == len(run.tensors)
    result = cli(run.checkpoint, tmp_path / "out", "--base", run.base, "--component", "transformer", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    expected = diffusers_reads_original(run.tensors)
    written = weights(tmp_path / "out")
    assert set(written) == set(expected)
    assert all(torch.equal(written[name], tensor) for name, tensor in expected.items())
    base = weights(run.base / "transformer")
    assert all(not torch.equal(base[name], written[name]) for name in written)  # it did train

    export_original(tmp_path / "out", tmp_path / "original", dtype="fp32")
    original = weights(tmp_path / "original")
    assert set(original) == set(run.tensors)
    assert all(torch.equal(original[name], tensor) for name, tensor in run.tensors.items())


def test_finetune_to_bf16_pipeline(tmp_path, cli):
    run = wan_finetune()
    result = cli(run.checkpoint, tmp_path / "out", "--base", run.base)
    assert result.exit_code == 0, result.stderr
    assert "fp32 masters" in (tmp_path / "out" / "README.md").read_text()
    # what from_pretrained(torch_dtype=bf16) keeps in fp32: the class's own list, matched per name component
    policy = PrecisionPolicy.build("bf16", WanTransformer3DModel._keep_in_fp32_modules, [])
    written = weights(tmp_path / "out" / "transformer")
    for name, tensor in diffusers_reads_original(run.tensors).items():
        assert torch.equal(written[name], tensor.to(policy.target_dtype(name, tensor.dtype))), name
