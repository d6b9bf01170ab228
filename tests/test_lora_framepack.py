"""HunyuanVideo FramePack LoRAs: musubi-tuner's (fpack_train_network.py, networks.lora_framepack) fused exactly and
written as the layouts Diffusers and FramePack's front-ends load, at exactly the trained strength.

musubi-tuner names the FramePack model's modules (the release's, which are Diffusers' own) with lora_unet_ and dots as
underscores, and adapts every Linear of the double and single blocks but the norms' modulations (its default
exclude pattern ".*(norm).*"). The adapters are made here on those layers with distinct ranks and alphas, and the truth
W + (alpha / r) B A is computed in PEFT's operation order.

The judges: Diffusers' own loader (HunyuanVideoFramepackPipeline.lora_state_dict + load_lora_adapter, fused at 1.0) for
the Diffusers files, PEFT's merge for PEFT folders; the musubi file equals the one written here from musubi-tuner's
documented layout. Diffusers-named adapters of these blocks have HunyuanVideo's names too: without --base cogexport
asks which model they go on, and a HunyuanVideo LoRA applies to a FramePack base (the layers both have).
"""

from __future__ import annotations

import pytest
import torch
from diffusers import HunyuanVideoFramepackPipeline, HunyuanVideoFramepackTransformer3DModel
from framepack_fixtures import build_tiny_transformer
from lora_helpers import (assert_all_equal, diffusers_fused, header, merged, peft_fused, peft_wrapped, random_modules,
                          write_diffusers_lora, write_musubi_lora, write_peft_adapter, write_peft_checkpoint_file)
from safetensors.torch import load_file, save_file

from cogexport.errors import CogExportError
from cogexport.exporter import export

NETWORK = "networks.lora_framepack"
OUTPUT_FILE = {"diffusers": "pytorch_lora_weights.safetensors", "peft": "adapter_model.safetensors",
               "musubi": "lora.safetensors"}
STRENGTHS = ((4, 8.0), (2, 2.0), (8, 4.0), (4, 3.0), (2, 1.0))
DOUBLE = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
          "attn.to_out.0", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2")
SINGLE = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out")


def musubi_layers(blocks: int = 2) -> list[str]:
    """The Linears musubi-tuner's lora_framepack adapts in HunyuanVideoTransformerBlock and
    HunyuanVideoSingleTransformerBlock (norm1.linear, norm1_context.linear and norm.linear excluded)."""
    return [f"transformer_blocks.{i}.{m}" for i in range(blocks) for m in DOUBLE] + \
        [f"single_transformer_blocks.{i}.{m}" for i in range(blocks) for m in SINGLE]


def truth_of(weights: dict[str, torch.Tensor], modules: dict) -> dict[str, torch.Tensor]:
    return merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in modules.items()})


def write_converted(path, modules: dict):
    """musubi-tuner's convert_lora --target other: diffusion_model. + the names, lora_A / lora_B with the strength
    folded in (here already at scale 1: alpha = r), no .alpha."""
    tensors = {f"diffusion_model.{m}.lora_{part}.weight": t for m, (a, b, _, _) in modules.items()
               for part, t in (("A", a), ("B", b))}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path)
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model = build_tiny_transformer(seed=0)
    folder = tmp_path_factory.mktemp("framepack-base") / "transformer"
    model.save_pretrained(folder)
    return folder, dict(model.config), {name: t.clone() for name, t in model.state_dict().items()}


@pytest.fixture(scope="module")
def synthetic(base, tmp_path_factory):
    folder, config, weights = base
    inputs = tmp_path_factory.mktemp("framepack-inputs")
    shapes = {n: t.shape for n, t in weights.items()}
    modules = random_modules(shapes, musubi_layers(), 0, STRENGTHS)
    unit = {m: (a, b, r, float(r)) for m, (a, b, r, _) in modules.items()}
    wrapped = peft_wrapped(HunyuanVideoFramepackTransformer3DModel, config, weights, modules)
    return {"musubi": (write_musubi_lora(inputs / "musubi" / "lora.safetensors", modules, NETWORK), modules),
            "converted": (write_converted(inputs / "converted" / "lora.safetensors", unit), unit),
            "diffusers": (write_diffusers_lora(HunyuanVideoFramepackPipeline, inputs / "diffusers", modules), modules),
            "peft": (write_peft_adapter(inputs / "peft", wrapped), modules),
            "peft-checkpoint": (write_peft_checkpoint_file(inputs / "ddp", wrapped), modules)}


def judged(folder, target: str, config: dict, weights: dict[str, torch.Tensor], base):
    """Our output as its loader applies it: PEFT for peft, Diffusers' FramePack pipeline loader for diffusers; the
    musubi file read back by cogexport into a Diffusers file first."""
    if target == "peft":
        return peft_fused(HunyuanVideoFramepackTransformer3DModel, config, weights, folder)
    if target != "diffusers":
        export(folder, folder.with_name(folder.name + "-read-back"), base=base, lora_format="diffusers")
        folder = folder.with_name(folder.name + "-read-back")
    return diffusers_fused(HunyuanVideoFramepackPipeline, HunyuanVideoFramepackTransformer3DModel, config, weights,
                           folder / OUTPUT_FILE["diffusers"])


@pytest.mark.parametrize("source", ["musubi", "converted", "diffusers", "peft", "peft-checkpoint"])
def test_every_layout_fuses_exactly_and_writes_what_the_loaders_read(source, synthetic, base, tmp_path):
    folder, config, weights = base
    path, modules = synthetic[source]
    truth = truth_of(weights, modules)
    result = export(path, tmp_path / "fused", base=folder, lora="fuse", dtype="fp32")
    assert result.family == "HunyuanVideo FramePack"
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
    if source not in ("musubi", "diffusers"):
        return
    for target in OUTPUT_FILE:
        result = export(path, tmp_path / target, base=folder, lora_format=target)
        assert result.family == "HunyuanVideo FramePack" and result.lora["modules"] == len(modules)
        assert_all_equal(judged(tmp_path / target, target, config, weights, folder), truth)
    expected = load_file(write_musubi_lora(tmp_path / "expected.safetensors", modules, NETWORK))
    assert_all_equal(load_file(tmp_path / "musubi" / OUTPUT_FILE["musubi"]), expected)
    assert header(tmp_path / "musubi" / OUTPUT_FILE["musubi"])["ss_network_module"] == NETWORK


def test_diffusers_named_adapters_need_the_base_to_say_which_model(synthetic, tmp_path):
    """A Diffusers-named adapter of the double and single blocks fits HunyuanVideo's transformer as well as
    FramePack's: with no --base cogexport asks rather than guesses."""
    with pytest.raises(CogExportError, match="HunyuanVideo and HunyuanVideo FramePack models all have; pass --base"):
        export(synthetic["diffusers"][0], tmp_path / "out", lora_format="peft")
    assert not (tmp_path / "out").exists()


def test_a_hunyuanvideo_lora_applies_to_a_framepack_base(synthetic, base, tmp_path):
    """HunyuanVideo's musubi layout (original names: fused qkv, linear1) on a FramePack --base: FramePack extends
    HunyuanVideo, so the adapter's HunyuanVideo layers fuse into the FramePack model's."""
    folder, config, weights = base
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    generator = torch.Generator().manual_seed(7)
    a, b = torch.randn(4, hidden, generator=generator), torch.randn(3 * hidden, 4, generator=generator)
    path = tmp_path / "hv" / "lora.safetensors"
    path.parent.mkdir()
    save_file({"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": a,
               "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": b,
               "lora_unet_double_blocks_0_img_attn_qkv.alpha": torch.tensor(4.0)}, path,
              metadata={"ss_network_module": "networks.lora"})
    result = export(path, tmp_path / "fused", base=folder, lora="fuse", dtype="fp32")
    assert result.family == "HunyuanVideo FramePack"
    truth = merged(weights, {f"transformer_blocks.0.attn.to_{p}": (a, b[i * hidden:(i + 1) * hidden], 1.0)
                             for i, p in enumerate("qkv")})
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)


def test_the_release_folder_is_a_base(synthetic, base, tmp_path):
    """lllyasviel/FramePackI2V_HY as downloaded (the Packed class's config.json, shards) is --base for fusing: its
    config translated, its weights read."""
    from framepack_fixtures import release_folder

    _, config, weights = base
    model = HunyuanVideoFramepackTransformer3DModel.from_config(config)
    model.load_state_dict(weights)
    release = release_folder(tmp_path / "FramePackI2V_HY", model)
    path, modules = synthetic["musubi"]
    result = export(path, tmp_path / "fused", base=release, lora="fuse", dtype="fp32")
    assert result.family == "HunyuanVideo FramePack"
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth_of(weights, modules))
