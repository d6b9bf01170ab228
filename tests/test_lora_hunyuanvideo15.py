"""HunyuanVideo 1.5 LoRAs in every trainer's layout, written as every other, at exactly the trained strength.

Two kinds of adapter, as the trainers make them:

- on the original model's layers (musubi-tuner's networks.lora_hv_1_5: q, k and v separate, img_mod.linear,
  img_mlp.fc1 ...), which are Diffusers' modules renamed;
- on ComfyUI's layers (diffusion-pipe trains PEFT on ComfyUI's HunyuanVideo modules: one fused img_attn.qkv,
  img_mlp.0, img_mod.lin), whose fused qkv adapter reaches to_q, to_k and to_v (each takes its rows of lora_B and
  the whole lora_A).

The truth W + (alpha / r) B A is computed here in PEFT's operation order. The judges: Diffusers 0.42 has no
HunyuanVideo 1.5 LoRA loader, so a Diffusers-layout file is applied with PEFT on the Diffusers model
(inject_adapter_in_model + set_peft_model_state_dict with the LoraConfig its lora_adapter_metadata records, then
merged); a PEFT folder by PEFT's own PeftModel.from_pretrained merge. Our musubi and ComfyUI files must equal, tensor
for tensor, the files the test writes from the trainers' documented layouts: musubi-tuner's own names, and for ComfyUI
what musubi-tuner's convert_hunyuan_video_1_5_lora_to_comfy does to a musubi file (q, k, v concatenated into one
qkv adapter: lora_down stacked, lora_up block-diagonal, alpha three times), written out here from that script.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from diffusers import HunyuanVideo15Transformer3DModel, HunyuanVideoPipeline
from hunyuanvideo15_fixtures import build_tiny_transformer, original_shapes
from lora_helpers import (USUAL, assert_all_equal, assert_any_to_any_to_any, header, merged, peft_fused,
                          peft_patterns, peft_wrapped, random_modules, write_comfyui_lora, write_finetrainers_lora,
                          write_musubi_lora, write_peft_adapter, write_peft_checkpoint_file)
from safetensors.torch import load_file, save_file

from cogexport.exporter import export

OUTPUTS = ("diffusers", "peft", "comfyui", "musubi")
OUTPUT_FILE = {"diffusers": "pytorch_lora_weights.safetensors", "peft": "adapter_model.safetensors",
               "comfyui": "lora.safetensors", "musubi": "lora.safetensors"}
HIDDEN = 32

# (rank, alpha) of each kind of original layer: distinct ranks and strengths; q, k and v of one stream share their
# scale alpha / r (2), as one fused ComfyUI adapter must
STRENGTHS = {"attn_q": (4, 8.0), "attn_k": (2, 4.0), "attn_v": (8, 16.0), "attn_proj": (4, 2.0),
             "mlp.fc1": (8, 8.0), "mlp.fc2": (2, 1.0), "mod.linear": (4, 16.0)}
# each original double-block layer: its Diffusers module, and its ComfyUI module (None: part of the stream's qkv)
DOUBLE = {"img_attn_q": ("attn.to_q", None), "img_attn_k": ("attn.to_k", None), "img_attn_v": ("attn.to_v", None),
          "img_attn_proj": ("attn.to_out.0", "img_attn.proj"), "img_mlp.fc1": ("ff.net.0.proj", "img_mlp.0"),
          "img_mlp.fc2": ("ff.net.2", "img_mlp.2"), "img_mod.linear": ("norm1.linear", "img_mod.lin"),
          "txt_attn_q": ("attn.add_q_proj", None), "txt_attn_k": ("attn.add_k_proj", None),
          "txt_attn_v": ("attn.add_v_proj", None), "txt_attn_proj": ("attn.to_add_out", "txt_attn.proj"),
          "txt_mlp.fc1": ("ff_context.net.0.proj", "txt_mlp.0"), "txt_mlp.fc2": ("ff_context.net.2", "txt_mlp.2"),
          "txt_mod.linear": ("norm1_context.linear", "txt_mod.lin")}
QKV = {"img": ("attn.to_q", "attn.to_k", "attn.to_v"), "txt": ("attn.add_q_proj", "attn.add_k_proj",
                                                                "attn.add_v_proj")}


def _kind(layer: str) -> str:
    return next(kind for kind in STRENGTHS if layer.endswith(kind))


@dataclass
class Adapter:
    """A LoRA made here: module -> (A, B, rank, alpha) on original (``naming`` "original") or ComfyUI layers."""

    modules: dict[str, tuple[torch.Tensor, torch.Tensor, int, float]]
    naming: str

    def diffusers(self) -> dict[str, tuple[torch.Tensor, torch.Tensor, int, float]]:
        """The same adapter on the Diffusers modules."""
        out = {}
        for layer, (down, up, rank, alpha) in self.modules.items():
            block, name = layer.split(".", 2)[1], layer.split(".", 2)[2]
            if self.naming == "comfyui" and name.endswith("attn.qkv"):
                for module, rows in zip(QKV[name[:3]], torch.chunk(up, 3, dim=0)):
                    out[f"transformer_blocks.{block}.{module}"] = (down, rows, rank, alpha)
                continue
            original = name if self.naming == "original" else \
                next(o for o, (_, comfy) in DOUBLE.items() if comfy == name)
            out[f"transformer_blocks.{block}.{DOUBLE[original][0]}"] = (down, up, rank, alpha)
        return out

    def truth(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in self.diffusers().items()})


def original_adapter(seed: int = 0, uniform: bool = False) -> Adapter:
    """musubi-tuner's layers in 2 double blocks; ``uniform``: every layer at the usual rank and alpha."""
    layers = [f"double_blocks.{i}.{name}" for i in range(2) for name in DOUBLE]
    modules = {}
    for index, layer in enumerate(layers):
        strength = USUAL if uniform else STRENGTHS[_kind(layer)]
        modules.update(random_modules(original_shapes(build_config()), [layer], seed + index, (strength,)))
    return Adapter(modules, "original")


def comfyui_adapter(seed: int = 0) -> Adapter:
    """diffusion-pipe's layers: ComfyUI's, a fused qkv per stream."""
    shapes = {}
    for i in range(2):
        for stream in ("img", "txt"):
            shapes[f"double_blocks.{i}.{stream}_attn.qkv.weight"] = torch.Size((3 * HIDDEN, HIDDEN))
            shapes[f"double_blocks.{i}.{stream}_attn.proj.weight"] = torch.Size((HIDDEN, HIDDEN))
            shapes[f"double_blocks.{i}.{stream}_mlp.0.weight"] = torch.Size((4 * HIDDEN, HIDDEN))
            shapes[f"double_blocks.{i}.{stream}_mlp.2.weight"] = torch.Size((HIDDEN, 4 * HIDDEN))
            shapes[f"double_blocks.{i}.{stream}_mod.lin.weight"] = torch.Size((6 * HIDDEN, HIDDEN))
    layers = sorted(name[: -len(".weight")] for name in shapes)
    return Adapter(random_modules(shapes, layers, seed, ((4, 8.0), (2, 2.0), (8, 4.0), (4, 3.0))), "comfyui")


def build_config() -> dict:
    return dict(build_tiny_transformer("t2v").config)


# -- the trainers' layouts ------------------------------------------------------------------------------------------
def write_musubi(path: Path, adapter: Adapter) -> Path:
    return write_musubi_lora(path, adapter.modules, "networks.lora_hv_1_5")


def musubi_to_comfy(musubi: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """musubi-tuner's convert_hunyuan_video_1_5_lora_to_comfy, from its documented behaviour: img_mlp_fc1 / fc2 /
    img_mod_linear renamed to ComfyUI's img_mlp_0 / 2 / img_mod_lin; each stream's q, k, v adapters concatenated into
    one _qkv adapter (lora_down stacked, lora_up block-diagonal, alpha three times q's: the converter assumes q, k and
    v of one rank; for adapters of several ranks the alpha that keeps their one scale is q's scale times the stacked
    rank, which is the same number when the ranks agree)."""
    renames = {"_mlp_fc1": "_mlp_0", "_mlp_fc2": "_mlp_2", "_mod_linear": "_mod_lin"}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in musubi.items():
        name, part = key.split(".", 1)
        if any(name.endswith(f"_attn_{x}") for x in "qkv"):
            continue
        for old, new in renames.items():
            name = name.replace(old, new)
        out[f"{name}.{part}"] = tensor
    for prefix in sorted({key.split(".", 1)[0][: -len("_q")] for key in musubi if key.split(".", 1)[0].endswith("_q")}):
        downs = [musubi[f"{prefix}_{x}.lora_down.weight"] for x in "qkv"]
        ups = [musubi[f"{prefix}_{x}.lora_up.weight"] for x in "qkv"]
        out[f"{prefix}_qkv.lora_down.weight"] = torch.cat(downs, dim=0)
        out[f"{prefix}_qkv.lora_up.weight"] = torch.block_diag(*ups)
        scale = musubi[f"{prefix}_q.alpha"] / downs[0].shape[0]
        out[f"{prefix}_qkv.alpha"] = scale * sum(down.shape[0] for down in downs)
    return out


def write_comfyui(path: Path, adapter: Adapter) -> Path:
    """ComfyUI's names under diffusion_model., lora_down / lora_up, .alpha where not r: the ComfyUI layers' own
    adapter, or an original-layer adapter fused the way musubi-tuner's converter fuses it."""
    if adapter.naming == "comfyui":
        return write_comfyui_lora(path, adapter.modules)
    converted = musubi_to_comfy(load_file(write_musubi(path.with_name("musubi-first.safetensors"), adapter)))
    tensors = {}
    for key, tensor in converted.items():
        name, part = key.split(".", 1)
        block, stream, rest = re.fullmatch(r"lora_unet_double_blocks_(\d+)_(img|txt)_(.+)", name).groups()
        tensors[f"diffusion_model.double_blocks.{block}.{stream}_{rest.replace('_', '.')}.{part}"] = tensor
    ranks = {key[: -len(".alpha")]: tensors[key[: -len(".alpha")] + ".lora_down.weight"].shape[0]
             for key in tensors if key.endswith(".alpha")}
    for module, rank in ranks.items():  # ComfyUI's files leave out an alpha equal to the rank
        if tensors[f"{module}.alpha"].item() == rank:
            del tensors[f"{module}.alpha"]
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path)
    return path


def write_diffusion_pipe(folder: Path, adapter: Adapter) -> Path:
    """diffusion-pipe: PEFT on ComfyUI's modules, diffusion_model. + lora_A / lora_B, adapter_config.json beside."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"diffusion_model.{layer}.lora_{part}.weight": t for layer, (a, b, _, _) in adapter.modules.items()
               for part, t in (("A", a), ("B", b))}
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **peft_patterns(adapter.modules)}))
    return folder / "adapter_model.safetensors"


def write_diffusers(folder: Path, adapter: Adapter) -> Path:
    """Diffusers' LoRA file format, written by Diffusers' own save_lora_weights (HunyuanVideo 1.5's pipeline has no
    LoRA mixin; the file format is the mixins' shared one)."""
    modules = adapter.diffusers()
    layers = {f"{m}.lora_{part}.weight": t.clone() for m, (a, b, _, _) in modules.items()
              for part, t in (("A", a), ("B", b))}
    HunyuanVideoPipeline.save_lora_weights(folder, transformer_lora_layers=layers,
                                           transformer_lora_adapter_metadata=peft_patterns(modules))
    return folder / OUTPUT_FILE["diffusers"]


# -- judges ---------------------------------------------------------------------------------------------------------
def peft_injected(config: dict, weights: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """A Diffusers-layout LoRA file as PEFT applies it to the Diffusers model: the LoraConfig its metadata records,
    inject_adapter_in_model, set_peft_model_state_dict, every LoRA layer merged."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from peft.tuners.lora import LoraLayer

    recorded = json.loads(header(path)["lora_adapter_metadata"])
    fields = ("r", "lora_alpha", "target_modules", "rank_pattern", "alpha_pattern", "use_rslora", "use_dora",
              "lora_bias")
    arguments = {k[len("transformer."):]: v for k, v in recorded.items() if k[len("transformer."):] in fields}
    model = HunyuanVideo15Transformer3DModel.from_config(config)
    model.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    inject_adapter_in_model(LoraConfig(**arguments), model)
    state = {k[len("transformer."):]: v for k, v in load_file(path).items()}
    result = set_peft_model_state_dict(model, state)
    assert not result.unexpected_keys, result.unexpected_keys
    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    return {name.replace(".base_layer", ""): tensor for name, tensor in model.state_dict().items()
            if ".lora_" not in name}


def judged(folder: Path, target: str, config: dict, weights: dict[str, torch.Tensor], base: Path):
    """Our output as its loader applies it: PEFT for peft and diffusers; the musubi and comfyui files read back by
    cogexport into a Diffusers file first."""
    if target == "peft":
        return peft_fused(HunyuanVideo15Transformer3DModel, config, weights, folder)
    if target != "diffusers":
        export(folder, folder.with_name(folder.name + "-read-back"), base=base, lora_format="diffusers")
        folder = folder.with_name(folder.name + "-read-back")
    return peft_injected(config, weights, folder / OUTPUT_FILE["diffusers"])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    model = build_tiny_transformer("t2v", seed=0)
    folder = tmp_path_factory.mktemp("hunyuanvideo15-base") / "transformer"
    model.save_pretrained(folder)
    return folder, dict(model.config), {name: t.clone() for name, t in model.state_dict().items()}


@pytest.fixture(scope="module")
def synthetic(base, tmp_path_factory):
    folder, config, weights = base
    inputs = tmp_path_factory.mktemp("hunyuanvideo15-inputs")
    musubi, comfy, uniform = original_adapter(), comfyui_adapter(seed=1), original_adapter(seed=2, uniform=True)
    unit = Adapter({m: (a, b, r, float(r)) for m, (a, b, r, _) in musubi.modules.items()}, "original")
    one = original_adapter(seed=3, uniform=True)
    original = inputs / "original" / "lora.safetensors"
    original.parent.mkdir(parents=True)
    save_file({f"diffusion_model.{layer}.lora_{part}.weight": t for layer, (a, b, _, _) in unit.modules.items()
               for part, t in (("A", a), ("B", b))}, original)
    kohya_comfy = inputs / "comfy-kohya" / "lora.safetensors"
    kohya_comfy.parent.mkdir(parents=True)
    save_file(musubi_to_comfy(load_file(write_musubi(inputs / "uniform" / "lora.safetensors", uniform))), kohya_comfy)
    wrapped = peft_wrapped(HunyuanVideo15Transformer3DModel, config, weights, musubi.diffusers())
    return {"musubi": (write_musubi(inputs / "musubi" / "lora.safetensors", musubi), musubi),
            "comfyui": (write_comfyui(inputs / "comfyui" / "lora.safetensors", comfy), comfy),
            "comfyui-from-musubi": (write_comfyui(inputs / "converted" / "lora.safetensors", musubi), musubi),
            "comfy-kohya": (kohya_comfy, uniform),
            "diffusion-pipe": (write_diffusion_pipe(inputs / "diffusion-pipe", comfy), comfy),
            "original": (original, unit),
            "diffusers": (write_diffusers(inputs / "diffusers", musubi), musubi),
            "finetrainers": (write_finetrainers_lora(inputs / "finetrainers" / "pytorch_lora_weights.safetensors",
                                                     one.diffusers()), one),
            "peft": (write_peft_adapter(inputs / "peft", wrapped), musubi),
            "peft-checkpoint": (write_peft_checkpoint_file(inputs / "ddp", wrapped), musubi)}


INPUTS = ("musubi", "comfyui", "comfyui-from-musubi", "comfy-kohya", "diffusion-pipe", "original", "diffusers",
          "finetrainers", "peft", "peft-checkpoint")
WRITERS = {"musubi": write_musubi, "comfyui": write_comfyui}
# inputs whose q, k and v adapters are separate, as musubi-tuner trains them: our musubi and ComfyUI files of them are
# the trainers' files. An input with one fused qkv adapter (ComfyUI's layers, or musubi's file converted for ComfyUI)
# is split exactly, but each of q, k, v keeps the fused adapter's whole lora_A (its rank, with zero columns of lora_B
# where a musubi file converted for ComfyUI had other blocks): the same weights, not the same file.
SEPARATE_QKV = ("musubi", "original", "diffusers", "finetrainers", "peft", "peft-checkpoint")


@pytest.mark.parametrize("source", INPUTS)
def test_every_layout_to_every_layout_at_the_trained_strength(source, synthetic, base, tmp_path):
    folder, config, weights = base
    path, adapter = synthetic[source]
    truth = adapter.truth(weights)
    if source == "diffusers":  # the input itself, as PEFT applies it
        assert_all_equal(peft_injected(config, weights, path), truth)
    for target in OUTPUTS:
        result = export(path, tmp_path / target, base=folder, lora_format=target)
        assert result.family == "HunyuanVideo 1.5"
        assert_all_equal(judged(tmp_path / target, target, config, weights, folder), truth)
        if target in WRITERS and source in SEPARATE_QKV:
            expected = load_file(WRITERS[target](tmp_path / f"expected-{target}.safetensors", adapter))
            assert_all_equal(load_file(tmp_path / target / OUTPUT_FILE[target]), expected)
    export(path, tmp_path / "fused", base=folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), truth)


def test_any_to_any_to_any_is_exact(synthetic, base, tmp_path):
    """Through every layout and back, the same files bit for bit: a musubi file through the Diffusers and PEFT names
    (its header naming the network module that loads it), a ComfyUI file through every layout, its fused qkv adapter
    split into to_q, to_k, to_v (lora_A copied to each) and one adapter again."""
    folder = base[0]
    assert_any_to_any_to_any(export, synthetic["musubi"][0], "musubi", folder, ("diffusers", "peft", "musubi"),
                             tmp_path)
    assert_any_to_any_to_any(export, synthetic["comfyui"][0], "comfyui", folder, OUTPUTS, tmp_path)
    assert header(tmp_path / "musubi-musubi" / "lora.safetensors")["ss_network_module"] == "networks.lora_hv_1_5"
    assert_all_equal(load_file(tmp_path / "comfyui-comfyui" / "lora.safetensors"),
                     load_file(synthetic["comfyui"][0]))


def test_inspect_says_what_each_file_is(synthetic, cli):
    expected = {"musubi": ("hunyuanvideo15/musubi_lora", "the file's .alpha tensors"),
                "original": ("hunyuanvideo15/original_lora", "no .alpha tensors: applied at scale 1 (alpha = r)"),
                # musubi-tuner's ComfyUI conversion: img_mlp_0 and img_mod_lin are no HunyuanVideo kohya names
                "comfy-kohya": ("hunyuanvideo15/comfyui_kohya_lora", "the file's .alpha tensors")}
    for source, (layout, alpha_source) in expected.items():
        result = cli("inspect", synthetic[source][0], "--json")
        assert result.exit_code == 0, result.stderr
        lora = json.loads(result.stdout)["models"]["lora"]
        assert "problem" not in lora, (source, lora)
        assert (lora["family"], lora["layout"], lora["alpha_source"]) == ("HunyuanVideo 1.5", layout, alpha_source)
    # ComfyUI's and Diffusers' names of the double blocks are HunyuanVideo's too: at the tiny width nothing tells the
    # two apart but --base (the separate img_attn_q of the original names is HunyuanVideo 1.5's alone)
    for source in ("comfyui", "diffusion-pipe", "diffusers"):
        lora = json.loads(cli("inspect", synthetic[source][0], "--json").stdout)["models"]["lora"]
        problem = lora["problem"]
        assert "layers that HunyuanVideo" in problem and "HunyuanVideo 1.5" in problem and "--base" in problem, source


@pytest.mark.parametrize("width, family", [(2048, "HunyuanVideo 1.5"), (3072, "HunyuanVideo")])
def test_comfyui_names_at_a_release_width_name_their_family(width, family, cli, tmp_path):
    """A ComfyUI LoRA of the fused qkv and an MLP at HunyuanVideo 1.5's width (2048) or HunyuanVideo's (3072): the
    layer sizes of the published models say which, without --base."""
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for layer, rows in (("img_attn.qkv", 3 * width), ("img_mlp.0", 4 * width)):
        tensors[f"diffusion_model.double_blocks.0.{layer}.lora_down.weight"] = torch.randn(1, width,
                                                                                            generator=generator)
        tensors[f"diffusion_model.double_blocks.0.{layer}.lora_up.weight"] = torch.randn(rows, 1, generator=generator)
    save_file(tensors, tmp_path / "lora.safetensors")
    lora = json.loads(cli("inspect", tmp_path / "lora.safetensors", "--json").stdout)["models"]["lora"]
    assert lora["family"] == family, lora


def test_bad_hunyuanvideo15_lora_input(cli, tmp_path, synthetic, base):
    from conftest import snapshot

    folder = base[0]
    musubi = synthetic["musubi"][0]
    before = snapshot(musubi.parent)
    tensors = load_file(musubi)
    tensors["lora_unet_double_blocks_0_img_attn_q.lora_up.weight"] = torch.zeros(HIDDEN, 3)
    save_file(tensors, tmp_path / "ranks.safetensors")
    refused = cli(tmp_path / "ranks.safetensors", tmp_path / "o1", "--base", folder)
    assert refused.exit_code == 2 and "the ranks of lora_unet_double_blocks_0_img_attn_q differ" in refused.stderr

    tensors = load_file(musubi)
    tensors["lora_unet_single_blocks_0_linear1.lora_down.weight"] = torch.zeros(4, HIDDEN)  # HunyuanVideo's, not 1.5's
    tensors["lora_unet_single_blocks_0_linear1.lora_up.weight"] = torch.zeros(7 * HIDDEN, 4)
    save_file(tensors, tmp_path / "single.safetensors")
    refused = cli(tmp_path / "single.safetensors", tmp_path / "o2", "--base", folder)
    assert refused.exit_code == 2 and len(refused.error_lines) == 1, refused.stderr
    assert "lora_unet_single_blocks_0_linear1 names no layer of a HunyuanVideo 1.5 transformer" in refused.stderr

    uneven = load_file(musubi)
    uneven["lora_unet_double_blocks_1_img_attn_k.alpha"] = torch.tensor(16.0)  # scale 8 beside q's and v's 2
    save_file(uneven, tmp_path / "uneven.safetensors")
    refused = cli(tmp_path / "uneven.safetensors", tmp_path / "o3", "--base", folder, "--lora-format", "comfyui")
    assert refused.exit_code == 2 and "different strengths" in refused.stderr, refused.stderr
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 4))
    assert snapshot(musubi.parent) == before
