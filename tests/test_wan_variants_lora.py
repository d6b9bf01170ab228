"""Wan LoRAs on Wan's variants: a LoRA trained on Wan (the real tiny Wan 2.1's adapters, written by musubi-tuner,
ComfyUI's layout and Diffusers' save_lora_weights) adapts layers a Wan VACE or SkyReels-V2 model has too, so with such a
--base it is written in every layout at the trained strength and fused into that model. The judges: the variant
pipeline's own load_lora_weights path (WanVACEPipeline's WanLoraLoaderMixin, SkyReels-V2's own mixin) and PEFT's merge,
each fusing to exactly W + (alpha / r) B A of the musubi-tuner file.

Adapters on the variants' own layers (VACE blocks, Animate's face adapter, the fps embedding) need LoRA tables of the
variants, which the LoRA reader cannot hold apart from Wan's yet (see docs/families/wan-variants.md)."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import SkyReelsV2DiffusionForcingPipeline, WanVACEPipeline
from lora_helpers import assert_all_equal, diffusers_fused, merged, peft_fused
from safetensors.torch import load_file
from wan_fixtures import REAL_WAN

from cogexport.exporter import export

pytestmark = pytest.mark.skipif(not REAL_WAN.is_dir(), reason=f"the real Wan fixtures are not at {REAL_WAN}")
LORA = REAL_WAN / "lora"
FILES = {"musubi": "lora.safetensors", "comfyui": "lora.safetensors", "diffusers": "pytorch_lora_weights.safetensors",
         "peft": "adapter_model.safetensors"}
# shape class -> (family, Diffusers class, pipeline class whose LoRA loader judges, config values beyond the Wan
# fixture's)
VARIANTS = {"vace": ("Wan VACE", "WanVACETransformer3DModel", WanVACEPipeline,
                     {"vace_layers": [0], "vace_in_channels": 8}),
            "skyreels-df": ("SkyReels-V2", "SkyReelsV2Transformer3DModel", SkyReelsV2DiffusionForcingPipeline,
                            {"inject_sample_info": True})}


def musubi_adapter() -> dict:
    """module (Diffusers name) -> (A, B, alpha / r), read from musubi-tuner's own file with the fixture's module map."""
    tensors = load_file(next((LORA / "a_musubi").glob("*.safetensors")))
    found = {}
    for names in json.loads((LORA / "module_map.json").read_text()).values():
        key = names["musubi"]
        down, up = tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"]
        found[names["diffusers"]] = (down, up, tensors[f"{key}.alpha"].item() / down.shape[0])
    return found


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant_base(request, tmp_path_factory):
    """A tiny variant model whose Wan layers are the real Wan fixture's weights (its own layers seeded noise), saved as
    a --base folder; (family, class, pipeline, config, weights, folder)."""
    import diffusers

    family, class_name, pipeline, extra = VARIANTS[request.param]
    config = {k: v for k, v in json.loads((REAL_WAN / "base" / "transformer" / "config.json").read_text()).items()
              if not k.startswith("_")}
    model_class = getattr(diffusers, class_name)
    torch.manual_seed(0)
    model = model_class.from_config({**config, **extra})
    wan = load_file(REAL_WAN / "base" / "transformer" / "ground_truth.safetensors")
    state = {name: wan.get(name, torch.randn(tensor.shape) * 0.1) for name, tensor in model.state_dict().items()}
    model.load_state_dict(state)
    folder = tmp_path_factory.mktemp(request.param) / "transformer"
    model.save_pretrained(folder)
    return family, model_class, pipeline, dict(model.config), state, folder


@pytest.mark.parametrize("source", ["a_musubi", "c_comfyui", "d_diffusers"])
def test_a_wan_lora_on_a_variant_in_every_layout_and_fused(source, variant_base, tmp_path):
    family, model_class, pipeline, config, weights, base = variant_base
    truth = merged(weights, musubi_adapter())
    for target in FILES:
        result = export(LORA / source, tmp_path / target, base=base, lora_format=target)
        assert result.family == "Wan"  # its layers are Wan's: written in Wan's layouts, which the variant loads
        if target == "peft":
            fused = peft_fused(model_class, config, weights, tmp_path / target)
        else:
            fused = diffusers_fused(pipeline, model_class, config, weights, tmp_path / target / FILES[target])
        assert_all_equal(fused, truth)
    result = export(LORA / source, tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    assert result.family == family  # the whole variant model, its Wan layers fused
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
