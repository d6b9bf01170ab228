"""LTX-Video LoRAs in every trainer's layout, written as every other, at exactly the trained strength.

LTX-Video's original names differ from Diffusers' in four places (patchify_proj -> proj_in, adaln_single ->
time_embed, q_norm / k_norm -> norm_q / norm_k; docs/video-dit-formats.md 3.2, written out below), with no splits.
Adapters are made here with distinct ranks and alphas on every linear layer of the blocks and outside them;
W + (alpha / r) B A is computed here in PEFT's operation order.

The judges: Diffusers' LTX-Video loader (lora_state_dict + load_lora_adapter, fuse_lora at 1.0) for Diffusers files,
PEFT's own merge for PEFT folders. For ComfyUI files (diffusion_model. + original names) Diffusers' loader only swaps
the prefix: it reads lora_A / lora_B (not lora_down / lora_up), applies no .alpha and leaves the renamed layers out;
so it judges our comfyui output directly where it can (a scale-1 adapter on the blocks), and otherwise our comfyui
output must equal, tensor for tensor, the file written here from the documented names, and read back fuse to the
truth through Diffusers.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from conftest import snapshot
from diffusers import LTXPipeline, LTXVideoTransformer3DModel
from fixtures import SCRIPTS
from lora_helpers import (USUAL, adapter_metadata, assert_all_equal, assert_any_to_any_to_any, diffusers_fused, merged,
                          peft_fused, peft_wrapped, random_modules, write_comfyui_lora, write_diffusers_lora,
                          write_finetrainers_lora, write_peft_adapter, write_peft_checkpoint_file)
from safetensors.torch import load_file, save_file

from cogexport.exporter import export

sys.path.insert(0, str(SCRIPTS))
from make_tiny_ltx_video import build_transformer  # noqa: E402

OUTPUTS = ("diffusers", "peft", "comfyui")
OUTPUT_FILE = {"diffusers": "pytorch_lora_weights.safetensors", "peft": "adapter_model.safetensors",
               "comfyui": "lora.safetensors"}
# The original (and ComfyUI) names of the Diffusers modules that have other names there.
ORIGINAL = {"proj_in": "patchify_proj", "time_embed.linear": "adaln_single.linear",
            "time_embed.emb.timestep_embedder.linear_1": "adaln_single.emb.timestep_embedder.linear_1",
            "time_embed.emb.timestep_embedder.linear_2": "adaln_single.emb.timestep_embedder.linear_2"}
BLOCK_LAYERS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
                "attn2.to_out.0", "ff.net.0.proj", "ff.net.2")
OUTSIDE_LAYERS = ("proj_in", "time_embed.linear", "time_embed.emb.timestep_embedder.linear_1",
                  "caption_projection.linear_2", "proj_out")


def original(module: str) -> str:
    return ORIGINAL.get(module, module)


def block_layers(blocks: int = 2) -> list[str]:
    return [f"transformer_blocks.{i}.{layer}" for i in range(blocks) for layer in BLOCK_LAYERS]


# (rank, alpha) per module, cycled: distinct ranks and strengths
STRENGTHS = ((4, 8.0), (4, 2.0), (8, 8.0), (4, 16.0), (2, 1.0), (8, 32.0), (4, 3.0))


@dataclass
class Adapter:
    modules: dict[str, tuple[torch.Tensor, torch.Tensor, int, float]]  # Diffusers module -> (A, B, rank, alpha)

    def truth(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in self.modules.items()})

    def at_scale_one(self) -> "Adapter":
        return replace(self, modules={m: (a, b, r, float(r)) for m, (a, b, r, _) in self.modules.items()})


def make_adapter(weights: dict[str, torch.Tensor], modules, seed: int = 0, strengths=STRENGTHS) -> Adapter:
    return Adapter(random_modules({name: t.shape for name, t in weights.items()}, modules, seed, strengths))


# -- the trainers' layouts ------------------------------------------------------------------------------------------
def write_diffusers(folder: Path, adapter: Adapter) -> Path:
    return write_diffusers_lora(LTXPipeline, folder, adapter.modules)


def write_finetrainers(path: Path, adapter: Adapter) -> Path:
    return write_finetrainers_lora(path, adapter.modules)


def write_comfyui(path: Path, adapter: Adapter, names: tuple[str, str] = ("A", "B")) -> Path:
    """lora_A / lora_B by default (or lora_down / lora_up)."""
    return write_comfyui_lora(path, {original(module): lora for module, lora in adapter.modules.items()}, names)


def write_peft(folder: Path, adapter: Adapter, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    return write_peft_adapter(folder, peft_wrapped(LTXVideoTransformer3DModel, config, weights, adapter.modules))


def write_peft_checkpoint(folder: Path, adapter: Adapter, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    return write_peft_checkpoint_file(folder, peft_wrapped(LTXVideoTransformer3DModel, config, weights,
                                                           adapter.modules))


# -- judges ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model = build_transformer("2b", seed=0)
    folder = tmp_path_factory.mktemp("ltx-base") / "transformer"
    model.save_pretrained(folder)
    return folder, dict(model.config), {name: t.clone() for name, t in model.state_dict().items()}


def diffusers_judged(path: Path, config: dict, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return diffusers_fused(LTXPipeline, LTXVideoTransformer3DModel, config, weights, path)


def judged(folder: Path, target: str, base_folder: Path, config: dict, weights: dict[str, torch.Tensor]):
    """Our output as its loader applies it: PEFT for peft, Diffusers for diffusers; a comfyui file (whose alphas and
    renamed layers Diffusers' loader would miss) read back by cogexport into a Diffusers file first."""
    if target == "peft":
        return peft_fused(LTXVideoTransformer3DModel, config, weights, folder)
    if target == "comfyui":
        export(folder, folder.with_name(folder.name + "-read-back"), base=base_folder)
        folder = folder.with_name(folder.name + "-read-back")
    return diffusers_judged(folder / OUTPUT_FILE["diffusers"], config, weights)


INPUTS = ("diffusers", "finetrainers", "peft", "peft-checkpoint", "comfyui", "comfyui-down-up")


@pytest.fixture(scope="module")
def synthetic(base, tmp_path_factory):
    _, config, weights = base
    folder = tmp_path_factory.mktemp("ltx-inputs")
    adapter = make_adapter(weights, [*block_layers(), *OUTSIDE_LAYERS])
    one = make_adapter(weights, [*block_layers(), *OUTSIDE_LAYERS], strengths=(USUAL,))  # finetrainers: one alpha
    return {"diffusers": (write_diffusers(folder / "diffusers", adapter), adapter),
            "finetrainers": (write_finetrainers(folder / "finetrainers" / "lora_weights" / "000002" /
                                                "pytorch_lora_weights.safetensors", one), one),
            "peft": (write_peft(folder / "peft", adapter, config, weights), adapter),
            "peft-checkpoint": (write_peft_checkpoint(folder / "ddp", adapter, config, weights), adapter),
            "comfyui": (write_comfyui(folder / "comfyui" / "lora.safetensors", adapter), adapter),
            "comfyui-down-up": (write_comfyui(folder / "comfyui-down-up" / "lora.safetensors", adapter,
                                              ("down", "up")), adapter)}


@pytest.mark.parametrize("source", INPUTS)
def test_every_layout_to_every_layout_at_the_trained_strength(source, synthetic, base, tmp_path):
    folder, config, weights = base
    path, adapter = synthetic[source]
    truth = adapter.truth(weights)
    if source == "diffusers":  # the input itself, as Diffusers applies it
        assert_all_equal(diffusers_judged(path, config, weights), truth)
    for target in OUTPUTS:
        result = export(path, tmp_path / target, base=folder, lora_format=target)
        assert result.family == "LTX-Video" and result.lora["modules"] == 25 and result.lora["layers"] == 2
        assert result.lora["ranks"] == ([4] if source == "finetrainers" else [2, 4, 8])
        assert_all_equal(judged(tmp_path / target, target, folder, config, weights), truth)
    # ComfyUI's file as a trainer writes it, lora_A / lora_B, which both ComfyUI and Diffusers' loader read
    assert_all_equal(load_file(tmp_path / "comfyui" / OUTPUT_FILE["comfyui"]),
                     load_file(write_comfyui(tmp_path / "expected.safetensors", adapter)))
    export(path, tmp_path / "fused", base=folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)



def test_any_to_any_to_any_is_exact(synthetic, base, tmp_path):
    folder = base[0]
    for source in ("comfyui", "peft"):
        assert_any_to_any_to_any(export, synthetic[source][0], source, folder, OUTPUTS, tmp_path)
    metadata = adapter_metadata(tmp_path / "comfyui-diffusers" / OUTPUT_FILE["diffusers"])
    assert metadata["transformer.rank_pattern"] and metadata["transformer.alpha_pattern"]
    comfy = load_file(tmp_path / "peft-comfyui" / OUTPUT_FILE["comfyui"])
    adapter = synthetic["peft"][1].modules
    assert comfy["diffusion_model.adaln_single.linear.alpha"].item() == adapter["time_embed.linear"][3] == 8.0
    assert adapter["transformer_blocks.0.attn1.to_v"][2:] == (8, 8.0)  # alpha = r: ComfyUI's scale 1 needs no .alpha
    assert "diffusion_model.transformer_blocks.0.attn1.to_v.alpha" not in comfy


def test_diffusers_reads_our_comfyui_file_where_it_can(base, tmp_path):
    """Diffusers' LTX-Video loader swaps the diffusion_model. prefix and nothing else: on the blocks (whose names do
    not change) at scale 1 it applies our comfyui file right. A .alpha it leaves out (scale 1), and adapters of
    renamed layers (patchify_proj, adaln_single) it does not load; lora_down / lora_up it fails on."""
    folder, config, weights = base
    unit = make_adapter(weights, block_layers(), seed=2).at_scale_one()
    write_diffusers(tmp_path / "in", unit)
    export(tmp_path / "in", tmp_path / "comfyui", base=folder, lora_format="comfyui")
    assert_all_equal(diffusers_judged(tmp_path / "comfyui" / OUTPUT_FILE["comfyui"], config, weights),
                     unit.truth(weights))

    strong = make_adapter(weights, block_layers(1), seed=3, strengths=((4, 8.0),))
    read = diffusers_judged(write_comfyui(tmp_path / "alpha.safetensors", strong), config, weights)
    assert_all_equal(read, strong.at_scale_one().truth(weights))  # scale 1, not 2
    renamed = make_adapter(weights, ["proj_in", *block_layers(1)], seed=4).at_scale_one()
    read = diffusers_judged(write_comfyui(tmp_path / "renamed.safetensors", renamed), config, weights)
    expected = renamed.truth(weights)
    assert [name for name in expected if not torch.equal(read[name], expected[name])] == ["proj_in.weight"]
    with pytest.raises(IndexError):
        diffusers_judged(write_comfyui(tmp_path / "down-up.safetensors", unit, ("down", "up")), config, weights)


def test_finetrainers_lora_config_gives_the_strength_diffusers_would_miss(synthetic, base, tmp_path, cli):
    folder, config, weights = base
    path, adapter = synthetic["finetrainers"]
    assert_all_equal(diffusers_judged(path, config, weights), adapter.at_scale_one().truth(weights))  # scale 1
    # (LTX-2 has every LTX-Video layer name too: at a tiny size only --base tells the two apart)
    lora = export(path, tmp_path / "out", base=folder).lora
    assert (lora["family"], lora["alpha"], lora["alpha_source"]) == \
        ("LTX-Video", 8.0, "the file's lora_config (finetrainers)")


def test_inspect_says_what_each_file_is(synthetic, base, tmp_path, cli):
    """What each file is, as the export reports it (LTX-2 has every LTX-Video layer name too: at a tiny size, --base
    tells them apart; inspect, which takes no --base, says that it cannot)."""
    expected = {"comfyui": ("ltx_video/comfyui_lora", "the file's .alpha tensors", False),
                "diffusers": ("ltx_video/diffusers_lora", "the file's lora_adapter_metadata", False),
                "peft-checkpoint": ("ltx_video/peft_lora", f"recorded in {synthetic['peft-checkpoint'][0].parent}"
                                                           "/adapter_config.json", True)}
    for source, (layout, alpha_source, base_weights) in expected.items():
        result = cli("inspect", synthetic[source][0], "--json")
        assert result.exit_code == 1, result.stderr  # not usable as it is: the export needs --base
        assert "LTX-2 and LTX-Video" in json.loads(result.stdout)["models"]["lora"]["problem"]
        lora = export(synthetic[source][0], tmp_path / source, base=base[0]).lora
        assert (lora["family"], lora["layout"], lora["alpha_source"], lora["base_weights"]) == \
            ("LTX-Video", layout, alpha_source, base_weights)
        assert (lora["modules"], lora["layers"], lora["ranks"]) == (25, 2, [2, 4, 8])


def test_names_cogvideox_shares_are_told_apart_by_the_published_sizes(base, tmp_path, cli):
    """transformer_blocks.N.attn1.to_q and friends are CogVideoX's (and Cosmos's) names too: a Diffusers file adapting
    those is LTX-Video's by the layer sizes of the published models (2048 wide: LTX-Video 2B) once they tell it from
    Cosmos 2B's, as 2048 wide: its cross-attention's keys come from 2048-wide captions, Cosmos's from 1024-wide text;
    at a size no release has, --base says which."""
    folder, config, weights = base
    layers = [f"transformer_blocks.{i}.attn1.{p}" for i in range(2) for p in ("to_q", "to_k", "to_v", "to_out.0")]
    generator = torch.Generator().manual_seed(8)

    def inspected(modules: list[str]) -> dict:
        save_file({f"transformer.{m}.lora_{part}.weight": torch.randn(shape, generator=generator)
                   for m in modules for part, shape in (("A", (4, 2048)), ("B", (2048, 4)))},
                  tmp_path / "released.safetensors")
        return json.loads(cli("inspect", tmp_path / "released.safetensors", "--json").stdout)["models"]["lora"]

    assert "Cosmos" in inspected(layers)["problem"]  # LTX-Video 2B's self-attention is Cosmos 2B's size
    assert inspected([*layers, "transformer_blocks.0.attn2.to_k"])["family"] == "LTX-Video"

    tiny = make_adapter(weights, layers, seed=9)
    path = write_diffusers(tmp_path / "tiny", tiny)
    problem = json.loads(cli("inspect", path, "--json").stdout)["models"]["lora"]["problem"]
    # SimpleTuner's SanaVideo targets are these very layers too
    assert "CogVideoX, Cosmos, LTX-2, LTX-Video and SanaVideo" in problem and "pass --base" in problem
    assert export(path, tmp_path / "out", base=folder).family == "LTX-Video"
    assert_all_equal(diffusers_judged(tmp_path / "out" / OUTPUT_FILE["diffusers"], config, weights),
                     tiny.truth(weights))


def assert_refused(result, *phrases) -> None:
    assert result.exit_code == 2 and len(result.error_lines) == 1, result.stderr
    assert all(phrase in result.error_lines[0] for phrase in phrases), result.error_lines[0]


def test_bad_ltx_video_lora_input(cli, tmp_path, synthetic, base):
    from hunyuanvideo_fixtures import build_tiny_transformer as build_hunyuanvideo

    comfy = synthetic["comfyui"][0]
    before = snapshot(comfy.parent)
    build_hunyuanvideo("t2v").save_pretrained(tmp_path / "hunyuanvideo")
    # (the file is an LTX-Video or an LTX-2 LoRA: both have these layers)
    assert_refused(cli(comfy, tmp_path / "o1", "--base", tmp_path / "hunyuanvideo"), "names no layer of a HunyuanVideo")
    assert_refused(cli(comfy, tmp_path / "o2", "--lora-format", "musubi", "--base", base[0]),
                   "there is no kohya / musubi-tuner layout "
                   "for LTX-Video LoRAs", "write one of diffusers, peft, comfyui")

    tensors = load_file(comfy)
    tensors["diffusion_model.transformer_blocks.0.attn1.to_q.lora_B.weight"] = torch.zeros(16, 3)
    save_file(tensors, tmp_path / "ranks.safetensors")
    assert_refused(cli(tmp_path / "ranks.safetensors", tmp_path / "o3"),
                   "the ranks of transformer_blocks.0.attn1.to_q differ")

    tensors = load_file(comfy)
    tensors["diffusion_model.transformer_blocks.0.attn3.to_q.lora_A.weight"] = torch.zeros(4, 16)
    tensors["diffusion_model.transformer_blocks.0.attn3.to_q.lora_B.weight"] = torch.zeros(16, 4)
    save_file(tensors, tmp_path / "foreign.safetensors")
    assert_refused(cli(tmp_path / "foreign.safetensors", tmp_path / "o4"),
                   "transformer_blocks.0.attn3.to_q names no layer of a LTX")  # (LTX-2's or LTX-Video's)
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))
    assert snapshot(comfy.parent) == before
