"""Cosmos Predict 2 / 2.5 LoRAs in the layouts its trainers write, fused exactly and written as every other.

- SimpleTuner's cosmos2image and Diffusers (Cosmos2_5_PredictBasePipeline.save_lora_weights): Diffusers' names under
  transformer., judged by Diffusers' own CosmosLoraLoaderMixin (lora_state_dict + load_lora_adapter, fused at 1.0);
- PEFT's own adapter folder of Diffusers' model, judged by PEFT's merge;
- diffusion-pipe's cosmos_predict2 (PEFT on its MiniTrainDIT, every linear of each Block, saved with ComfyUI's
  diffusion_model. prefix: diffusion_model.blocks.0.self_attn.q_proj.lora_A.weight and adapter_config.json beside)
  and ComfyUI's lora_down / lora_up / .alpha on the same names: NVIDIA's module names, written here from the
  layout's facts by make_tiny_cosmos.original_name (checked against Diffusers' converter in test_cosmos.py).

The adapters are on every linear of the blocks, as diffusion-pipe targets them, with distinct ranks and alphas; the
truth W + (alpha / r) B A is computed in PEFT's operation order, fp32, compared with torch.equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from diffusers import Cosmos2_5_PredictBasePipeline, CosmosTransformer3DModel
from fixtures import SCRIPTS
from lora_helpers import (assert_all_equal, diffusers_fused, merged, peft_fused, peft_patterns, peft_wrapped,
                          random_modules, write_comfyui_lora, write_diffusers_lora, write_peft_adapter)
from safetensors.torch import load_file, save_file

from cogexport.exporter import export

sys.path.insert(0, str(SCRIPTS))
from make_tiny_cosmos import build_transformer, original_name  # noqa: E402

OUTPUTS = ("diffusers", "peft", "comfyui")
OUTPUT_FILE = {"diffusers": "pytorch_lora_weights.safetensors", "peft": "adapter_model.safetensors",
               "comfyui": "lora.safetensors"}
STRENGTHS = ((4, 8.0), (2, 2.0), (8, 4.0), (4, 3.0), (2, 1.0))


def block_linears(model) -> list[str]:
    """Every linear of the transformer blocks (diffusion-pipe targets each Block's), in Diffusers' names."""
    return [name for name, module in model.named_modules()
            if name.startswith("transformer_blocks.") and isinstance(module, torch.nn.Linear)]


def original_modules(modules: dict) -> dict:
    return {original_name(f"{m}.weight").removesuffix(".weight"): adapter for m, adapter in modules.items()}


def write_diffusion_pipe(folder: Path, modules: dict) -> Path:
    """diffusion-pipe's save_adapter: PEFT's state dict on NVIDIA's names under diffusion_model., PEFT's config."""
    layers = original_modules(modules)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"diffusion_model.{m}.lora_{part}.weight": t for m, (a, b, _, _) in layers.items()
               for part, t in (("A", a), ("B", b))}, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **peft_patterns(layers)}))
    return folder / "adapter_model.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model = build_transformer("2.5", seed=0)
    folder = tmp_path_factory.mktemp("cosmos-lora-base") / "transformer"
    model.save_pretrained(folder)
    weights = {name: t.clone() for name, t in model.state_dict().items()}
    modules = random_modules({n: t.shape for n, t in weights.items()}, block_linears(model), 0, STRENGTHS)
    truth = merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in modules.items()})
    return {"folder": folder, "config": dict(model.config), "weights": weights, "modules": modules, "truth": truth}


@pytest.fixture(scope="module")
def inputs(base, tmp_path_factory):
    folder, modules = tmp_path_factory.mktemp("cosmos-lora-inputs"), base["modules"]
    wrapped = peft_wrapped(CosmosTransformer3DModel, base["config"], base["weights"], modules)
    return {"diffusers": write_diffusers_lora(Cosmos2_5_PredictBasePipeline, folder / "diffusers", modules),
            "peft": write_peft_adapter(folder / "peft", wrapped),
            "diffusion-pipe": write_diffusion_pipe(folder / "diffusion-pipe", modules),
            "comfyui": write_comfyui_lora(folder / "comfyui" / "lora.safetensors", original_modules(modules))}


def judged(folder: Path, target: str, base: dict) -> dict[str, torch.Tensor]:
    """Our adapter as its loader applies it: PEFT's merge for peft, Diffusers' Cosmos loader for diffusers; a comfyui
    file read back by cogexport into a Diffusers file first."""
    if target == "peft":
        return peft_fused(CosmosTransformer3DModel, base["config"], base["weights"], folder)
    if target == "comfyui":
        export(folder, folder.with_name(folder.name + "-read-back"), base=base["folder"], lora_format="diffusers")
        folder = folder.with_name(folder.name + "-read-back")
    return diffusers_fused(Cosmos2_5_PredictBasePipeline, CosmosTransformer3DModel, base["config"], base["weights"],
                           folder / OUTPUT_FILE["diffusers"])


def test_diffusers_own_loader_applies_the_input_at_the_truth(base, inputs):
    """The judge first: Diffusers' CosmosLoraLoaderMixin fuses the Diffusers file to W + (alpha / r) B A exactly."""
    assert_all_equal(diffusers_fused(Cosmos2_5_PredictBasePipeline, CosmosTransformer3DModel, base["config"],
                                     base["weights"], inputs["diffusers"]), base["truth"])


@pytest.mark.parametrize("source", ["diffusers", "peft", "diffusion-pipe", "comfyui"])
def test_every_layout_fuses_exactly_and_is_written_as_every_other(source, base, inputs, tmp_path):
    path, modules = inputs[source], base["modules"]
    fused = export(path, tmp_path / "fused", base=base["folder"], lora="fuse", dtype="fp32")
    assert fused.family == "Cosmos"
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), base["truth"])
    for target in OUTPUTS:
        result = export(path, tmp_path / target, base=base["folder"], lora_format=target)
        assert result.family == "Cosmos" and result.lora["modules"] == len(modules)
        assert_all_equal(judged(tmp_path / target, target, base), base["truth"])
    expected = load_file(write_comfyui_lora(tmp_path / "expected.safetensors", original_modules(modules)))
    assert_all_equal(load_file(tmp_path / "comfyui" / OUTPUT_FILE["comfyui"]), expected)
