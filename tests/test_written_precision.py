"""What an export says it wrote is what it wrote: an adapter keeps the dtype it was trained in unless --dtype asks for
another, the summary names the dtypes in the files, and export and verify count the same tensors (those in the
files)."""

from __future__ import annotations

import pytest
import torch
from quantized_models import FAMILIES
from safetensors.torch import load_file
from test_lora_wan import BASE_FOLDER, BASE_TRUTH, REAL, every_block_layer, make_adapter, write_musubi

from cogexport.verify import verify
from cogexport.exporter import export
from cogexport.exporter.to_comfyui import export_comfyui

# the adapters here are made on the shared real Wan fixture's weights
needs_real_wan = pytest.mark.skipif(not REAL.is_dir(), reason=f"the real Wan fixtures are not at {REAL}")


@pytest.fixture(scope="module")
def bf16_lora(tmp_path_factory):
    """A musubi-tuner LoRA of the tiny Wan trained in bf16: its A and B in bf16, its .alpha in fp32."""
    adapter = make_adapter(load_file(BASE_TRUTH), every_block_layer())
    adapter.modules = {module: (a.to(torch.bfloat16), b.to(torch.bfloat16), rank, alpha)
                       for module, (a, b, rank, alpha) in adapter.modules.items()}
    return write_musubi(tmp_path_factory.mktemp("lora") / "lora.safetensors", adapter)


def written(folder) -> dict[str, torch.Tensor]:
    (path,) = folder.glob("*.safetensors")
    return load_file(path)


@needs_real_wan
def test_an_adapter_keeps_the_dtype_it_was_trained_in(bf16_lora, tmp_path):
    result = export(bf16_lora, tmp_path / "out")
    tensors = written(tmp_path / "out")
    assert {tensor.dtype for tensor in tensors.values()} == {torch.bfloat16}
    assert result.precision == "bf16"
    assert "Precision: bf16\n" in (tmp_path / "out" / "README.md").read_text()
    source = load_file(bf16_lora)
    assert sum(t.numel() * 2 for t in source.values() if t.dtype == torch.bfloat16) == \
        sum(t.numel() * t.element_size() for t in tensors.values())  # not doubled


@needs_real_wan
def test_an_adapter_is_cast_when_asked(bf16_lora, tmp_path):
    result = export(bf16_lora, tmp_path / "out", dtype="fp32")
    assert {tensor.dtype for tensor in written(tmp_path / "out").values()} == {torch.float32}
    assert result.precision == "fp32"


@needs_real_wan
def test_a_layout_with_alphas_says_so_and_verify_counts_what_export_counts(bf16_lora, tmp_path):
    result = export(bf16_lora, tmp_path / "out", lora_format="musubi")
    tensors = written(tmp_path / "out")
    assert {name for name, t in tensors.items() if t.dtype == torch.float32} == \
        {name for name in tensors if name.endswith(".alpha")}
    assert result.precision == "bf16, except alpha kept in fp32"
    (report,) = verify(tmp_path / "out", bf16_lora)
    assert report.ok and report.tensors == result.tensors == len(tensors) == report.exact + report.cast_exact


def test_an_fp8_file_is_counted_alike_by_export_and_verify(tmp_path):
    model = FAMILIES["wan"].build()
    model.save_pretrained(tmp_path / "model")
    result = export_comfyui(tmp_path / "model", tmp_path / "out", quant="fp8")
    (report,) = verify(tmp_path / "out", tmp_path / "model")
    assert report.ok and report.tensors == result.tensors == report.exact
    assert report.tensors == len(written(tmp_path / "out"))


@needs_real_wan
@pytest.mark.parametrize("lora_format", ["lycoris", "comfyui"])
def test_a_lokr_adapter_is_counted_alike_by_export_and_verify(lora_format, tmp_path):
    """LyCORIS's own LoKr save, written with its .alpha tensors: the export's count is verify's."""
    pytest.importorskip("lycoris", reason="lycoris-lora (a test dependency) is not installed")
    from diffusers import WanTransformer3DModel
    from lycoris_helpers import lycoris_saved
    from test_lora_lycoris import LOKR, per_block, tiny_model

    base = WanTransformer3DModel.load_config(BASE_FOLDER), load_file(BASE_TRUTH)
    path, _ = lycoris_saved(tiny_model(base), per_block(LOKR), tmp_path / "run" / "pytorch_lora_weights.safetensors", 1)
    result = export(path, tmp_path / "out", base=BASE_FOLDER, lora_format=lora_format)
    (report,) = verify(tmp_path / "out", path)
    assert report.ok and report.tensors == result.tensors == len(written(tmp_path / "out")) == report.exact
