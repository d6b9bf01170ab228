"""Wan LoRAs in every trainer's layout, written as every other: Diffusers' own Wan loader (which reads Diffusers,
kohya / musubi-tuner and ComfyUI files) and PEFT's own merge load our outputs and fuse them at scale 1.0 to exactly
W + (alpha / r) B A, computed here from the adapter the test made, module by module with distinct ranks and alphas;
so does --lora fuse. The input files are written by the trainers' own code where it is installed (Diffusers'
save_lora_weights, PEFT's save_pretrained) and by hand from the documented layouts otherwise, with the Wan module
names of the docs, never with cogexport's tables."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import assert_refusal, snapshot
from diffusers import WanPipeline, WanTransformer3DModel
from fixtures import SCRIPTS, GroundTruth, cached_fixture
from lora_helpers import (adapter_metadata, assert_all_equal, assert_any_to_any_to_any, diffusers_fused, header, merged,
                          peft_fused, peft_patterns, peft_wrapped, random_modules, write_comfyui_lora,
                          write_diffusers_lora, write_finetrainers_lora, write_musubi_lora, write_peft_adapter)
from safetensors.torch import load_file, save_file
from wan_fixtures import REAL_WAN, TRUTH, real_wan_base

from cogexport.exporter import export

REAL = REAL_WAN  # a tiny real Wan 2.1 and LoRAs written by the trainers
# the base model as a save_pretrained folder, and its weights as the fixture's maker saved them (the truth)
BASE_FOLDER = real_wan_base() if REAL.is_dir() else REAL / "base" / "transformer"
BASE_TRUTH = REAL / "base" / "transformer" / TRUTH
OUTPUTS = ("diffusers", "peft", "comfyui", "musubi")
OUTPUT_FILE = {"diffusers": "pytorch_lora_weights.safetensors", "peft": "adapter_model.safetensors",
               "comfyui": "lora.safetensors", "musubi": "lora.safetensors"}

pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason=f"the real Wan fixtures are not at {REAL}")

# The Wan repo's module names for Diffusers' (docs: video-dit-formats.md 1.2), written out here on purpose.
ORIGINAL_IN_BLOCK = {"attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
                     "attn1.to_out.0": "self_attn.o", "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k",
                     "attn2.to_v": "cross_attn.v", "attn2.to_out.0": "cross_attn.o", "attn2.add_k_proj": "cross_attn.k_img",
                     "attn2.add_v_proj": "cross_attn.v_img", "ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2",
                     "norm2": "norm3"}
ORIGINAL_TOP = {"proj_out": "head.head", "condition_embedder.text_embedder.linear_1": "text_embedding.0",
                "condition_embedder.time_proj": "time_projection.1"}
BLOCK_LAYERS = tuple(ORIGINAL_IN_BLOCK)[:8] + ("ffn.net.0.proj", "ffn.net.2")


def original(module: str) -> str:
    if module in ORIGINAL_TOP:
        return ORIGINAL_TOP[module]
    _, index, rest = module.split(".", 2)
    return f"blocks.{index}.{ORIGINAL_IN_BLOCK[rest]}"


# (rank, alpha) per module, cycled: distinct ranks and strengths; alpha / r a power of two, because Diffusers' Wan
# loader folds alpha / r into A and B of kohya and ComfyUI files (exact only for powers of two)
STRENGTHS = ((4, 8.0), (4, 2.0), (8, 8.0), (4, 16.0), (2, 1.0), (8, 32.0))


@dataclass
class Adapter:
    """A LoRA made here: module -> (A, B, rank, alpha), plus bias and full-weight deltas."""

    modules: dict[str, tuple[torch.Tensor, torch.Tensor, int, float]]
    diff_b: dict[str, torch.Tensor] = field(default_factory=dict)

    def truth(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in self.modules.items()}, self.diff_b)

    def patterns(self) -> dict:
        return peft_patterns(self.modules)


def make_adapter(weights: dict[str, torch.Tensor], modules, seed: int = 0, strengths=STRENGTHS) -> Adapter:
    return Adapter(random_modules({name: t.shape for name, t in weights.items()}, modules, seed, strengths))


# -- the trainers' layouts -----------------------------------------------------------------------------------
def write_diffusers(folder: Path, adapter: Adapter) -> Path:
    return write_diffusers_lora(WanPipeline, folder, adapter.modules)


def write_peft(folder: Path, adapter: Adapter, config: dict, weights: dict[str, torch.Tensor]) -> Path:
    return write_peft_adapter(folder, peft_wrapped(WanTransformer3DModel, config, weights, adapter.modules))


def write_peft_original(folder: Path, adapter: Adapter, wrapped_model: dict[str, torch.Tensor] | None = None) -> Path:
    """PEFT on the Wan repo's WanModel, by hand: its adapter folder, or (given the original weights) a DDP checkpoint
    of the wrapped model (module.blocks.0.self_attn.q.base_layer.weight, ...lora_A.default.weight)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = adapter.patterns()
    config = {**config, "target_modules": sorted(original(m) for m in adapter.modules),
              "rank_pattern": {original(m): r for m, r in config["rank_pattern"].items()},
              "alpha_pattern": {original(m): a for m, a in config["alpha_pattern"].items()}}
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **config}))
    lora = {f"{original(m)}.lora_{part}": t for m, (a, b, _, _) in adapter.modules.items() for part, t in (("A", a), ("B", b))}
    if wrapped_model is None:
        save_file({f"base_model.model.{name}.weight": t for name, t in lora.items()}, folder / "adapter_model.safetensors")
        return folder / "adapter_model.safetensors"
    adapted = {original(m) for m in adapter.modules}
    tensors = {f"module.{name.rsplit('.', 1)[0]}.base_layer.{name.rsplit('.', 1)[1]}" if name.rsplit(".", 1)[0] in adapted
               else f"module.{name}": t for name, t in wrapped_model.items()}
    tensors.update({f"module.{name}.default.weight": t for name, t in lora.items()})
    save_file(tensors, folder / "model.safetensors")
    return folder / "model.safetensors"


def write_musubi(path: Path, adapter: Adapter) -> Path:
    return write_musubi_lora(path, {original(module): lora for module, lora in adapter.modules.items()},
                             "networks.lora_wan")


def write_comfyui(path: Path, adapter: Adapter, extra: dict[str, torch.Tensor] | None = None) -> Path:
    """With the adapter's bias deltas as .diff_b."""
    deltas = {f"diffusion_model.{original(module)}.diff_b": delta for module, delta in adapter.diff_b.items()}
    return write_comfyui_lora(path, {original(module): lora for module, lora in adapter.modules.items()},
                              extra={**deltas, **(extra or {})})


def write_diffsynth(path: Path, adapter: Adapter) -> Path:
    """DiffSynth-Studio keeps the strength in lora_B (its loader applies B A at scale 1)."""
    tensors = {}
    for module, (a, b, rank, alpha) in adapter.modules.items():
        tensors[f"{original(module)}.lora_A.default.weight"] = a
        tensors[f"{original(module)}.lora_B.default.weight"] = b * (alpha / rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path)
    return path


def write_finetrainers(path: Path, adapter: Adapter) -> Path:
    return write_finetrainers_lora(path, adapter.modules)


# -- judges --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base():
    return WanTransformer3DModel.load_config(BASE_FOLDER), load_file(BASE_TRUTH)


def judged(folder: Path, target: str, config, weights) -> dict[str, torch.Tensor]:
    """Our output as its own loader applies it: PEFT for peft, Diffusers' Wan loader for the others."""
    if target == "peft":
        return peft_fused(WanTransformer3DModel, config, weights, folder)
    return diffusers_fused(WanPipeline, WanTransformer3DModel, config, weights, folder / OUTPUT_FILE[target])


def every_block_layer(layers: int = 2) -> list[str]:
    return [f"blocks.{i}.{layer}" for i in range(layers) for layer in BLOCK_LAYERS]


INPUTS = ("diffusers", "peft", "peft-original", "peft-checkpoint-original", "musubi", "comfyui", "diffsynth")
READ_BY_DIFFUSERS = ("diffusers", "musubi", "comfyui")  # Diffusers finds no LoRA keys in DiffSynth's files


@pytest.fixture(scope="module")
def synthetic(base, tmp_path_factory):
    config, weights = base
    folder = tmp_path_factory.mktemp("wan-inputs")
    adapter = make_adapter(weights, every_block_layer())
    inputs = {"diffusers": write_diffusers(folder / "diffusers", adapter),
              "peft": write_peft(folder / "peft", adapter, config, weights),
              "musubi": write_musubi(folder / "musubi" / "lora.safetensors", adapter),
              "comfyui": write_comfyui(folder / "comfyui" / "lora.safetensors", adapter),
              "diffsynth": write_diffsynth(folder / "diffsynth" / "epoch-0.safetensors", adapter),
              "peft-original": write_peft_original(folder / "peft-original", adapter),
              # the Wan repo's own weights, wrapped: --lora fuse takes the base from here, named by our table
              "peft-checkpoint-original": write_peft_original(
                  folder / "ddp", adapter, load_file(REAL / "original" / "diffusion_pytorch_model.safetensors"))}
    return adapter, inputs


@pytest.mark.parametrize("source", INPUTS)
def test_every_layout_to_every_layout_at_the_trained_strength(source, synthetic, base, tmp_path):
    config, weights = base
    adapter, inputs = synthetic
    truth = adapter.truth(weights)
    if source in READ_BY_DIFFUSERS:  # the input itself, as Diffusers applies it
        assert_all_equal(diffusers_fused(WanPipeline, WanTransformer3DModel, config, weights, inputs[source]), truth)
    for target in OUTPUTS:
        result = export(inputs[source], tmp_path / target, base=BASE_FOLDER, lora_format=target)
        assert result.lora["ranks"] == [2, 4, 8] and result.lora["modules"] == 20 and result.lora["layers"] == 2
        # DiffSynth keeps the strength in lora_B: alpha = r, scale 1
        assert result.lora["scale"] == (1.0 if source == "diffsynth" else 2.0)
        assert_all_equal(judged(tmp_path / target, target, config, weights), truth)
    export(inputs[source], tmp_path / "fused", base=BASE_FOLDER, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)




def test_any_to_any_to_any_is_exact(synthetic, tmp_path):
    _, inputs = synthetic
    for source in ("musubi", "peft"):
        assert_any_to_any_to_any(export, inputs[source], source, BASE_FOLDER, OUTPUTS, tmp_path)
    # the strength travels in each format's own way
    assert adapter_metadata(tmp_path / "musubi-diffusers" / OUTPUT_FILE["diffusers"])["transformer.rank_pattern"]
    assert json.loads((tmp_path / "musubi-peft" / "adapter_config.json").read_text())["alpha_pattern"]
    musubi = load_file(tmp_path / "peft-musubi" / "lora.safetensors")
    assert musubi["lora_unet_blocks_0_self_attn_k.alpha"].item() == 2.0
    assert header(tmp_path / "peft-musubi" / "lora.safetensors")["ss_network_module"] == "networks.lora_wan"
    comfy = load_file(tmp_path / "peft-comfyui" / "lora.safetensors")
    assert "diffusion_model.blocks.0.self_attn.v.alpha" not in comfy  # alpha = r (8, 8): ComfyUI's scale 1 needs none


def test_finetrainers_lora_config_gives_the_strength_diffusers_would_miss(base, tmp_path):
    config, weights = base
    adapter = make_adapter(weights, every_block_layer(), seed=3, strengths=((4, 8.0),))
    path = write_finetrainers(tmp_path / "lora_weights" / "000002" / "pytorch_lora_weights.safetensors", adapter)
    truth = adapter.truth(weights)
    naive = diffusers_fused(WanPipeline, WanTransformer3DModel, config, weights, path)  # scale 1, not 2
    assert not torch.equal(naive["blocks.0.attn1.to_q.weight"], truth["blocks.0.attn1.to_q.weight"])
    result = export(path, tmp_path / "out", base=BASE_FOLDER)
    assert result.lora["alpha_source"] == "the file's lora_config (finetrainers)" and not result.notes
    assert_all_equal(judged(tmp_path / "out", "diffusers", config, weights), truth)


def test_comfyui_deltas_and_layers_outside_the_blocks(base, tmp_path, cli):
    config, weights = base
    modules = [*every_block_layer(1), "proj_out", "condition_embedder.text_embedder.linear_1"]
    adapter = make_adapter(weights, modules, seed=5,
                           strengths=((4, 8.0), (4, 2.0), (8, 8.0), (4, 16.0), (2, 1.0), (8, 32.0), (4, 4.0)))
    adapter.modules["proj_out"] = (*adapter.modules["proj_out"][:2], 4, 4.0)  # Diffusers reads no alpha there
    adapter.modules["condition_embedder.text_embedder.linear_1"] = (
        *adapter.modules["condition_embedder.text_embedder.linear_1"][:2], 4, 4.0)
    generator = torch.Generator().manual_seed(9)
    adapter.diff_b = {"blocks.0.attn1.to_q": torch.randn(32, generator=generator) * 0.1,
                      "proj_out": torch.randn(16, generator=generator) * 0.1}
    zeros = {"diffusion_model.blocks.0.norm3.diff": torch.zeros(32), "diffusion_model.blocks.0.norm3.diff_b": torch.zeros(32)}
    path = write_comfyui(tmp_path / "comfy" / "lora.safetensors", adapter, zeros)
    truth = adapter.truth(weights)
    assert_all_equal(diffusers_fused(WanPipeline, WanTransformer3DModel, config, weights, path), truth)
    for target in ("diffusers", "peft", "comfyui"):
        result = export(path, tmp_path / target, base=BASE_FOLDER, lora_format=target)
        assert any("all-zero" in note for note in result.notes)
        assert_all_equal(judged(tmp_path / target, target, config, weights), truth)
    assert adapter_metadata(tmp_path / "diffusers" / OUTPUT_FILE["diffusers"])["transformer.lora_bias"] is True
    export(path, tmp_path / "fused", base=BASE_FOLDER, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
    refused = cli(path, tmp_path / "as-musubi", "--base", BASE_FOLDER, "--lora-format", "musubi")
    assert refused.exit_code == 2 and "cannot hold bias deltas (.diff_b)" in refused.stderr
    assert not (tmp_path / "as-musubi").exists()


def test_full_weight_deltas_stay_where_a_format_holds_them(base, tmp_path, cli):
    config, weights = base
    adapter = make_adapter(weights, ["blocks.0.attn1.to_q"], seed=6)
    delta = torch.randn(32, 32, generator=torch.Generator().manual_seed(2)) * 0.01
    path = write_comfyui(tmp_path / "in" / "lora.safetensors", adapter, {"diffusion_model.blocks.1.cross_attn.o.diff": delta})
    truth = adapter.truth(weights)
    truth["blocks.1.attn2.to_out.0.weight"] = truth["blocks.1.attn2.to_out.0.weight"] + delta
    export(path, tmp_path / "fused", base=BASE_FOLDER, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
    export(path, tmp_path / "again", base=BASE_FOLDER, lora_format="comfyui")
    assert_all_equal(load_file(tmp_path / "again" / "lora.safetensors"), load_file(path))
    for target in ("diffusers", "peft", "musubi"):
        refused = cli(path, tmp_path / target, "--base", BASE_FOLDER, "--lora-format", target)
        assert refused.exit_code == 2 and len(refused.error_lines) == 1, refused.stderr
        assert "cannot hold full-weight deltas (.diff) (on blocks.1.attn2.to_out.0)" in refused.stderr
        assert not (tmp_path / target).exists()


def test_strengths_that_are_not_powers_of_two(base, tmp_path):
    """Diffusers' Wan loader folds alpha / r into A and B of kohya and ComfyUI files, which rounds unless alpha / r is
    a power of two; our files keep A, B and alpha as they are (exact for ComfyUI and musubi-tuner, which apply
    alpha / r at run time), and read back exactly."""
    config, weights = base
    adapter = make_adapter(weights, every_block_layer(), seed=7, strengths=((4, 3.0), (4, 5.0), (8, 6.0)))
    path = write_musubi(tmp_path / "in" / "lora.safetensors", adapter)
    truth = adapter.truth(weights)
    export(path, tmp_path / "diffusers", base=BASE_FOLDER)
    assert_all_equal(judged(tmp_path / "diffusers", "diffusers", config, weights), truth)
    for target in ("comfyui", "musubi"):
        export(path, tmp_path / target, base=BASE_FOLDER, lora_format=target)
        export(tmp_path / target, tmp_path / f"{target}-diffusers", base=BASE_FOLDER)
        assert_all_equal(judged(tmp_path / f"{target}-diffusers", "diffusers", config, weights), truth)
    written = load_file(tmp_path / "musubi" / "lora.safetensors")
    assert_all_equal(written, load_file(path))


def test_wan21_i2v_image_branch_layers(tmp_path):
    config = {**dict(WanTransformer3DModel.load_config(BASE_FOLDER)), "in_channels": 8, "image_dim": 12,
              "added_kv_proj_dim": 32}
    torch.manual_seed(0)
    model = WanTransformer3DModel.from_config(config)
    model.save_pretrained(tmp_path / "base")
    weights = model.state_dict()
    layers = [f"blocks.{i}.{layer}" for i in range(2) for layer in (*BLOCK_LAYERS, "attn2.add_k_proj", "attn2.add_v_proj")]
    adapter = make_adapter(weights, layers, seed=11)
    path = write_musubi(tmp_path / "in" / "lora.safetensors", adapter)
    truth = adapter.truth(weights)
    assert_all_equal(diffusers_fused(WanPipeline, WanTransformer3DModel, config, weights, path), truth)
    for target in ("diffusers", "comfyui"):
        export(path, tmp_path / target, base=tmp_path / "base", lora_format=target)
        assert_all_equal(judged(tmp_path / target, target, config, weights), truth)


# -- the real trainers' files ---------------------------------------------------------------------------------
def real_adapter(name: str) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """The adapter of one of the real files, module by module, with the scale its own loader applies."""
    module_map = json.loads((REAL / "lora" / "module_map.json").read_text())
    path = next((REAL / "lora" / name).glob("*.safetensors"))
    tensors = load_file(path)
    found = {}
    for theirs, names in module_map.items():
        ours = names["diffusers"]
        if name in ("a_musubi", "c_comfyui"):
            key = names["musubi"] if name == "a_musubi" else f"diffusion_model.{theirs}"
            down, up = tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"]
            found[ours] = (down, up, tensors[f"{key}.alpha"].item() / down.shape[0])
        elif name == "a2_musubi_other":  # sqrt(alpha / r) folded into both: scale 1
            found[ours] = (tensors[f"diffusion_model.{theirs}.lora_A.weight"],
                           tensors[f"diffusion_model.{theirs}.lora_B.weight"], 1.0)
        elif name == "b_diffsynth":  # alpha / r folded into lora_B: scale 1
            found[ours] = (tensors[f"{theirs}.lora_A.default.weight"], tensors[f"{theirs}.lora_B.default.weight"], 1.0)
        else:
            config = adapter_metadata(path)
            found[ours] = (tensors[f"transformer.{ours}.lora_A.weight"], tensors[f"transformer.{ours}.lora_B.weight"],
                           config["transformer.lora_alpha"] / config["transformer.r"])
    return found


@pytest.mark.parametrize("name", ["a_musubi", "a2_musubi_other", "b_diffsynth", "c_comfyui", "d_diffusers"])
def test_the_real_trainers_files(name, base, tmp_path):
    config, weights = base
    truth = merged(weights, real_adapter(name))  # in PEFT's operation order, from the file itself
    for target in OUTPUTS:
        export(REAL / "lora" / name, tmp_path / target, base=BASE_FOLDER, lora_format=target)
        assert_all_equal(judged(tmp_path / target, target, config, weights), truth)
    export(REAL / "lora" / name, tmp_path / "fused", base=BASE_FOLDER, lora="fuse", dtype="fp32")
    fused = load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors")
    assert_all_equal(fused, truth)

    # Against the fixture's own ground truth: bit for bit wherever the adapter does not reach. On the 20 adapted
    # weights it is W + fp32((B A in float64) * alpha / r): its delta is rounded once from float64, PEFT's (which
    # Diffusers' fuse_lora and ours follow) is computed in float32, so the two differ in the last bits there (up to
    # 1.2e-7); each is exact in its own operation order, shown here for the fixture's and above for ours.
    ground = load_file(REAL / "lora" / "ground_truth_fused" / "transformer" / "ground_truth.safetensors")
    musubi = real_adapter("a_musubi")
    adapted = {f"{m}.weight" for m in musubi}
    assert all(torch.equal(fused[k], ground[k]) for k in ground if k not in adapted)
    for module, (down, up, scale) in musubi.items():
        weight = f"{module}.weight"
        assert torch.equal(ground[weight], weights[weight] + ((up.double() @ down.double()) * scale).float())


def test_inspect_says_where_the_strength_comes_from(cli):
    expected = {"a_musubi": ("musubi", 8.0, "the file's .alpha tensors"),
                "a2_musubi_other": ("comfyui", 4.0, "no .alpha tensors: applied at scale 1 (alpha = r); the header's "
                                                    "ss_network_alpha 8.0 is not applied (musubi-tuner's convert_lora "
                                                    "folds it into lora_A and lora_B)"),
                "b_diffsynth": ("diffsynth", 4.0, "DiffSynth-Studio keeps the strength in lora_B and applies B A at "
                                                  "scale 1: alpha = r"),
                "c_comfyui": ("comfyui", 8.0, "the file's .alpha tensors"),
                "d_diffusers": ("diffusers", 8.0, "the file's lora_adapter_metadata")}
    for name, (layout, alpha, source) in expected.items():
        result = cli("inspect", REAL / "lora" / name, "--json")
        assert result.exit_code == 0, result.stderr
        lora = json.loads(result.stdout)["models"]["lora"]
        assert (lora["family"], lora["format"], lora["alpha"], lora["alpha_source"]) == ("Wan", layout, alpha, source)
        assert (lora["rank"], lora["modules"], lora["layers"]) == (4, 20, 2)
        assert lora["target_modules"] == ["ffn.net.0.proj", "ffn.net.2", "to_k", "to_out.0", "to_q", "to_v"]
        assert "Wan" in cli("inspect", REAL / "lora" / name).stdout


def test_diffsynth_alpha_from_the_runs_config(base, synthetic, tmp_path, cli):
    """DiffSynth-Studio's files apply at scale 1 (alpha = r) unless the run's own config says otherwise."""
    config, weights = base
    adapter, inputs = synthetic
    run = tmp_path / "run"
    run.mkdir()
    (run / "epoch-0.safetensors").write_bytes(inputs["diffsynth"].read_bytes())
    (run / "train.yaml").write_text("model: wan\nlora_rank: 4\nlora_alpha: 8\n")
    lora = json.loads(cli("inspect", run / "epoch-0.safetensors", "--json").stdout)["models"]["lora"]
    assert (lora["alpha"], lora["alpha_source"]) == (8.0, f"recorded in {run / 'train.yaml'}")
    folded = {m: (a, b * (alpha / r), 8.0 / r) for m, (a, b, r, alpha) in adapter.modules.items()}
    export(run / "epoch-0.safetensors", tmp_path / "out", base=BASE_FOLDER)
    assert_all_equal(judged(tmp_path / "out", "diffusers", config, weights), merged(weights, folded))


# -- a LoRA trained under DeepSpeed -------------------------------------------------------------------------------
def deepspeed_wan_lora() -> GroundTruth:
    scripts = ("train_tiny_wan_lora.py", "deepspeed_cpu.py", "make_deepspeed_checkpoint.py")
    return GroundTruth(cached_fixture("wan-lora-zero2-ws2-bf16", scripts,
                                      [str(SCRIPTS / "train_tiny_wan_lora.py"), "--stage", "2", "--world-size", "2"]))


def test_peft_adapters_inside_a_deepspeed_checkpoint(tmp_path, cli):
    run = deepspeed_wan_lora()
    lora = run.truth["settings"]["lora"]  # r 4, alpha 8; ffn.net.2 rank 8 alpha 32; attn2.to_k alpha 2; proj_out 4
    base = {name.replace(".base_layer", ""): run.tensors[name] for name in run.truth["frozen"]}
    adapter = {}
    for name in run.truth["trainable"]:
        if ".lora_A." in name:
            module = name[: -len(".lora_A.default.weight")]
            down, up = run.tensors[name], run.tensors[name.replace("lora_A", "lora_B")]
            alpha = next((a for key, a in lora["alpha_pattern"].items() if module.endswith(key)), lora["lora_alpha"])
            adapter[module] = (down, up, alpha / down.shape[0])
    assert {m for m in adapter if adapter[m][1].abs().sum() == 0} == set(), "B trained away from zero"
    truth = merged(base, adapter)
    checkpoint, base_folder = run.root / "checkpoint", run.root / "base" / "transformer"
    config = WanTransformer3DModel.load_config(base_folder)

    result = export(checkpoint, tmp_path / "adapter", base=base_folder)
    assert "adapter_config.json" in result.lora["alpha_source"] and not result.notes
    written = load_file(tmp_path / "adapter" / OUTPUT_FILE["diffusers"])
    for name in run.truth["trainable"]:  # the fp32 masters, bit for bit
        assert torch.equal(written["transformer." + name.replace(".default", "")], run.tensors[name]), name
    assert_all_equal(judged(tmp_path / "adapter", "diffusers", config, base), truth)
    export(checkpoint, tmp_path / "fused", base=base_folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)

    report = json.loads(cli("inspect", checkpoint, "--json").stdout)["models"]["lora"]
    assert (report["format"], report["ranks"], report["per_module_alphas"], report["base_weights"]) == \
        ("peft-checkpoint", [4, 8], True, True)


# -- Wan 2.2 A14B: one adapter per expert --------------------------------------------------------------------------
def a14b_base(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """A tiny pipeline folder shaped like Wan2.2-T2V-A14B's transformers: two experts of one config."""
    config = WanTransformer3DModel.load_config(BASE_FOLDER)
    experts = {}
    for seed, component in enumerate(("transformer", "transformer_2")):
        torch.manual_seed(seed)
        model = WanTransformer3DModel.from_config(config)
        model.save_pretrained(folder / component)
        experts[component] = model.state_dict()
    index = {"_class_name": "WanPipeline", "_diffusers_version": "0.42.1", "boundary_ratio": 0.875,
             "expand_timesteps": False, "transformer": ["diffusers", "WanTransformer3DModel"],
             "transformer_2": ["diffusers", "WanTransformer3DModel"], "scheduler": [None, None], "vae": [None, None],
             "text_encoder": [None, None], "tokenizer": [None, None]}
    (folder / "model_index.json").write_text(json.dumps(index))
    return experts


def test_wan22_a14b_one_adapter_per_expert(tmp_path):
    experts = a14b_base(tmp_path / "base")
    high = make_adapter(experts["transformer"], every_block_layer(), seed=21)
    low = make_adapter(experts["transformer_2"], every_block_layer(), seed=22)
    write_musubi(tmp_path / "run" / "high_noise_model" / "wan22_high.safetensors", high)
    write_comfyui(tmp_path / "run" / "low_noise_model" / "wan22_low.safetensors", low)
    truths = {"transformer": high.truth(experts["transformer"]), "transformer_2": low.truth(experts["transformer_2"])}

    result = export(tmp_path / "run", tmp_path / "adapters", base=tmp_path / "base")
    assert set(result.lora["experts"]) == {"high_noise_model", "low_noise_model"}
    assert result.files == ["high_noise_model/pytorch_lora_weights.safetensors",
                            "low_noise_model/pytorch_lora_weights.safetensors", "README.md"]
    transformers = {name: WanTransformer3DModel.from_pretrained(tmp_path / "base" / name) for name in truths}
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, boundary_ratio=0.875,
                       **transformers)
    pipe.load_lora_weights(tmp_path / "adapters" / "high_noise_model", adapter_name="high")
    pipe.load_lora_weights(tmp_path / "adapters" / "low_noise_model", adapter_name="low", load_into_transformer_2=True)
    pipe.fuse_lora(components=["transformer", "transformer_2"], lora_scale=1.0)
    pipe.unload_lora_weights()
    assert_all_equal(pipe.transformer.state_dict(), truths["transformer"])
    assert_all_equal(pipe.transformer_2.state_dict(), truths["transformer_2"])

    export(tmp_path / "run", tmp_path / "fused", base=tmp_path / "base", lora="fuse", dtype="fp32",
           component="transformer")
    for name, truth in truths.items():
        assert_all_equal(load_file(tmp_path / "fused" / name / "diffusion_pytorch_model.safetensors"), truth)
    # --lora fuse takes the base weights from a pipeline --base, and writes the transformers unless told otherwise
    default = export(tmp_path / "run", tmp_path / "fused-default", base=tmp_path / "base", lora="fuse", dtype="fp32")
    assert default.component == "transformer" and not (tmp_path / "fused-default" / "model_index.json").exists()
    for name, truth in truths.items():
        assert_all_equal(load_file(tmp_path / "fused-default" / name / "diffusion_pytorch_model.safetensors"), truth)


# -- bad input -------------------------------------------------------------------------------------------------
def test_bad_wan_lora_input(cli, tmp_path, synthetic):
    from cogvideox_fixtures import build_tiny_transformer, config_folder

    _, inputs = synthetic
    musubi = inputs["musubi"]
    before = snapshot(musubi.parent)
    cogvideox = config_folder(tmp_path / "cogvideox", build_tiny_transformer("2b", num_layers=2))
    assert_refusal(cli(musubi, tmp_path / "o1", "--base", cogvideox), "is a Wan LoRA", "is a CogVideoX model")
    assert_refusal(cli(musubi, tmp_path / "o2", "--lora-format", "kohya"), "--lora-format 'kohya' is not one of")

    tensors = load_file(musubi)
    up = "lora_unet_blocks_0_self_attn_q.lora_up.weight"
    tensors[up] = tensors[up][:, :3].contiguous()
    save_file(tensors, tmp_path / "ranks.safetensors")
    assert_refusal(cli(tmp_path / "ranks.safetensors", tmp_path / "o3"),
                   "the ranks of lora_unet_blocks_0_self_attn_q differ", "(4, 32)", "(32, 3)")

    tensors = load_file(musubi)
    tensors["lora_unet_blocks_0_self_attn_x.lora_down.weight"] = torch.zeros(4, 32)
    save_file(tensors, tmp_path / "foreign.safetensors")
    assert_refusal(cli(tmp_path / "foreign.safetensors", tmp_path / "o4"),
                   "lora_unet_blocks_0_self_attn_x names no layer of a Wan transformer")

    dora = {k.replace("transformer.", "base_model.model."): v for k, v in load_file(inputs["diffusers"]).items()}
    dora["base_model.model.blocks.0.attn1.to_q.lora_magnitude_vector"] = torch.ones(32)
    (tmp_path / "dora").mkdir()
    save_file(dora, tmp_path / "dora" / "adapter_model.safetensors")
    (tmp_path / "dora" / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "use_dora": True}))
    assert_refusal(cli(tmp_path / "dora", tmp_path / "o5", "--lora-format", "comfyui"),
                   "cannot hold DoRA magnitudes (on blocks.0.attn1.to_q)", "--lora-format peft")

    tenth = make_adapter(load_file(BASE_TRUTH), ["blocks.0.attn1.to_q"], strengths=((4, 0.1),))
    write_diffusers(tmp_path / "tenth", tenth)
    assert_refusal(cli(tmp_path / "tenth", tmp_path / "o6", "--lora-format", "musubi"),
                   "the strength of blocks.0.self_attn.q (scale 0.025) cannot be stored exactly", "fp32")

    both = {"transformer.proj_out.lora_A.weight": torch.ones(4, 32), "transformer.proj_out.lora_B.weight": torch.ones(16, 4)}
    save_file(both, tmp_path / "proj_out.safetensors")
    assert_refusal(cli(tmp_path / "proj_out.safetensors", tmp_path / "o7"),
                   "adapts layers that CogVideoX, Cosmos, HunyuanVideo, HunyuanVideo 1.5, HunyuanVideo FramePack, "
                   "LTX-2, LTX-Video, MiniMax-H3, SanaVideo and Wan",
                   "pass --base")
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 8))
    assert snapshot(musubi.parent) == before
    assert export(tmp_path / "proj_out.safetensors", tmp_path / "o8", base=BASE_FOLDER).family == "Wan"
