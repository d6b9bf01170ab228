"""Kandinsky 6 LoRAs: PEFT's adapters on Diffusers' module names (a PEFT save, and a PEFT-wrapped run's checkpoint)
fused exactly and written back as a PEFT adapter, at exactly the trained strength. The adapters are made by PEFT itself
on a tiny model, on the attention and feed-forward linears of both streams' text blocks, the fused blocks' stream
blocks and their cross-modal attentions, with distinct ranks and alphas; the truth W + (alpha / r) B A is computed in
PEFT's operation order, and PEFT's own merge judges the adapter folder we write."""

from __future__ import annotations

import pytest
from diffusers import Kandinsky6Transformer3DModel
from kandinsky6_fixtures import tiny_transformer
from lora_helpers import (assert_all_equal, merged, peft_fused, peft_wrapped, random_modules, write_peft_adapter,
                          write_peft_checkpoint_file)
from safetensors.torch import load_file

from cogexport.exporter import export

ATTENTION = ("to_query", "to_key", "to_value", "out_layer")
FEED_FORWARD = ("net.0.proj", "net.2")
STRENGTHS = ((4, 8.0), (2, 2.0), (8, 4.0), (4, 3.0), (2, 1.0))


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
    inputs = {"peft": write_peft_adapter(root / "peft", wrapped),
              "peft-checkpoint": write_peft_checkpoint_file(root / "ddp", wrapped)}
    truth = merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in modules.items()})
    return base, config, weights, modules, inputs, truth


@pytest.mark.parametrize("source", ["peft", "peft-checkpoint"])
def test_peft_adapters_fuse_exactly_and_write_back_as_peft(source, adapters, tmp_path):
    base, config, weights, modules, inputs, truth = adapters
    result = export(inputs[source], tmp_path / "peft", base=base, lora_format="peft")
    assert result.family == "Kandinsky 6" and result.lora["modules"] == len(modules)
    assert_all_equal(peft_fused(Kandinsky6Transformer3DModel, config, weights, tmp_path / "peft"), truth)
    export(inputs[source], tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
