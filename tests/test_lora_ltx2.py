"""LTX-2 LoRAs in every layout its trainers write, written as every other, at exactly the trained strength, and fused
into the Diffusers transformer and into the release's single file with every model beside it.

The layouts: Diffusers' (LTX2Pipeline.save_lora_weights; SimpleTuner saves this way), PEFT's adapter folder and a
PEFT-wrapped training checkpoint, ComfyUI's release names behind diffusion_model. (lora_A / lora_B or lora_down /
lora_up, .alpha), diffusion-pipe's (PEFT's lora_A / lora_B on ComfyUI's model, diffusion_model. prefix, the alpha in
the adapter_config.json beside), ai-toolkit's (its adapter renamed to the release names, no alpha) and DiffSynth-Studio's
(made here by DiffSynth's own LTX-2 model and PEFT call, release names, lora_A.default). The release names differ from
Diffusers' for the layers outside the blocks (patchify_proj, adaln_single, av_ca_*_adaln_single) and the
query / key norms; the blocks' linear layers keep their names.

The judges: Diffusers' LTX-2 loader (LTX2Pipeline.lora_state_dict, which converts the diffusion_model. layout itself,
load_lora_adapter, fuse_lora at 1.0), PEFT's own merge, and W + (alpha / r) B A computed here in PEFT's operation
order.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from conftest import snapshot
from diffusers import LTX2Pipeline, LTX2VideoTransformer3DModel
from fixtures import SCRIPTS
from lora_helpers import (assert_all_equal, assert_any_to_any_to_any, diffusers_fused, merged, peft_fused, peft_wrapped,
                          random_modules, write_comfyui_lora, write_diffusers_lora, write_peft_adapter,
                          write_peft_checkpoint_file)
from ltx2_fixtures import tiny_pipeline
from safetensors.torch import load_file, save_file

from cogexport.exporter import export, export_original

sys.path.insert(0, str(SCRIPTS))
from make_tiny_ltx2 import build_transformer, transformer_config  # noqa: E402

OUTPUTS = ("diffusers", "peft", "comfyui")
OUTPUT_FILE = {"diffusers": "pytorch_lora_weights.safetensors", "peft": "adapter_model.safetensors",
               "comfyui": "lora.safetensors"}
# The release (and ComfyUI) names of the Diffusers modules named otherwise there.
ORIGINAL = {"proj_in": "patchify_proj", "audio_proj_in": "audio_patchify_proj", "time_embed": "adaln_single",
            "audio_time_embed": "audio_adaln_single", "av_cross_attn_video_scale_shift": "av_ca_video_scale_shift_adaln_single",
            "av_cross_attn_audio_v2a_gate": "av_ca_v2a_gate_adaln_single"}
ATTENTIONS = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
BLOCK_LAYERS = (*(f"{a}.{p}" for a in ATTENTIONS for p in ("to_q", "to_k", "to_v", "to_out.0")),
                "ff.net.0.proj", "ff.net.2", "audio_ff.net.0.proj", "audio_ff.net.2")
OUTSIDE_LAYERS = ("proj_in", "audio_proj_in", "time_embed.linear", "audio_time_embed.emb.timestep_embedder.linear_1",
                  "av_cross_attn_video_scale_shift.linear", "av_cross_attn_audio_v2a_gate.linear",
                  "caption_projection.linear_2", "audio_caption_projection.linear_1", "proj_out", "audio_proj_out")
MODULES = 2 * len(BLOCK_LAYERS) + len(OUTSIDE_LAYERS)


def original(module: str) -> str:
    first, _, rest = module.partition(".")
    return ".".join(filter(None, (ORIGINAL.get(first, first), rest)))


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
    """LTX2Pipeline.save_lora_weights: what Diffusers' training scripts and SimpleTuner save."""
    return write_diffusers_lora(LTX2Pipeline, folder, adapter.modules)


def write_comfyui(path: Path, adapter: Adapter, names: tuple[str, str] = ("A", "B")) -> Path:
    """ComfyUI and ai-toolkit: diffusion_model. + the release names; .alpha where the strength is not 1."""
    return write_comfyui_lora(path, {original(module): lora for module, lora in adapter.modules.items()}, names)


def write_diffusion_pipe(folder: Path, adapter: Adapter) -> Path:
    """diffusion-pipe: PEFT's lora_A / lora_B of ComfyUI's model under diffusion_model., one rank and alpha, recorded in
    the adapter_config.json PEFT's LoraConfig writes beside adapter_model.safetensors."""
    from peft import LoraConfig

    (rank, alpha), = {(r, alpha) for _, _, r, alpha in adapter.modules.values()}
    folder.mkdir(parents=True, exist_ok=True)
    LoraConfig(r=rank, lora_alpha=alpha, target_modules=sorted(original(m) for m in adapter.modules)).save_pretrained(
        str(folder))
    tensors = {f"diffusion_model.{original(m)}.lora_{part}.weight": t for m, (a, b, _, _) in adapter.modules.items()
               for part, t in (("A", a), ("B", b))}
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    return folder / "adapter_model.safetensors"


def write_diffsynth(path: Path, adapter: Adapter, config: dict) -> Path:
    """DiffSynth-Studio: its own LTX-2 model (release names) given a PEFT adapter the way its trainer adds one
    (inject_adapter_in_model, lora_alpha = r), the adapter's values set; its trainable tensors as its logger saves
    them (pipe.dit. removed: the model's own names)."""
    from diffsynth_models import diffsynth_module
    from peft import LoraConfig, inject_adapter_in_model

    sizes = {key: config[key] for key in ("num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
                                          "num_layers", "cross_attention_dim", "caption_channels",
                                          "audio_num_attention_heads", "audio_attention_head_dim", "audio_in_channels",
                                          "audio_out_channels", "audio_cross_attention_dim")}
    with torch.device("meta"):
        model = diffsynth_module("ltx2_dit").LTXModel(**sizes)
    (rank, _), = {(r, alpha) for _, _, r, alpha in adapter.modules.values()}
    model = inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=rank,
                                               target_modules=[original(m) for m in adapter.modules]), model)
    trained = {}
    for module, (a, b, _, _) in adapter.modules.items():
        layer = model.get_submodule(original(module))
        trained[f"{original(module)}.lora_A.default.weight"] = a
        trained[f"{original(module)}.lora_B.default.weight"] = b
        assert layer.lora_A["default"].weight.shape == a.shape and layer.lora_B["default"].weight.shape == b.shape
    assert set(trained) == {name for name, p in model.named_parameters() if "lora_" in name}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(trained, path)
    return path


def write_peft(folder: Path, adapter: Adapter, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    return write_peft_adapter(folder, peft_wrapped(LTX2VideoTransformer3DModel, config, weights, adapter.modules))


def write_peft_checkpoint(folder: Path, adapter: Adapter, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    return write_peft_checkpoint_file(folder, peft_wrapped(LTX2VideoTransformer3DModel, config, weights,
                                                           adapter.modules))


# -- judges ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model = build_transformer("render", seed=0)
    folder = tmp_path_factory.mktemp("ltx2-base") / "transformer"
    model.save_pretrained(folder)
    return folder, dict(model.config), {name: t.clone() for name, t in model.state_dict().items()}


def diffusers_judged(path: Path, config: dict, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return diffusers_fused(LTX2Pipeline, LTX2VideoTransformer3DModel, config, weights, path)


def judged(folder: Path, target: str, base_folder: Path, config: dict, weights: dict[str, torch.Tensor]):
    """Our output as its loader applies it: PEFT for peft, Diffusers' LTX-2 loader for diffusers and for comfyui
    files without .alpha (which it refuses: "all keys must contain 'lora'"); a comfyui file with .alpha is read back
    by cogexport into a Diffusers file first."""
    if target == "peft":
        return peft_fused(LTX2VideoTransformer3DModel, config, weights, folder)
    path = folder / OUTPUT_FILE[target]
    if target == "comfyui" and any(name.endswith(".alpha") for name in load_file(path)):
        export(folder, folder.with_name(folder.name + "-read-back"), base=base_folder)
        path = folder.with_name(folder.name + "-read-back") / OUTPUT_FILE["diffusers"]
    return diffusers_judged(path, config, weights)


INPUTS = ("diffusers", "peft", "peft-checkpoint", "comfyui", "comfyui-down-up", "diffusion-pipe", "ai-toolkit",
          "diffsynth")


@pytest.fixture(scope="module")
def synthetic(base, tmp_path_factory):
    _, config, weights = base
    folder = tmp_path_factory.mktemp("ltx2-inputs")
    layers = [*block_layers(), *OUTSIDE_LAYERS]
    adapter = make_adapter(weights, layers)
    one = make_adapter(weights, layers, seed=1, strengths=((4, 8.0),))  # one rank and alpha for every module
    unit = make_adapter(weights, layers, seed=2, strengths=((4, 4.0),))  # scale 1
    return {"diffusers": (write_diffusers(folder / "diffusers", adapter), adapter),
            "peft": (write_peft(folder / "peft", adapter, config, weights), adapter),
            "peft-checkpoint": (write_peft_checkpoint(folder / "ddp", adapter, config, weights), adapter),
            "comfyui": (write_comfyui(folder / "comfyui" / "lora.safetensors", adapter), adapter),
            "comfyui-down-up": (write_comfyui(folder / "comfyui-down-up" / "lora.safetensors", adapter,
                                              ("down", "up")), adapter),
            "diffusion-pipe": (write_diffusion_pipe(folder / "diffusion-pipe" / "epoch2", one), one),
            "ai-toolkit": (write_comfyui(folder / "ai-toolkit" / "ltx2_lora.safetensors", unit), unit),
            "diffsynth": (write_diffsynth(folder / "diffsynth" / "epoch-0.safetensors", unit, config), unit)}


@pytest.mark.parametrize("source", INPUTS)
def test_every_layout_to_every_layout_at_the_trained_strength(source, synthetic, base, tmp_path):
    folder, config, weights = base
    path, adapter = synthetic[source]
    truth = adapter.truth(weights)
    if source in ("diffusers", "ai-toolkit"):  # the input itself, as Diffusers' LTX-2 loader applies it
        assert_all_equal(diffusers_judged(path, config, weights), truth)
    for target in OUTPUTS:
        result = export(path, tmp_path / target, base=folder, lora_format=target)
        assert result.family == "LTX-2" and result.lora["modules"] == MODULES and result.lora["layers"] == 2
        assert_all_equal(judged(tmp_path / target, target, folder, config, weights), truth)
    export(path, tmp_path / "fused", base=folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)


def test_layouts_read_at_their_recorded_strength(synthetic, base, tmp_path):
    """diffusion-pipe's alpha is in its adapter_config.json (ComfyUI would apply the file at scale 1); DiffSynth and
    ai-toolkit record none and apply B A at scale 1."""
    folder = base[0]
    expected = {"diffusion-pipe": (8.0, 2.0), "ai-toolkit": (4.0, 1.0), "diffsynth": (4.0, 1.0)}
    for source, (alpha, scale) in expected.items():
        lora = export(synthetic[source][0], tmp_path / source, base=folder).lora
        assert (lora["family"], lora["alpha"], lora["scale"]) == ("LTX-2", alpha, scale), source
    layouts = {source: export(synthetic[source][0], tmp_path / f"{source}-2", base=folder).lora["layout"]
               for source in ("diffsynth", "diffusion-pipe", "comfyui")}
    assert layouts == {"diffsynth": "ltx2/diffsynth_lora", "diffusion-pipe": "ltx2/comfyui_lora",
                       "comfyui": "ltx2/comfyui_lora"}


def test_any_to_any_to_any_is_exact(synthetic, base, tmp_path):
    folder = base[0]
    for source in ("comfyui", "peft", "diffsynth"):
        assert_any_to_any_to_any(export, synthetic[source][0], source, folder, OUTPUTS, tmp_path)
    comfy = load_file(tmp_path / "peft-comfyui" / OUTPUT_FILE["comfyui"])
    for module, (_, _, rank, alpha) in synthetic["peft"][1].modules.items():
        name = f"diffusion_model.{original(module)}"
        assert f"{name}.lora_A.weight" in comfy and f"{name}.lora_B.weight" in comfy
        assert (comfy[f"{name}.alpha"].item() == alpha) if alpha != rank else f"{name}.alpha" not in comfy


def test_diffusers_reads_our_comfyui_file_without_alpha(base, tmp_path):
    """At scale 1 our comfyui file has no .alpha: Diffusers' LTX-2 loader converts it (renamed layers included) and
    applies it exactly. A .alpha it does not apply (its load_lora_weights refuses such a file: not every key holds
    "lora"; load_lora_adapter given the converted dict applies it at scale 1)."""
    folder, config, weights = base
    unit = make_adapter(weights, [*block_layers(), *OUTSIDE_LAYERS], seed=3).at_scale_one()
    write_diffusers(tmp_path / "in", unit)
    export(tmp_path / "in", tmp_path / "comfyui", base=folder, lora_format="comfyui")
    written = load_file(tmp_path / "comfyui" / OUTPUT_FILE["comfyui"])
    assert not any(name.endswith(".alpha") for name in written)
    assert_all_equal(diffusers_judged(tmp_path / "comfyui" / OUTPUT_FILE["comfyui"], config, weights),
                     unit.truth(weights))
    strong = make_adapter(weights, block_layers(1), seed=4, strengths=((4, 8.0),))
    read = diffusers_judged(write_comfyui(tmp_path / "alpha.safetensors", strong), config, weights)
    assert_all_equal(read, strong.at_scale_one().truth(weights))  # scale 1, not 2


def test_a_lora_fused_into_the_release_file_with_every_model(synthetic, tmp_path, cli):
    """--lora fuse into the whole pipeline (the other models from --base), then --to original: the release's single
    file, the transformer fused (W + (alpha / r) B A, in the release's names) and every other model the base's, as
    ComfyUI loads a release."""
    pipeline = tiny_pipeline("render")
    path, adapter = synthetic["comfyui"]
    weights = load_file(pipeline / "transformer" / "diffusion_pytorch_model.safetensors")
    result = cli(path, tmp_path / "fused", "--lora", "fuse", "--component", "pipeline", "--base", pipeline,
                 "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert cli(tmp_path / "fused", tmp_path / "release", "--to", "original", "--dtype", "fp32").exit_code == 0
    release = load_file(tmp_path / "release" / "ltx-2.safetensors")
    truth = adapter.truth(weights)
    reference = tmp_path / "base-release"
    export_original(pipeline, reference, dtype="fp32", progress=False)
    unchanged = load_file(reference / "ltx-2.safetensors")
    assert set(release) == set(unchanged)
    assert torch.equal(release["model.diffusion_model.patchify_proj.weight"], truth["proj_in.weight"])
    assert torch.equal(release["model.diffusion_model.transformer_blocks.1.audio_to_video_attn.to_v.weight"],
                       truth["transformer_blocks.1.audio_to_video_attn.to_v.weight"])
    changed = {name for name in release if not torch.equal(release[name], unchanged[name])}
    assert changed and all(name.startswith("model.diffusion_model.") for name in changed)
    assert len(changed) == MODULES


def assert_refused(result, *phrases) -> None:
    assert result.exit_code == 2 and len(result.error_lines) == 1, result.stderr
    assert all(phrase in result.error_lines[0] for phrase in phrases), result.error_lines[0]


def test_bad_ltx2_lora_input(cli, tmp_path, synthetic, base):
    comfy = synthetic["comfyui"][0]
    before = snapshot(comfy.parent)
    assert_refused(cli(comfy, tmp_path / "o1", "--lora-format", "musubi", "--base", base[0]),
                   "there is no kohya / musubi-tuner layout for LTX-2 LoRAs")
    tensors = load_file(comfy)
    tensors["diffusion_model.transformer_blocks.0.audio_attn1.to_q.lora_B.weight"] = torch.zeros(8, 3)
    save_file(tensors, tmp_path / "ranks.safetensors")
    assert_refused(cli(tmp_path / "ranks.safetensors", tmp_path / "o2"),
                   "the ranks of transformer_blocks.0.audio_attn1.to_q differ")
    tensors = load_file(comfy)
    tensors["diffusion_model.transformer_blocks.0.audio_attn3.to_q.lora_A.weight"] = torch.zeros(4, 8)
    tensors["diffusion_model.transformer_blocks.0.audio_attn3.to_q.lora_B.weight"] = torch.zeros(8, 4)
    save_file(tensors, tmp_path / "foreign.safetensors")
    assert_refused(cli(tmp_path / "foreign.safetensors", tmp_path / "o3"),
                   "transformer_blocks.0.audio_attn3.to_q names no layer of a LTX-2 transformer")
    small = build_transformer("render", seed=0)
    bigger = LTX2VideoTransformer3DModel.from_config({**transformer_config("render"), "attention_head_dim": 16})
    bigger.save_pretrained(tmp_path / "bigger")
    assert small.config.attention_head_dim != bigger.config.attention_head_dim
    assert_refused(cli(comfy, tmp_path / "o4", "--lora", "fuse", "--base", tmp_path / "bigger"),
                   "the adapter does not fit the base model")
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))
    assert snapshot(comfy.parent) == before
