"""Two plain-LoRA layouts on Diffusers module names, read for every family whose trainers write them, at exactly the
trained strength:

- SimpleTuner's ``lora_format = comfyui`` (Wan, LTX-Video): its save_lora_weights hands Diffusers' state dict to
  convert_diffusers_to_comfyui (simpletuner/helpers/training/lora_format.py), which swaps ``transformer.`` for
  ``diffusion_model.``, keeps lora_A / lora_B and adds an fp32 ``.alpha`` per module (the adapter config's
  alpha_pattern entry for that exact module name, else lora_alpha, else the rank); the header keeps the config as
  ``lora_adapter_metadata``, without Diffusers' ``transformer.`` prefix (simpletuner/helpers/models/common.py).
- OneTrainer's legacy names (Wan, HunyuanVideo): LoraConversionKeySet's legacy_diffusers key
  (modules/util/convert/lora/convert_lora_util.py) is the ``lora_transformer`` prefix and the Diffusers module path
  with dots written as underscores, then ``.lora_down.weight``, ``.lora_up.weight`` or ``.alpha``.

The files are written here from those facts (neither trainer is installed), from adapters made with distinct ranks
and alphas; the truth is W + (alpha / r) B A in PEFT's operation order. Judges: Diffusers' own loader and PEFT's merge
of our diffusers and peft outputs (Wan, LTX-Video, HunyuanVideo: each family's test module's judge), and --lora fuse.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_refusal
from lora_helpers import assert_all_equal, peft_patterns, write_diffusers_lora
from safetensors.torch import load_file, save_file
from wan_fixtures import REAL_WAN

from cogexport.exporter import export

SIMPLETUNER_METADATA = "lora_adapter_metadata"


def write_simpletuner_comfyui(path: Path, diffusers_file: Path, modules: dict) -> Path:
    """SimpleTuner's ComfyUI file of the adapter Diffusers saved in ``diffusers_file`` (module -> (A, B, r, alpha))."""
    config = peft_patterns(modules)
    tensors, alphas = {}, {}
    for key, weight in load_file(diffusers_file).items():
        name = "diffusion_model." + key[len("transformer."):] if key.startswith("transformer.") else key
        if ".lora_A." in name:
            module = name[: name.rfind(".lora_A.")]
            alpha = config["alpha_pattern"].get(module[len("diffusion_model."):], config["lora_alpha"])
            alphas.setdefault(module, torch.tensor(alpha, dtype=torch.float32))
        tensors[name] = weight
    tensors.update({f"{module}.alpha": alpha for module, alpha in alphas.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path, metadata={"format": "pt", SIMPLETUNER_METADATA: json.dumps(config, indent=2,
                                                                                       sort_keys=True)})
    return path


def write_onetrainer_legacy(path: Path, modules: dict) -> Path:
    """OneTrainer's legacy LoRA file of ``modules`` (Diffusers module -> (A, B, r, alpha))."""
    tensors = {}
    for module, (down, up, _, alpha) in modules.items():
        name = "lora_transformer_" + module.replace(".", "_")
        tensors.update({f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up,
                        f"{name}.alpha": torch.tensor(alpha)})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path)
    return path


def fused(source: Path, base_folder: Path, out: Path) -> dict[str, torch.Tensor]:
    export(source, out, base=base_folder, lora="fuse", dtype="fp32")
    return load_file(out / "diffusion_pytorch_model.safetensors")


# -- Wan ---------------------------------------------------------------------------------------------------------------
wan = pytest.mark.skipif(not REAL_WAN.is_dir(), reason=f"the real Wan fixtures are not at {REAL_WAN}")


@pytest.fixture(scope="module")
def wan_base():
    from diffusers import WanTransformer3DModel
    from test_lora_wan import BASE_FOLDER, BASE_TRUTH

    return WanTransformer3DModel.load_config(BASE_FOLDER), load_file(BASE_TRUTH)


@wan
@pytest.mark.parametrize("layout", ["simpletuner-comfyui", "onetrainer-legacy"])
def test_wan(layout, wan_base, tmp_path, cli):
    from diffusers import WanPipeline
    from test_lora_wan import BASE_FOLDER, every_block_layer, judged, make_adapter

    config, weights = wan_base
    adapter = make_adapter(weights, every_block_layer(), seed=31)  # Diffusers' musubi Wan converter: blocks only
    if layout == "simpletuner-comfyui":
        diffusers_file = write_diffusers_lora(WanPipeline, tmp_path / "trained", adapter.modules)
        path = write_simpletuner_comfyui(tmp_path / "run" / "pytorch_lora_weights.safetensors", diffusers_file,
                                         adapter.modules)
    else:
        path = write_onetrainer_legacy(tmp_path / "run" / "lora.safetensors", adapter.modules)
    truth = adapter.truth(weights)
    assert_all_equal(fused(path, BASE_FOLDER, tmp_path / "fused"), truth)
    for target in ("diffusers", "peft", "comfyui", "musubi"):
        result = export(path, tmp_path / target, base=BASE_FOLDER, lora_format=target)
        assert result.lora["layout"] == {"simpletuner-comfyui": "wan/simpletuner_comfyui_lora",
                                         "onetrainer-legacy": "wan/onetrainer_lora"}[layout]
        assert result.lora["alpha_source"] == "the file's .alpha tensors" and result.lora["modules"] == 20
        assert_all_equal(judged(tmp_path / target, target, config, weights), truth)
    report = json.loads(cli("inspect", path, "--json").stdout)
    assert report["usable"] and report["models"]["lora"]["type"] == "LoRA"


@wan
def test_wan_simpletuner_file_against_a_base_of_another_family(wan_base, tmp_path, cli):
    """The family mismatch names the base's family (the file used to be told it names no HunyuanVideo layer)."""
    from cogvideox_fixtures import build_tiny_transformer, config_folder
    from diffusers import WanPipeline
    from test_lora_wan import every_block_layer, make_adapter

    _, weights = wan_base
    adapter = make_adapter(weights, every_block_layer(1), seed=32)
    diffusers_file = write_diffusers_lora(WanPipeline, tmp_path / "trained", adapter.modules)
    path = write_simpletuner_comfyui(tmp_path / "run" / "lora.safetensors", diffusers_file, adapter.modules)
    cogvideox = config_folder(tmp_path / "cogvideox", build_tiny_transformer("2b", num_layers=2))
    assert_refusal(cli(path, tmp_path / "out", "--base", cogvideox), "is a Wan LoRA", "is a CogVideoX model")
    tensors = load_file(path)
    tensors["diffusion_model.blocks.0.attn1.to_x.lora_A.weight"] = torch.zeros(4, 32)
    tensors["diffusion_model.blocks.0.attn1.to_x.lora_B.weight"] = torch.zeros(32, 4)
    save_file(tensors, tmp_path / "foreign.safetensors")
    from test_lora_wan import BASE_FOLDER

    assert_refusal(cli(tmp_path / "foreign.safetensors", tmp_path / "out", "--base", BASE_FOLDER),
                   "blocks.0.attn1.to_x names no layer of a Wan transformer")


# -- LTX-Video: SimpleTuner's ComfyUI files, renamed layers included ---------------------------------------------------
def test_ltx_video_simpletuner_comfyui(tmp_path):
    from diffusers import LTXPipeline, LTXVideoTransformer3DModel
    from test_lora_ltx_video import OUTSIDE_LAYERS, block_layers, build_transformer, diffusers_judged, make_adapter

    model = build_transformer("2b", seed=0)
    model.save_pretrained(tmp_path / "base" / "transformer")
    base_folder, config, weights = tmp_path / "base" / "transformer", dict(model.config), model.state_dict()
    adapter = make_adapter(weights, [*block_layers(), *OUTSIDE_LAYERS], seed=33)
    diffusers_file = write_diffusers_lora(LTXPipeline, tmp_path / "trained", adapter.modules)
    path = write_simpletuner_comfyui(tmp_path / "run" / "pytorch_lora_weights.safetensors", diffusers_file,
                                     adapter.modules)
    truth = adapter.truth(weights)
    assert_all_equal(fused(path, base_folder, tmp_path / "fused"), truth)
    result = export(path, tmp_path / "diffusers", base=base_folder, lora_format="diffusers")
    assert result.lora["layout"] == "ltx_video/simpletuner_comfyui_lora"  # proj_in, time_embed: Diffusers names
    assert_all_equal(diffusers_judged(tmp_path / "diffusers" / "pytorch_lora_weights.safetensors", config, weights),
                     truth)
    assert LTXVideoTransformer3DModel  # the family's class, judged through its pipeline's loader


# -- HunyuanVideo: OneTrainer's legacy files ---------------------------------------------------------------------------
def test_hunyuanvideo_onetrainer_legacy(tmp_path):
    from test_lora_hunyuanvideo import block_layers, build_tiny_transformer, diffusers_judged, make_adapter

    model = build_tiny_transformer("t2v", seed=0)
    model.save_pretrained(tmp_path / "base" / "transformer")
    base_folder, config, weights = tmp_path / "base" / "transformer", dict(model.config), model.state_dict()
    adapter = make_adapter(block_layers(), seed=34)  # on the original layers; OneTrainer trains Diffusers modules
    modules = adapter.diffusers()
    separate = {m: (a.clone(), b, r, alpha) for m, (a, b, r, alpha) in modules.items()}  # one lora_A each
    path = write_onetrainer_legacy(tmp_path / "run" / "lora.safetensors", separate)
    truth = adapter.truth(weights)
    assert_all_equal(fused(path, base_folder, tmp_path / "fused"), truth)
    result = export(path, tmp_path / "diffusers", base=base_folder, lora_format="diffusers")
    assert result.lora["layout"] == "hunyuanvideo/onetrainer_lora" and result.lora["modules"] == 40
    assert_all_equal(diffusers_judged(tmp_path / "diffusers" / "pytorch_lora_weights.safetensors", config, weights),
                     truth)
