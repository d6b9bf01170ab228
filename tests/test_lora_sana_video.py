"""SanaVideo LoRAs as SimpleTuner's sanavideo writes them, fused exactly and written as Diffusers and PEFT adapters.

SimpleTuner trains PEFT LoRA on Diffusers' SanaVideoTransformer3DModel (its default targets: to_q, to_k, to_v and
to_out.0 of both attentions) and saves the pipeline's save_lora_weights file; a run's checkpoint holds the
PEFT-wrapped model. The adapters are made here on those layers with distinct ranks and alphas, and the truth
W + (alpha / r) B A is computed in PEFT's operation order.

The judges: Diffusers' own loader (SanaVideoPipeline's SanaLoraLoaderMixin: lora_state_dict + load_lora_adapter,
fused at 1.0) for the Diffusers files, PEFT's merge for PEFT folders.
"""

from __future__ import annotations

import pytest
from diffusers import SanaVideoPipeline, SanaVideoTransformer3DModel
from conftest import assert_refused
from lora_helpers import (assert_all_equal, diffusers_fused, merged, peft_fused, peft_wrapped, random_modules,
                          write_diffusers_lora, write_peft_adapter, write_peft_checkpoint_file)
from safetensors.torch import load_file
from sana_video_fixtures import build_transformer

from cogexport.exporter import export

OUTPUTS = {"diffusers": "pytorch_lora_weights.safetensors", "peft": "adapter_model.safetensors"}
STRENGTHS = ((4, 8.0), (2, 2.0), (8, 4.0), (4, 3.0), (2, 1.0))


def simpletuner_layers(blocks: int = 2) -> list[str]:
    """SimpleTuner's sanavideo default LoRA targets (DEFAULT_LORA_TARGET) in every block's two attentions."""
    return [f"transformer_blocks.{i}.{attention}.{layer}" for i in range(blocks) for attention in ("attn1", "attn2")
            for layer in ("to_q", "to_k", "to_v", "to_out.0")]


def truth_of(weights, modules):
    return merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in modules.items()})


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model = build_transformer(seed=0)
    folder = tmp_path_factory.mktemp("sana-video-base") / "transformer"
    model.save_pretrained(folder)
    return folder, dict(model.config), {name: t.clone() for name, t in model.state_dict().items()}


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    _, config, weights = base
    inputs = tmp_path_factory.mktemp("sana-video-lora")
    modules = random_modules({n: t.shape for n, t in weights.items()}, simpletuner_layers(), 0, STRENGTHS)
    wrapped = peft_wrapped(SanaVideoTransformer3DModel, config, weights, modules)
    return modules, {"diffusers": write_diffusers_lora(SanaVideoPipeline, inputs / "diffusers", modules),
                     "peft": write_peft_adapter(inputs / "peft", wrapped),
                     "peft-checkpoint": write_peft_checkpoint_file(inputs / "run", wrapped)}


def judged(folder, target, config, weights):
    if target == "peft":
        return peft_fused(SanaVideoTransformer3DModel, config, weights, folder)
    return diffusers_fused(SanaVideoPipeline, SanaVideoTransformer3DModel, config, weights,
                           folder / OUTPUTS["diffusers"])


@pytest.mark.parametrize("source", ["diffusers", "peft", "peft-checkpoint"])
def test_simpletuner_lora_fuses_exactly_and_writes_what_the_loaders_apply(source, adapters, base, tmp_path):
    folder, config, weights = base
    modules, paths = adapters
    truth = truth_of(weights, modules)
    if source == "diffusers":  # the input itself, as Diffusers' own loader applies it
        assert_all_equal(diffusers_fused(SanaVideoPipeline, SanaVideoTransformer3DModel, config, weights,
                                         paths[source]), truth)
    export(paths[source], tmp_path / "fused", base=folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
    for target in OUTPUTS:
        result = export(paths[source], tmp_path / target, base=folder, lora_format=target)
        assert result.family == "SanaVideo" and result.lora["modules"] == len(modules)
        assert_all_equal(judged(tmp_path / target, target, config, weights), truth)


def test_a_lora_without_base_names_the_families_it_could_be(adapters, cli, tmp_path):
    """SimpleTuner's targets (attn1 / attn2 to_q ... to_out.0 of transformer_blocks) are Diffusers names other
    families have too: without --base the file is refused with the families named, never guessed."""
    modules, paths = adapters
    assert_refused(cli, tmp_path, [paths["diffusers"], tmp_path / "out"],
                   "adapts layers that Cosmos, LTX-2, LTX-Video and SanaVideo models all have", "pass --base",
                   inputs=[paths["diffusers"]])
