"""Kandinsky 5 LoRAs in every trainer's layout, written as every other, at exactly the trained strength.

Every layout names the release's modules, which are Diffusers' own: musubi-tuner's networks.lora_kandinsky
(lora_unet_visual_transformer_blocks_0_self_attention_to_query, with .alpha), ComfyUI and diffusion-pipe
(diffusion_model. + the names; diffusion-pipe's lora_A / lora_B with adapter_config.json beside), Diffusers
(transformer. + the names, lora_adapter_metadata) and PEFT. The adapters are made here on the layers musubi-tuner
targets (the attention and feed-forward linears of the text and visual blocks) with distinct ranks and alphas, and the
truth W + (alpha / r) B A is computed in PEFT's operation order.

The judges: Diffusers' own Kandinsky 5 LoRA loader (KandinskyLoraLoaderMixin: Kandinsky5T2VPipeline.lora_state_dict +
load_lora_adapter, fused at 1.0) for the Diffusers files, PEFT's merge for PEFT folders; our musubi and ComfyUI files
equal the files written here from the trainers' documented layouts, and read back they fuse to the truth.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from diffusers import Kandinsky5T2VPipeline, Kandinsky5Transformer3DModel
from kandinsky5_fixtures import build_tiny_transformer
from lora_helpers import (USUAL, assert_all_equal, assert_any_to_any_to_any, diffusers_fused, header, merged,
                          peft_fused, peft_patterns, peft_wrapped, random_modules, write_comfyui_lora,
                          write_diffusers_lora, write_finetrainers_lora, write_musubi_lora, write_peft_adapter,
                          write_peft_checkpoint_file)
from safetensors.torch import load_file, save_file

from cogexport.exporter import export

OUTPUTS = ("diffusers", "peft", "comfyui", "musubi")
OUTPUT_FILE = {"diffusers": "pytorch_lora_weights.safetensors", "peft": "adapter_model.safetensors",
               "comfyui": "lora.safetensors", "musubi": "lora.safetensors"}
ATTENTION = ("to_query", "to_key", "to_value", "out_layer")
STRENGTHS = ((4, 8.0), (2, 2.0), (8, 4.0), (4, 3.0), (2, 1.0))


def musubi_layers(blocks: int = 2) -> list[str]:
    """The layers musubi-tuner's lora_kandinsky targets by default (its include patterns; modulations excluded)."""
    layers = []
    for i in range(blocks):
        layers += [f"text_transformer_blocks.{i}.self_attention.{p}" for p in ATTENTION]
        layers += [f"text_transformer_blocks.{i}.feed_forward.{p}" for p in ("in_layer", "out_layer")]
        layers += [f"visual_transformer_blocks.{i}.{a}.{p}" for a in ("self_attention", "cross_attention")
                   for p in ATTENTION]
        layers += [f"visual_transformer_blocks.{i}.feed_forward.{p}" for p in ("in_layer", "out_layer")]
    return layers


def make_adapter(weights: dict[str, torch.Tensor], seed: int = 0, strengths=STRENGTHS) -> dict:
    return random_modules({n: t.shape for n, t in weights.items()}, musubi_layers(), seed, strengths)


def truth_of(weights: dict[str, torch.Tensor], modules: dict) -> dict[str, torch.Tensor]:
    return merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in modules.items()})


def write_diffusion_pipe(folder: Path, modules: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"diffusion_model.{m}.lora_{part}.weight": t for m, (a, b, _, _) in modules.items()
               for part, t in (("A", a), ("B", b))}
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **peft_patterns(modules)}))
    return folder / "adapter_model.safetensors"


def judged(folder: Path, target: str, config: dict, weights: dict[str, torch.Tensor], base: Path):
    """Our output as its loader applies it: PEFT for peft, Diffusers' Kandinsky loader for diffusers; the musubi and
    comfyui files read back by cogexport into a Diffusers file first."""
    if target == "peft":
        return peft_fused(Kandinsky5Transformer3DModel, config, weights, folder)
    if target != "diffusers":
        export(folder, folder.with_name(folder.name + "-read-back"), base=base, lora_format="diffusers")
        folder = folder.with_name(folder.name + "-read-back")
    return diffusers_fused(Kandinsky5T2VPipeline, Kandinsky5Transformer3DModel, config, weights,
                           folder / OUTPUT_FILE["diffusers"])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model = build_tiny_transformer("t2v", seed=0)
    folder = tmp_path_factory.mktemp("kandinsky5-base") / "transformer"
    model.save_pretrained(folder)
    return folder, dict(model.config), {name: t.clone() for name, t in model.state_dict().items()}


@pytest.fixture(scope="module")
def synthetic(base, tmp_path_factory):
    folder, config, weights = base
    inputs = tmp_path_factory.mktemp("kandinsky5-inputs")
    modules = make_adapter(weights)
    unit = {m: (a, b, r, float(r)) for m, (a, b, r, _) in modules.items()}
    one = make_adapter(weights, seed=1, strengths=(USUAL,))
    wrapped = peft_wrapped(Kandinsky5Transformer3DModel, config, weights, modules)
    return {"musubi": (write_musubi_lora(inputs / "musubi" / "lora.safetensors", modules, "networks.lora_kandinsky"),
                       modules),
            "comfyui": (write_comfyui_lora(inputs / "comfyui" / "lora.safetensors", modules), modules),
            "comfyui-ab": (write_comfyui_lora(inputs / "comfyui-ab" / "lora.safetensors", unit, parts=("A", "B")),
                           unit),
            "diffusion-pipe": (write_diffusion_pipe(inputs / "diffusion-pipe", modules), modules),
            "diffusers": (write_diffusers_lora(Kandinsky5T2VPipeline, inputs / "diffusers", modules), modules),
            "finetrainers": (write_finetrainers_lora(inputs / "finetrainers" / "pytorch_lora_weights.safetensors",
                                                     one), one),
            "peft": (write_peft_adapter(inputs / "peft", wrapped), modules),
            "peft-checkpoint": (write_peft_checkpoint_file(inputs / "ddp", wrapped), modules)}


INPUTS = ("musubi", "comfyui", "comfyui-ab", "diffusion-pipe", "diffusers", "finetrainers", "peft", "peft-checkpoint")
WRITERS = {"musubi": lambda path, modules: write_musubi_lora(path, modules, "networks.lora_kandinsky"),
           "comfyui": write_comfyui_lora}


@pytest.mark.parametrize("source", INPUTS)
def test_every_layout_to_every_layout_at_the_trained_strength(source, synthetic, base, tmp_path):
    folder, config, weights = base
    path, modules = synthetic[source]
    truth = truth_of(weights, modules)
    if source == "diffusers":  # the input itself, as Diffusers' own loader applies it
        assert_all_equal(diffusers_fused(Kandinsky5T2VPipeline, Kandinsky5Transformer3DModel, config, weights, path),
                         truth)
    for target in OUTPUTS:
        result = export(path, tmp_path / target, base=folder, lora_format=target)
        assert result.family == "Kandinsky 5" and result.lora["modules"] == len(modules)
        assert_all_equal(judged(tmp_path / target, target, config, weights, folder), truth)
        if target in WRITERS:
            expected = load_file(WRITERS[target](tmp_path / f"expected-{target}.safetensors", modules))
            assert_all_equal(load_file(tmp_path / target / OUTPUT_FILE[target]), expected)
    export(path, tmp_path / "fused", base=folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)


def test_any_to_any_to_any_is_exact(synthetic, base, tmp_path):
    folder = base[0]
    for source in ("musubi", "peft"):
        assert_any_to_any_to_any(export, synthetic[source][0], source, folder, OUTPUTS, tmp_path)
    assert header(tmp_path / "peft-musubi" / "lora.safetensors")["ss_network_module"] == "networks.lora_kandinsky"


def test_inspect_says_what_each_file_is(synthetic, cli):
    expected = {"musubi": ("kandinsky5/musubi_lora", "the file's .alpha tensors"),
                "comfyui": ("kandinsky5/comfyui_lora", "the file's .alpha tensors"),
                "diffusers": ("kandinsky5/diffusers_lora", "the file's lora_adapter_metadata")}
    for source, (layout, alpha_source) in expected.items():
        result = cli("inspect", synthetic[source][0], "--json")
        assert result.exit_code == 0, result.stderr
        lora = json.loads(result.stdout)["models"]["lora"]
        assert (lora["family"], lora["layout"], lora["alpha_source"]) == ("Kandinsky 5", layout, alpha_source)
        assert lora["ranks"] == [2, 4, 8]
    path = synthetic["diffusion-pipe"][0]
    lora = json.loads(cli("inspect", path, "--json").stdout)["models"]["lora"]
    assert (lora["layout"], lora["per_module_alphas"]) == ("kandinsky5/comfyui_lora", True)
    assert lora["alpha_source"] == f"recorded in {path.parent / 'adapter_config.json'}"


def test_bad_kandinsky5_lora_input(cli, tmp_path, synthetic):
    from conftest import snapshot

    musubi = synthetic["musubi"][0]
    before = snapshot(musubi.parent)
    tensors = load_file(musubi)
    tensors["lora_unet_visual_transformer_blocks_0_self_attention_to_query.lora_up.weight"] = torch.zeros(32, 3)
    save_file(tensors, tmp_path / "ranks.safetensors")
    refused = cli(tmp_path / "ranks.safetensors", tmp_path / "o1")
    assert refused.exit_code == 2 and len(refused.error_lines) == 1, refused.stderr
    assert "the ranks of lora_unet_visual_transformer_blocks_0_self_attention_to_query differ" in refused.stderr
    tensors = load_file(musubi)
    tensors["lora_unet_visual_transformer_blocks_0_self_attention_to_qkv.lora_down.weight"] = torch.zeros(4, 32)
    tensors["lora_unet_visual_transformer_blocks_0_self_attention_to_qkv.lora_up.weight"] = torch.zeros(96, 4)
    save_file(tensors, tmp_path / "unknown.safetensors")
    refused = cli(tmp_path / "unknown.safetensors", tmp_path / "o2")
    assert refused.exit_code == 2 and "names no layer of a Kandinsky 5 transformer" in refused.stderr, refused.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    assert snapshot(musubi.parent) == before
