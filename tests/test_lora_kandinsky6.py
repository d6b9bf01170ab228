"""Kandinsky 6 LoRAs on Diffusers' module names: musubi-tuner's (networks.lora_kandinsky6: lora_unet_ + the names with
underscores, .alpha per module), PEFT's (a PEFT save, and a PEFT-wrapped run's checkpoint), fused exactly and written
as each other, at exactly the trained strength. The adapters are on the layers musubi-tuner adapts by default (every
Linear of the text blocks and the fused blocks but the modulations: both streams' attention and feed-forwards and the
cross-modal attentions), with distinct ranks and alphas; the truth W + (alpha / r) B A is computed in PEFT's operation
order. PEFT's own merge judges the PEFT folders we write; our musubi file equals the one written here from
musubi-tuner's documented layout."""

from __future__ import annotations

import pytest
from diffusers import Kandinsky6Transformer3DModel
from kandinsky6_fixtures import tiny_transformer
from lora_helpers import (assert_all_equal, merged, peft_fused, peft_wrapped, random_modules, write_musubi_lora,
                          write_peft_adapter, write_peft_checkpoint_file)
from safetensors.torch import load_file

from cogexport.exporter import export

ATTENTION = ("to_query", "to_key", "to_value", "out_layer")
FEED_FORWARD = ("net.0.proj", "net.2")
STRENGTHS = ((4, 8.0), (2, 2.0), (8, 4.0), (4, 3.0), (2, 1.0))
NETWORK = "networks.lora_kandinsky6"


def layers() -> list[str]:
    made = []
    for stream in ("video", "audio"):
        made += [f"{stream}_text_transformer_blocks.0.attn.{p}" for p in ATTENTION]
        made += [f"{stream}_text_transformer_blocks.0.feed_forward.{p}" for p in FEED_FORWARD]
    for i in range(2):
        for block in ("video_dec_block", "audio_dec_block"):
            made += [f"visual_transformer_blocks.{i}.{block}.{a}.{p}" for a in ("self_attention", "cross_attention")
                     for p in ATTENTION]
            made += [f"visual_transformer_blocks.{i}.{block}.feed_forward.{p}" for p in FEED_FORWARD]
        made += [f"visual_transformer_blocks.{i}.{a}.{p}" for a in ("va_cross_attention", "av_cross_attention")
                 for p in ATTENTION]
    return made


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("kandinsky6-lora")
    model = tiny_transformer(seed=0)
    base = root / "transformer"
    model.save_pretrained(base)
    config, weights = dict(model.config), {name: t.clone() for name, t in model.state_dict().items()}
    modules = random_modules({n: t.shape for n, t in weights.items()}, layers(), 0, STRENGTHS)
    wrapped = peft_wrapped(Kandinsky6Transformer3DModel, config, weights, modules)
    inputs = {"musubi": write_musubi_lora(root / "musubi" / "lora.safetensors", modules, NETWORK),
              "peft": write_peft_adapter(root / "peft", wrapped),
              "peft-checkpoint": write_peft_checkpoint_file(root / "ddp", wrapped)}
    truth = merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in modules.items()})
    return base, config, weights, modules, inputs, truth


@pytest.mark.parametrize("source", ["musubi", "peft", "peft-checkpoint"])
def test_each_layout_fuses_exactly_and_is_written_as_the_others(source, adapters, tmp_path):
    base, config, weights, modules, inputs, truth = adapters
    result = export(inputs[source], tmp_path / "peft", base=base, lora_format="peft")
    assert result.family == "Kandinsky 6" and result.lora["modules"] == len(modules)
    assert_all_equal(peft_fused(Kandinsky6Transformer3DModel, config, weights, tmp_path / "peft"), truth)
    export(inputs[source], tmp_path / "musubi", base=base, lora_format="musubi")
    expected = load_file(write_musubi_lora(tmp_path / "expected.safetensors", modules, NETWORK))
    assert_all_equal(load_file(tmp_path / "musubi" / "lora.safetensors"), expected)
    export(inputs[source], tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
