"""musubi-tuner's LoKr and LoHa of HunyuanVideo (networks.lokr, networks.loha: musubi-tuner's default architecture),
trained on the original model's layers, fused ones included (img_attn_qkv: q, k, v; linear1: q, k, v and the MLP's
input in 7 chunks). A LoHa's product splits along the rows of hada_w1_a and hada_w2_a; a LoKr's along whole rows of
w1 when w1's height divides into the parts (lycoris.py), which musubi-tuner's ``factor=4`` gives at the tiny size
(w1 [out / 4, in / 4], w2 [4, 4]); both are exact, element for element the products of the fused delta.

Files written from musubi-tuner's source (lycoris_helpers.write_musubi_lycoris); the truth is musubi-tuner's merge of
each original layer (lycoris_helpers.musubi_delta), its rows split into the Diffusers modules by the layout of
docs/video-dit-formats.md 2.2 (the DOUBLE_LAYERS / SINGLE_LAYERS tables of test_lora_hunyuanvideo). Judges: --lora
fuse; PEFT's merge (LoHa) and LyCORIS's loader (LoHa) of our outputs on Diffusers names; our ComfyUI file, in
ComfyUI's own names with the fused layers one adapter again, holds the trainer's very tensors and, applied with
ComfyUI's math, gives the truth.
"""

from __future__ import annotations

import pytest
import torch
from lora_helpers import assert_all_equal, peft_fused
from lycoris_helpers import added, comfy_delta, lycoris_loaded, musubi_delta, random_factors, write_musubi_lycoris
from safetensors.torch import load_file
from test_lora_hunyuanvideo import block_layers

from cogexport.exporter import export

lycoris_lora = pytest.importorskip("lycoris", reason="lycoris-lora (a test dependency) is not installed")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from hunyuanvideo_fixtures import build_tiny_transformer

    model = build_tiny_transformer("t2v", seed=0)
    folder = tmp_path_factory.mktemp("hunyuanvideo-base") / "transformer"
    model.save_pretrained(folder)
    return folder, dict(model.config), {name: t.clone() for name, t in model.state_dict().items()}


def musubi_modules(weights_shapes: dict, algo: str, seed: int) -> dict:
    """Every original block layer's factors as musubi-tuner shapes them: LoKr with factor 4 (w1 [out/4, in/4], w2
    [4, 4] low-rank at rank 1), LoHa at rank 2; alphas 2 and 4 in turn."""
    made = {}
    for index, layer in enumerate(sorted(block_layers())):
        out, inp = weights_shapes[f"{layer}.weight"]
        if algo == "lokr":
            shapes = {"lokr_w1": (out // 4, inp // 4), "lokr_w2_a": (4, 1), "lokr_w2_b": (1, 4)}
        else:
            shapes = {"hada_w1_a": (out, 2), "hada_w1_b": (2, inp), "hada_w2_a": (out, 2), "hada_w2_b": (2, inp)}
        made[layer] = (random_factors(shapes, seed + index), (2.0, 4.0)[index % 2])
    return made


def split_truth(modules: dict, weights: dict[str, torch.Tensor], delta_of) -> dict[str, torch.Tensor]:
    """W + each original layer's delta, its rows split into the Diffusers modules it feeds."""
    layers = block_layers()
    deltas = {}
    for layer, (factors, alpha) in modules.items():
        _, chunks, parts = layers[layer]
        pieces = torch.chunk(delta_of(factors, alpha), chunks, dim=0)
        deltas.update({module: torch.cat([pieces[i] for i in take]) for module, take in parts})
    return added(weights, deltas)


@pytest.mark.parametrize("algo", ["lokr", "loha"])
def test_musubi_tuner_lycoris_on_fused_layers(algo, base, tmp_path):
    from hunyuanvideo_fixtures import original_shapes, tiny_config

    folder, config, weights = base
    modules = musubi_modules(original_shapes(tiny_config("t2v")), algo, 40)
    path = write_musubi_lycoris(tmp_path / "run" / f"hv_{algo}.safetensors", modules, algo, factor=4)
    truth = split_truth(modules, weights, musubi_delta)

    export(path, tmp_path / "fused", base=folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)

    result = export(path, tmp_path / "comfyui", base=folder, lora_format="comfyui")
    assert (result.lora["type"], result.lora["modules"], result.lora["layers"]) == (
        "LoKr" if algo == "lokr" else "LoHa", 40, 4)
    written = load_file(tmp_path / "comfyui" / "lora.safetensors")
    layers = block_layers()
    for layer, (factors, alpha) in modules.items():  # the fused layers' factors as the trainer saved them
        comfy = f"diffusion_model.{layers[layer][0]}"
        assert all(torch.equal(written[f"{comfy}.{part}"], tensor) for part, tensor in factors.items()), layer
        rank = factors["lokr_w2_b" if algo == "lokr" else "hada_w1_b"].shape[0]
        # ComfyUI applies a module without .alpha at scale 1: alpha = r is left out
        assert written[f"{comfy}.alpha"].item() == alpha if f"{comfy}.alpha" in written else alpha == rank
    comfy_truth = split_truth({layer: ({p: written[f"diffusion_model.{layers[layer][0]}.{p}"] for p in factors},
                                       _alpha(written, f"diffusion_model.{layers[layer][0]}.alpha"))
                               for layer, (factors, _) in modules.items()}, weights, comfy_delta)
    assert_all_equal(comfy_truth, truth)

    if algo == "loha":  # LoHa factors keep their shapes on every part: PEFT and LyCORIS rebuild them
        export(path, tmp_path / "peft", base=folder, lora_format="peft")
        assert_all_equal(peft_fused(_model_class(), config, weights, tmp_path / "peft"), truth)
        _lycoris(path, tmp_path / "lycoris")
        model = _model_class().from_config(config)
        model.load_state_dict(weights)
        assert_all_equal(added(weights, lycoris_loaded(model, tmp_path / "lycoris" / "lycoris.safetensors")), truth)


def _alpha(tensors: dict, key: str) -> float | None:
    return tensors[key].item() if key in tensors else None


def _model_class():
    from diffusers import HunyuanVideoTransformer3DModel

    return HunyuanVideoTransformer3DModel


def _lycoris(source, out) -> None:
    from safetensors.torch import save_file

    from cogexport.checkpoint import open_checkpoint
    from cogexport.lora import plan_output, read_adapter
    from cogexport.precision import PrecisionPolicy

    with open_checkpoint(source) as checkpoint:
        adapter = read_adapter(checkpoint, str(source), None, [source.parent], checkpoint.info.header_metadata)
        planned = plan_output(adapter, "lycoris", adapter.names, PrecisionPolicy(torch.float32), str(source))
        out.mkdir(parents=True)
        save_file({name: t.load().contiguous() for name, t in planned.tensors.items()}, out / planned.file)


def test_a_lokr_whose_w1_does_not_divide_into_the_fused_parts(base, tmp_path, cli):
    """musubi-tuner's own factorization at this width puts 8 rows in img_attn_qkv's w1 (48 = 8 x 6): a LoKr of
    q, k and v would each need 8/3 of them, so the adapter is refused rather than approximated."""
    folder, _, _ = base
    factors = random_factors({"lokr_w1": (8, 4), "lokr_w2": (6, 4)}, 50)
    path = write_musubi_lycoris(tmp_path / "run" / "hv.safetensors",
                                {"double_blocks.0.img_attn_qkv": (factors, 1.0)}, "lokr")
    from conftest import assert_refusal

    assert_refusal(cli(path, tmp_path / "out", "--base", folder, "--lora", "fuse"),
                   "double_blocks.0.img_attn_qkv's lokr_w1 has 8 rows, which cannot be split into the 3 parts")
    assert not (tmp_path / "out").exists()
