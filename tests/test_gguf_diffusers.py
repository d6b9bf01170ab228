"""GGUF files of tiny Wan, HunyuanVideo and LTX-Video transformers (every --quant type), judged by Diffusers:
``from_single_file(path, config=..., quantization_config=GGUFQuantizationConfig(compute_dtype=float32))`` loads the
file into the family's model (its own GGUF reader and single-file converter), and the forward output is exactly that of
the same model loaded normally with the dequantized weights; those weights agree with the ``gguf`` package's
dequantization of the file (exactly for float types; Diffusers dequantizes the block types in float16 arithmetic)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from quantized_models import FAMILIES, saved_tiny

from cogexport.quantize.policy import plan_gguf, quantization_policy
from cogexport.write.gguf_file import write_gguf

QUANTS = ["BF16", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_0", "Q5_1", "Q4_K_M", "Q4_0", "Q4_1"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def tiny(request, tmp_path_factory):
    return saved_tiny(FAMILIES[request.param], tmp_path_factory)


def gguf_package_weights(path, family) -> dict[str, torch.Tensor]:
    """The file read and dequantized by the gguf package, then put in Diffusers' names by Diffusers' converter."""
    reader = gguf.GGUFReader(path)
    values = {t.name: torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
              .reshape(tuple(reversed(t.shape.tolist()))) for t in reader.tensors}
    return family.converter_function()(values)


def load_with_diffusers(path, family, folder, monkeypatch):
    from diffusers import GGUFQuantizationConfig
    from diffusers.loaders import single_file_model

    entry = dict(single_file_model.SINGLE_FILE_LOADABLE_CLASSES[family.class_name])
    entry["checkpoint_mapping_fn"] = family.converter_function()  # the same function (tiny hidden size for HunyuanVideo)
    monkeypatch.setitem(single_file_model.SINGLE_FILE_LOADABLE_CLASSES, family.class_name, entry)
    return family.model_class().from_single_file(
        str(path), config=str(folder / "config"), torch_dtype=torch.float32,
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32)).eval()


def dequantized_state(model) -> dict[str, torch.Tensor]:
    from diffusers.quantizers.gguf.utils import GGUFParameter, dequantize_gguf_tensor

    state = {}
    for name, tensor in model.state_dict().items():
        state[name] = dequantize_gguf_tensor(tensor).float() if isinstance(tensor, GGUFParameter) else tensor.float()
    return state


def forward(model, family) -> torch.Tensor:
    with torch.no_grad():
        return model(**family.inputs(torch.Generator().manual_seed(0)))[0]


@pytest.mark.parametrize("quant", QUANTS)
def test_diffusers_loads_the_file_and_runs_it_as_its_dequantized_weights(tiny, quant, tmp_path, monkeypatch):
    family, model, original, folder = tiny
    plan = plan_gguf(original, quantization_policy(family.key), quant)
    assert not plan.notes  # every row of these widths fills its blocks
    path = tmp_path / f"{family.key}-{quant}.gguf"
    write_gguf(path, plan)
    loaded = load_with_diffusers(path, family, folder, monkeypatch)

    by_gguf_package = gguf_package_weights(path, family)
    by_diffusers = dequantized_state(loaded)
    assert by_diffusers.keys() == by_gguf_package.keys() == model.state_dict().keys()
    for name, weight in by_diffusers.items():
        reference = by_gguf_package[name]
        tolerance = 2e-3 * reference.abs().max().item()  # float16 arithmetic in Diffusers' block dequantizers
        assert torch.allclose(weight, reference, rtol=0, atol=tolerance), name

    plain = family.model_class()(**family.config).eval()
    plain.load_state_dict(by_diffusers, strict=True)
    output = forward(loaded, family)
    assert torch.equal(output, forward(plain, family))
    # and the quantization error stays what the type costs: the output against the unquantized model's
    unquantized = forward(model, family)
    relative = ((output - unquantized).norm() / unquantized.norm()).item()
    assert relative < {"BF16": 0.02, "F16": 0.005, "Q8_0": 0.02}.get(quant, 0.25), relative


def test_float_types_are_exact(tiny, tmp_path):
    """F16 and BF16 files hold every value as that cast of the source (F32 ones exactly)."""
    family, model, original, folder = tiny
    for quant, dtype in (("F16", torch.float16), ("BF16", torch.bfloat16)):
        plan = plan_gguf(original, quantization_policy(family.key), quant)
        write_gguf(tmp_path / f"{quant}.gguf", plan)
        restored = gguf_package_weights(tmp_path / f"{quant}.gguf", family)
        kept = {t.name for t in plan.tensors if t.type.name == "F32"}
        source = family.converter_function()({n: t.load() for n, t in original.items()})
        kept_diffusers = family.converter_function()({n: original[n].load() for n in kept})
        for name, value in source.items():
            expected = value if name in kept_diffusers else value.to(dtype).float()
            assert torch.equal(restored[name], expected), (quant, name)
