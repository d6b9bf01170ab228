"""LyCORIS's LoKr and LoHa adapters of Wan, from every trainer that writes them, read at the trained strength, fused
exactly and written in the layouts whose loaders read them (PEFT, ComfyUI, LyCORIS); the layouts whose loaders
apply lora_A / lora_B only (Diffusers, kohya / musubi-tuner) refuse them with one line naming those that hold them.

Inputs: LyCORIS's own create_lycoris + save_weights (lycoris-lora 4.1.3, the layout SimpleTuner saves) and PEFT's own
LoKrConfig / LoHaConfig + save_pretrained, on the tiny real Wan 2.1; musubi-tuner, ai-toolkit and diffusion-pipe
files by writers that follow their sources (lycoris_helpers.py says which facts each takes from where).

Judges: each trainer's own delta (LyCORIS's forward weight get_weight * scalar; PEFT's merge_and_unload of the
folder) or, where its code is not installed, its math as the helpers write it out from its source (ComfyUI's
calculate_weight, musubi-tuner's merge). Every one builds the factor products in float32, multiplies by the scale and
then adds W, as cogexport does: the fused weights are torch.equal to theirs. Our outputs are judged by the loaders of
their layouts: PEFT's merge for peft, LyCORIS's create_lycoris_from_weights for lycoris, ComfyUI's math on the
written keys for comfyui.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_refusal, snapshot
from diffusers import WanTransformer3DModel
from lora_helpers import assert_all_equal, assert_same_files, files_of, peft_fused
from lycoris_helpers import (added, aitoolkit_wan_key, comfy_delta, lycoris_loaded, lycoris_saved, musubi_delta,
                             random_factors, write_musubi_lycoris)
from safetensors.torch import load_file, save_file
from test_lora_wan import BASE_FOLDER, BASE_TRUTH, original
from wan_fixtures import REAL_WAN

from cogexport.checkpoint import open_checkpoint
from cogexport.errors import CogExportError
from cogexport.lora import plan_output, read_adapter
from cogexport.precision import PrecisionPolicy
from cogexport.exporter import export

pytestmark = pytest.mark.skipif(not REAL_WAN.is_dir(), reason=f"the real Wan fixtures are not at {REAL_WAN}")
lycoris_lora = pytest.importorskip("lycoris", reason="lycoris-lora (a test dependency) is not installed")

OUTPUTS = ("peft", "comfyui", "lycoris")
OUTPUT_FILE = {"peft": "adapter_model.safetensors", "comfyui": "lora.safetensors", "lycoris": "lycoris.safetensors"}

# LyCORIS settings per module (algo, dim, alpha, factor, decompose_both): whole factors (dim over half of w2's side:
# scale 1, whatever alpha), w2 low-rank, both low-rank, on the 32-wide attention and the 64-wide feed-forward layers
LOKR = {"attn1.to_q": dict(algo="lokr", dim=10000, alpha=1, factor=4),
        "attn1.to_k": dict(algo="lokr", dim=2, alpha=4, factor=4),
        "attn1.to_v": dict(algo="lokr", dim=1, alpha=2, factor=4, decompose_both=True),
        "attn2.to_q": dict(algo="lokr", dim=2, alpha=1, factor=4),
        "attn2.to_out.0": dict(algo="lokr", dim=3, alpha=6, factor=4),
        "ffn.net.0.proj": dict(algo="lokr", dim=2, alpha=8, decompose_both=True),
        "ffn.net.2": dict(algo="lokr", dim=10000, alpha=3)}
LOHA = {"attn1.to_q": dict(algo="loha", dim=4, alpha=2), "attn1.to_k": dict(algo="loha", dim=2, alpha=2),
        "attn2.to_v": dict(algo="loha", dim=4, alpha=8), "ffn.net.0.proj": dict(algo="loha", dim=2, alpha=1),
        "ffn.net.2": dict(algo="loha", dim=4, alpha=4)}


@pytest.fixture(scope="module")
def base():
    config = WanTransformer3DModel.load_config(BASE_FOLDER)
    return config, load_file(BASE_TRUTH)


def tiny_model(base) -> WanTransformer3DModel:
    config, weights = base
    model = WanTransformer3DModel.from_config(config)
    model.load_state_dict(weights)
    return model


def per_block(specs: dict, blocks: int = 2) -> dict:
    return {f"blocks.{i}.{layer}": spec for i in range(blocks) for layer, spec in specs.items()}


# -- the judges of our outputs ---------------------------------------------------------------------------------
def comfy_applied(path: Path, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ComfyUI's math on a written ComfyUI file: its original module names mapped back to Diffusers' here."""
    tensors = load_file(path)
    to_diffusers = {f"diffusion_model.{original(m)}": m for m in {k.rsplit(".", 1)[0] for k in weights}
                    if _has_original(m)}
    deltas = {}
    for name in {key.rsplit(".", 1)[0] for key in tensors}:
        factors = {key.rsplit(".", 1)[1]: t for key, t in tensors.items() if key.rsplit(".", 1)[0] == name
                   and not key.endswith(".alpha")}
        alpha = tensors[f"{name}.alpha"].item() if f"{name}.alpha" in tensors else None
        deltas[to_diffusers[name]] = comfy_delta(factors, alpha)
    return added(weights, deltas)


def _has_original(module: str) -> bool:
    try:
        original(module)
    except (KeyError, ValueError):
        return False
    return True


def judged(folder: Path, target: str, base) -> dict[str, torch.Tensor]:
    config, weights = base
    if target == "peft":
        return peft_fused(WanTransformer3DModel, config, weights, folder)
    if target == "lycoris":
        return added(weights, lycoris_loaded(tiny_model(base), folder / OUTPUT_FILE[target]))
    return comfy_applied(folder / OUTPUT_FILE[target], weights)


def write_as(source: Path, out: Path, target: str) -> None:
    """--lora-format ``target``, through the export."""
    export(source, out, base=BASE_FOLDER, lora_format=target)


def every_output(source: Path, truth: dict[str, torch.Tensor], base, tmp_path: Path, outputs=OUTPUTS) -> None:
    """Fused, and written in every layout that holds the adapter, each read by its loader: the trained weights."""
    export(source, tmp_path / "fused", base=BASE_FOLDER, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
    for target in outputs:
        write_as(source, tmp_path / target, target)
        assert_all_equal(judged(tmp_path / target, target, base), truth)


# -- LyCORIS's own files (SimpleTuner's LyCORIS runs) ----------------------------------------------------------
@pytest.mark.parametrize("algo", ["lokr", "loha"])
def test_lycoris_own_files_at_the_trained_strength(algo, base, tmp_path, cli):
    _, weights = base
    specs = per_block(LOKR if algo == "lokr" else LOHA)
    path, deltas = lycoris_saved(tiny_model(base), specs, tmp_path / "run" / "pytorch_lora_weights.safetensors", 1)
    truth = added(weights, deltas)
    every_output(path, truth, base, tmp_path)
    result = export(path, tmp_path / "peft-again", base=BASE_FOLDER, lora_format="peft")
    assert result.lora["type"] == ("LoKr" if algo == "lokr" else "LoHa") and result.lora["modules"] == len(specs)
    assert result.lora["layout"] == "wan/lycoris_lora"
    for target in ("diffusers", "musubi"):
        title = {"diffusers": "Diffusers", "musubi": "kohya / musubi-tuner"}[target]
        assert_refusal(cli(path, tmp_path / target, "--base", BASE_FOLDER, "--lora-format", target),
                       f"{title} LoRA files cannot hold a {'LoKr' if algo == 'lokr' else 'LoHa'} (LyCORIS) adapter",
                       "--lora-format peft or --lora-format comfyui or --lora-format lycoris")
        assert not (tmp_path / target).exists()


def test_any_to_any_to_any_is_exact(base, tmp_path):
    path, _ = lycoris_saved(tiny_model(base), per_block(LOKR), tmp_path / "run" / "lokr.safetensors", 2)
    direct = {}
    for target in OUTPUTS:
        write_as(path, tmp_path / target, target)
        direct[target] = files_of(tmp_path / target)
    for middle in OUTPUTS:
        for target in OUTPUTS:
            write_as(tmp_path / middle, tmp_path / f"{middle}-{target}", target)
            assert_same_files(files_of(tmp_path / f"{middle}-{target}"), direct[target])


# -- PEFT's own LoKr / LoHa adapters ---------------------------------------------------------------------------
def peft_lycoris(base, folder: Path, config, seed: int) -> Path:
    """A tiny Wan wrapped by PEFT's own LoKr / LoHa, every factor set to seeded random values, saved by PEFT."""
    from peft import get_peft_model

    wrapped = get_peft_model(tiny_model(base), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lokr_" in name or "hada_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    wrapped.save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("kind", ["lokr", "loha"])
def test_peft_lokr_and_loha_adapters(kind, base, tmp_path):
    from peft import LoHaConfig, LoKrConfig

    config, weights = base
    targets = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]
    if kind == "lokr":  # r 1: both halves low-rank; r 8 on to_k: both whole, at alpha / r = 0.5 as PEFT applies it
        made = LoKrConfig(r=1, alpha=2, target_modules=targets, decompose_both=True, rank_pattern={"to_k": 8},
                          alpha_pattern={"to_k": 4, "to_v": 4})
    else:
        made = LoHaConfig(r=4, alpha=2, target_modules=targets, rank_pattern={"to_k": 2}, alpha_pattern={"to_v": 8})
    folder = peft_lycoris(base, tmp_path / "trained", made, 3)
    truth = peft_fused(WanTransformer3DModel, config, weights, folder)
    assert not torch.equal(truth["blocks.0.attn1.to_k.weight"], weights["blocks.0.attn1.to_k.weight"])
    outputs = ("peft",) if kind == "lokr" else OUTPUTS  # whole LoKr factors at scale 0.5: only PEFT applies that
    every_output(folder / "adapter_model.safetensors", truth, base, tmp_path, outputs)
    result = export(folder, tmp_path / "again", base=BASE_FOLDER, lora_format="peft")
    assert "adapter_config.json" in result.lora["alpha_source"]


def test_peft_lokr_whole_factors_at_another_strength_are_refused_by_comfyui(base, tmp_path, cli):
    from peft import LoKrConfig

    folder = peft_lycoris(base, tmp_path / "trained", LoKrConfig(r=8, alpha=16, target_modules=["to_q"]), 4)
    line = assert_refusal(cli(folder, tmp_path / "out", "--base", BASE_FOLDER, "--lora-format", "comfyui"),
                          "is a LoKr of two whole factors at scale 2", "--lora-format peft")
    assert any(f"blocks.{i}.attn{j}.to_q is" in line for i in (0, 1) for j in (1, 2))  # named as Diffusers names it
    assert not (tmp_path / "out").exists()


# -- musubi-tuner's own LoKr and LoHa (networks.lokr, networks.loha) ----------------------------------------------
def musubi_modules(base, algo: str, rank: int, alpha: float, seed: int) -> dict:
    """Modules as musubi-tuner makes them: LoKr w1 is the larger factor (its factorization puts the larger side
    first), w2 whole unless the rank is below w2's larger side; LoHa hada_w1/w2 a [out, r] and b [r, in]."""
    _, weights = base
    made = {}
    for index, module in enumerate(f"blocks.{i}.{layer}" for i in range(2) for layer in
                                   ("attn1.to_q", "attn1.to_k", "attn2.to_v", "ffn.net.0.proj", "ffn.net.2")):
        out, inp = weights[f"{module}.weight"].shape
        if algo == "lokr":
            (a, b), (c, d) = _larger_first(out), _larger_first(inp)
            shapes = {"lokr_w1": (a, c), **({"lokr_w2_a": (b, rank), "lokr_w2_b": (rank, d)} if rank < max(b, d)
                                            else {"lokr_w2": (b, d)})}
        else:
            shapes = {"hada_w1_a": (out, rank), "hada_w1_b": (rank, inp), "hada_w2_a": (out, rank),
                      "hada_w2_b": (rank, inp)}
        made[original(module)] = (random_factors(shapes, seed + index), alpha)
    return made


def _larger_first(dimension: int) -> tuple[int, int]:
    """musubi-tuner's factorization with factor -1: the most square pair, larger first."""
    best = (dimension, 1)
    for small in range(2, int(dimension ** 0.5) + 1):
        if dimension % small == 0 and abs(dimension // small - small) < abs(best[0] - best[1]):
            best = (dimension // small, small)
    return best


def musubi_truth(base, modules: dict) -> dict[str, torch.Tensor]:
    _, weights = base
    by_original = {original(m): m for m in {k.rsplit(".", 1)[0] for k in weights} if _has_original(m)}
    return added(weights, {by_original[name]: musubi_delta(factors, alpha)
                           for name, (factors, alpha) in modules.items()})


@pytest.mark.parametrize("algo,rank,alpha", [("lokr", 1, 4.0), ("loha", 2, 8.0)])
def test_musubi_tuner_lokr_and_loha(algo, rank, alpha, base, tmp_path):
    modules = musubi_modules(base, algo, rank, alpha, 5)
    path = write_musubi_lycoris(tmp_path / "run" / f"wan_{algo}.safetensors", modules, algo)
    if algo == "loha":
        every_output(path, musubi_truth(base, modules), base, tmp_path)
        return
    # LyCORIS's loader puts the smaller factor first: it cannot rebuild musubi-tuner's w1 (the larger one)
    every_output(path, musubi_truth(base, modules), base, tmp_path, outputs=("peft", "comfyui"))
    with pytest.raises(CogExportError, match=r"LyCORIS's loader rebuilds blocks\.0\.\S+ LoKr factors with other "
                                             r"shapes than these \(w1 8x8, w2 4x4, rank 1\); write --lora-format"):
        write_as(path, tmp_path / "lycoris", "lycoris")
    assert not (tmp_path / "lycoris").exists()


def test_musubi_tuner_lokr_with_whole_w2_divides_alpha_by_its_larger_side(base, tmp_path, cli):
    """networks.lokr with a rank at or above w2's larger side keeps w2 whole and still applies alpha / max(w2):
    not the scale 1 LyCORIS and ComfyUI give two whole factors, so only PEFT can carry it."""
    modules = musubi_modules(base, "lokr", 8, 8.0, 6)
    path = write_musubi_lycoris(tmp_path / "run" / "wan_lokr.safetensors", modules, "lokr")
    truth = musubi_truth(base, modules)
    every_output(path, truth, base, tmp_path, outputs=("peft",))
    assert_refusal(cli(path, tmp_path / "comfy", "--base", BASE_FOLDER, "--lora-format", "comfyui"),
                   "a LoKr of two whole factors at scale 2", "--lora-format peft")


# -- ai-toolkit's LoKr ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["lycoris_", "lora_transformer_"])
def test_aitoolkit_full_rank_lokr(prefix, base, tmp_path):
    """ai-toolkit's lokr_full_rank sets linear and linear_alpha to 9999999999: both factors whole, alpha forced to
    the rank (scale 1), saved in fp16 (where that alpha is inf). Its LoKr factorization is LyCORIS's."""
    _, weights = base
    tensors, deltas = {}, {}
    for index, module in enumerate(f"blocks.{i}.{layer}" for i in range(2) for layer in
                                   ("attn1.to_q", "attn1.to_out.0", "attn2.to_k", "attn2.to_out.0", "ffn.net.0.proj",
                                    "ffn.net.2")):
        out, inp = weights[f"{module}.weight"].shape
        factors = random_factors({"lokr_w1": (4, 4), "lokr_w2": (out // 4, inp // 4)}, 10 + index)  # lokr_factor 4
        factors = {part: t.half() for part, t in factors.items()}
        tensors.update({aitoolkit_wan_key(module, part, prefix): t for part, t in factors.items()})
        tensors[aitoolkit_wan_key(module, "alpha", prefix)] = torch.tensor(9999999999).half()
        deltas[module] = comfy_delta(factors, None)
    assert tensors[aitoolkit_wan_key("blocks.0.attn1.to_q", "alpha", prefix)].isinf()
    assert aitoolkit_wan_key("blocks.0.attn1.to_q", "lokr_w1", prefix) == f"{prefix}blocks_0_self_attn_q.lokr_w1"
    assert aitoolkit_wan_key("blocks.0.attn1.to_out.0", "lokr_w1", prefix) == \
        f"{prefix}blocks_0_self_attn_to_out_0.lokr_w1"
    path = tmp_path / "run" / "wan_lokr.safetensors"
    path.parent.mkdir()
    save_file(tensors, path, metadata={"format": "pt"})
    result = export(path, tmp_path / "probe", base=BASE_FOLDER, lora_format="peft")
    assert (result.lora["layout"], result.lora["whole_factors"]) == (
        "wan/aitoolkit_lokr" if prefix == "lycoris_" else "wan/aitoolkit_lokr_new", 12)
    every_output(path, added(weights, deltas), base, tmp_path)


# -- diffusion-pipe's LoKr (PEFT's adapter of the original model, ComfyUI's prefix) --------------------------------
def test_diffusion_pipe_lokr(base, tmp_path):
    """diffusion-pipe saves PEFT's state dict with diffusion_model. before the original module names and PEFT's
    LoKrConfig as adapter_config.json (its save_adapter). No .alpha: the strength is the config's alpha / r,
    applied by PEFT to every module, whole factors included."""
    from peft import LoKrConfig

    config, weights = base
    made = LoKrConfig(r=2, alpha=8, decompose_factor=4, target_modules=["to_q", "to_v", "ffn.net.0.proj"],
                      rank_pattern={"ffn.net.0.proj": 8}, alpha_pattern={"ffn.net.0.proj": 4})
    folder = peft_lycoris(base, tmp_path / "trained", made, 7)
    truth = peft_fused(WanTransformer3DModel, config, weights, folder)
    saved = json.loads((folder / "adapter_config.json").read_text())
    tensors = {f"diffusion_model.{original(key[len('base_model.model.'):].rsplit('.', 1)[0])}."
               f"{key.rsplit('.', 1)[1]}": t for key, t in load_file(folder / "adapter_model.safetensors").items()}
    run = tmp_path / "diffusion-pipe" / "epoch1"
    run.mkdir(parents=True)
    save_file(tensors, run / "adapter_model.safetensors", metadata={"format": "pt"})
    (run / "adapter_config.json").write_text(json.dumps(
        {**saved, "target_modules": ["q", "v", "ffn.0"], "rank_pattern": {"ffn.0": 8}, "alpha_pattern": {"ffn.0": 4}}))
    every_output(run, truth, base, tmp_path, outputs=("peft",))
    result = export(run, tmp_path / "again", base=BASE_FOLDER, lora_format="peft")
    assert result.lora["layout"] == "wan/comfyui_lora" and "adapter_config.json" in result.lora["alpha_source"]


# -- what is refused ------------------------------------------------------------------------------------------------
def test_bad_lycoris_input(base, tmp_path, cli):
    path, _ = lycoris_saved(tiny_model(base), per_block({"attn1.to_q": LOKR["attn1.to_k"]}, 1),
                            tmp_path / "run" / "lokr.safetensors", 8)
    before = snapshot(path.parent)
    tensors = load_file(path)
    del tensors["lycoris_blocks_0_attn1_to_q.lokr_w2_b"]
    save_file(tensors, tmp_path / "half.safetensors")
    assert_refusal(cli(tmp_path / "half.safetensors", tmp_path / "o1", "--base", BASE_FOLDER),
                   "the LoKr adapter of lycoris_blocks_0_attn1_to_q has lokr_w2_a for its factor 2")
    tensors = load_file(path)
    tensors["lycoris_blocks_0_attn1_to_q.dora_scale"] = torch.ones(32, 1)
    save_file(tensors, tmp_path / "dora.safetensors")
    assert_refusal(cli(tmp_path / "dora.safetensors", tmp_path / "o2", "--base", BASE_FOLDER),
                   "is a LyCORIS adapter with weight decomposition (DoRA: dora_scale): not read")
    tensors = load_file(path)
    tensors["lycoris_blocks_0_attn1_to_q.lokr_w1"] = torch.ones(4, 5)
    save_file(tensors, tmp_path / "shapes.safetensors")
    assert_refusal(cli(tmp_path / "shapes.safetensors", tmp_path / "o3", "--base", BASE_FOLDER, "--lora", "fuse"),
                   "blocks.0.attn1.to_q is 32 -> 32, the LoKr adapter 40 -> 32")
    tensors = load_file(path)
    tensors["lycoris_blocks_0_attn1_to_q.lokr_t2"] = torch.ones(2, 2, 3, 3)
    save_file(tensors, tmp_path / "tucker.safetensors")
    assert_refusal(cli(tmp_path / "tucker.safetensors", tmp_path / "o4", "--base", BASE_FOLDER),
                   "is a LoKr adapter (LyCORIS) of convolutions (Tucker core lokr_t2): not read")
    oft = {"lycoris_blocks_0_attn1_to_q.oft_blocks": torch.zeros(4, 8, 8), "lycoris_blocks_0_attn1_to_q.alpha":
           torch.tensor(1.0)}
    save_file(oft, tmp_path / "oft.safetensors")
    report = json.loads(cli("inspect", tmp_path / "oft.safetensors", "--json").stdout)
    assert report["usable"] is False and "an OFT adapter (LyCORIS): not read" in report["models"]["lora"]["problem"]
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))
    assert snapshot(path.parent) == before


def test_inspect_names_type_layout_rank_and_alpha(base, tmp_path, cli):
    path, _ = lycoris_saved(tiny_model(base), per_block(LOKR), tmp_path / "run" / "pytorch_lora_weights.safetensors", 9)
    text = cli("inspect", path).stdout
    row = next(line for line in text.splitlines() if line.startswith("lora "))
    assert "Wan LoKr adapter, layout LyCORIS adapter on Diffusers names (lycoris_" in row, row
    assert "factor rank 2 (others: 1, 3), 4 modules with whole factors" in row
    assert "alpha 1 (the file's .alpha tensors)" in row  # the most common alpha applied (ties: the smallest)
    assert next(line for line in text.splitlines() if line.startswith("usable")).endswith(" yes")
    assert not any(line.startswith("step") for line in text.splitlines())  # a plain file has no training step
    report = json.loads(cli("inspect", path, "--json").stdout)["models"]["lora"]
    assert (report["type"], report["kinds"], report["ranks"], report["whole_factors"]) == ("LoKr", {"LoKr": 14},
                                                                                          [1, 2, 3], 4)


def test_ltx_video_lycoris_own_files(tmp_path):
    """SimpleTuner trains LTX-Video with LyCORIS too: LyCORIS's own save of a tiny LTX-Video, both kinds, read on
    Diffusers names (lycoris_transformer_blocks_0_attn1_to_q), fused and written for PEFT and LyCORIS exactly."""
    from diffusers import LTXVideoTransformer3DModel
    from test_lora_ltx_video import build_transformer

    model = build_transformer("2b", seed=0)
    model.save_pretrained(tmp_path / "base" / "transformer")
    base_folder, config, weights = tmp_path / "base" / "transformer", dict(model.config), model.state_dict()
    specs = {f"transformer_blocks.{i}.{layer}": spec for i in range(2) for layer, spec in (
        ("attn1.to_q", LOKR["attn1.to_k"]), ("attn1.to_k", LOKR["attn1.to_v"]), ("attn2.to_v", LOHA["attn1.to_q"]),
        ("ff.net.2", LOHA["ffn.net.2"]))}
    path, deltas = lycoris_saved(model, specs, tmp_path / "run" / "pytorch_lora_weights.safetensors", 12)
    truth = added(weights, deltas)
    export(path, tmp_path / "fused", base=base_folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)
    fresh = LTXVideoTransformer3DModel.from_config(config)
    fresh.load_state_dict(weights)
    with open_checkpoint(path) as checkpoint:
        adapter = read_adapter(checkpoint, str(path), None, [path.parent], checkpoint.info.header_metadata)
        assert adapter.table.name == "ltx_video/lycoris_lora" and adapter.type_name == "LoKr + LoHa"
        planned = plan_output(adapter, "lycoris", adapter.names, PrecisionPolicy(torch.float32), str(path))
        (tmp_path / "lycoris").mkdir()
        save_file({name: t.load().contiguous() for name, t in planned.tensors.items()},
                  tmp_path / "lycoris" / planned.file)
    assert_all_equal(added(weights, lycoris_loaded(fresh, tmp_path / "lycoris" / "lycoris.safetensors")), truth)
    with pytest.raises(CogExportError, match="PEFT adapters have one kind; this one mixes LoHa, LoKr"):
        export(path, tmp_path / "peft", base=base_folder, lora_format="peft")
    assert not (tmp_path / "peft").exists()
