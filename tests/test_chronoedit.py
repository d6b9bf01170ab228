"""ChronoEdit (issue 41): Wan 2.1 I2V's weights under another config. A tiny ChronoEditPipeline made with the real
Diffusers classes (scripts/make_tiny_chronoedit.py, its RoPE temporal skip off the class's default) is the ground
truth: exported into a pipeline with --base it keeps ChronoEdit's class and RoPE setting and renders; its original
layout is read back by Diffusers' own single-file loader to exactly its tensors; a DiffSynth-Studio LoRA (the layout
ChronoEdit's LoRA training writes) comes out in ComfyUI's layout and fuses exactly. Weights that say nothing of which
model they are (a full-size ChronoEdit's are a Wan2.1-I2V-14B's) are refused unless the user or a config says which.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from conftest import assert_refusal, leftovers
from fixtures import SCRIPTS, cached_fixture
from lora_helpers import assert_all_equal, diffusers_fused, merged, random_modules
from safetensors.torch import load_file, save_file
from wan_fixtures import same_files, weights

from cogexport.errors import CogExportError
from cogexport.exporter import export, export_original
from cogexport.exporter.options import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.keymap.plan import translate_shapes
from cogexport.keymap.table import load_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import family_named
from cogexport.models.target import build_target

SCRIPTS_USED = ("make_tiny_chronoedit.py", "make_tiny_wan.py", "wan_tiny_configs.py", "tiny_models.py")
TINY_ROPE_SKIP = 4  # make_tiny_chronoedit.py's rope_temporal_skip_len (the class's default is 8)
REFUSAL = ("nothing says which it is", "--model-name Wan2.1-I2V-14B-480P or --model-name ChronoEdit-14B")


@pytest.fixture(scope="module")
def pipeline() -> Path:
    """The tiny ChronoEdit pipeline folder (seed 0), made once."""
    return cached_fixture("chronoedit-pipeline", SCRIPTS_USED, [str(SCRIPTS / "make_tiny_chronoedit.py")])


def original_names(module: str) -> str:
    """The Wan repo's (and DiffSynth-Studio's) name of a Diffusers block layer, written out here on purpose."""
    _, index, rest = module.split(".", 2)
    renamed = {"attn1.to_q": "self_attn.q", "attn1.to_k": "self_attn.k", "attn1.to_v": "self_attn.v",
               "attn1.to_out.0": "self_attn.o", "attn2.to_q": "cross_attn.q", "attn2.to_k": "cross_attn.k",
               "attn2.to_v": "cross_attn.v", "attn2.to_out.0": "cross_attn.o", "ffn.net.0.proj": "ffn.0",
               "ffn.net.2": "ffn.2"}[rest]
    return f"blocks.{index}.{renamed}"


# -- the pipeline and the way back ----------------------------------------------------------------------------
def test_pipeline_with_base_keeps_the_rope_setting_and_renders(pipeline, tmp_path):
    from diffusers import ChronoEditPipeline
    from PIL import Image

    result = export(pipeline / "transformer", tmp_path / "out", base=pipeline, dtype="fp32")
    assert result.family == "ChronoEdit"
    config = json.loads((tmp_path / "out" / "transformer" / "config.json").read_text())
    assert config["_class_name"] == "ChronoEditTransformer3DModel"
    assert config["rope_temporal_skip_len"] == TINY_ROPE_SKIP
    assert json.loads((tmp_path / "out" / "model_index.json").read_text())["_class_name"] == "ChronoEditPipeline"
    assert_all_equal(weights(tmp_path / "out" / "transformer"), weights(pipeline / "transformer"))
    loaded = ChronoEditPipeline.from_pretrained(tmp_path / "out")
    assert loaded.transformer.rope.temporal_skip_len == TINY_ROPE_SKIP
    frames = loaded(image=Image.new("RGB", (16, 16), (90, 140, 200)), prompt="a cat", height=16, width=16,
                    num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape[-3:] == (16, 16, 3) and torch.isfinite(torch.as_tensor(frames)).all()


def test_to_original_is_read_back_by_diffusers_single_file(pipeline, tmp_path):
    """Diffusers' from_single_file (its Wan converter, which it uses for ChronoEdit) reads our original file back to
    exactly the model; the file's WanModel config records the RoPE setting, so exporting it again, with nothing
    else, gives the model's save_pretrained files byte for byte."""
    from diffusers import ChronoEditTransformer3DModel

    export_original(pipeline, tmp_path / "original", dtype="fp32")
    file = tmp_path / "original" / "diffusion_pytorch_model.safetensors"
    read = ChronoEditTransformer3DModel.from_single_file(str(file), config=str(pipeline / "transformer"))
    assert_all_equal(read.state_dict(), weights(pipeline / "transformer"))
    assert json.loads((tmp_path / "original" / "config.json").read_text())["rope_temporal_skip_len"] == TINY_ROPE_SKIP
    assert export(tmp_path / "original", tmp_path / "back", dtype="fp32").family == "ChronoEdit"
    assert same_files(tmp_path / "back", pipeline / "transformer") == []


def test_bf16_export_keeps_what_diffusers_keeps_in_fp32(pipeline, tmp_path):
    """The fp32 allowlist is the class's own: our bf16 export is byte for byte what from_pretrained(torch_dtype=bf16)
    then save_pretrained write."""
    from diffusers import ChronoEditTransformer3DModel

    ChronoEditTransformer3DModel.from_pretrained(pipeline / "transformer", torch_dtype=torch.bfloat16) \
        .save_pretrained(tmp_path / "diffusers-bf16")
    export(pipeline / "transformer", tmp_path / "ours", dtype="bf16")
    # from_pretrained records where it read the model (_name_or_path) in the config it saves; the weights are equal
    assert same_files(tmp_path / "ours", tmp_path / "diffusers-bf16") == ["config.json"]
    assert (tmp_path / "ours" / "config.json").read_bytes() == (pipeline / "transformer" / "config.json").read_bytes()


# -- weights that do not say which model they are ---------------------------------------------------------------
def full_size_shapes(original: bool) -> dict[str, torch.Size]:
    """A published ChronoEdit-14B's tensor shapes (meta device: nothing allocated), in Diffusers' or Wan's names."""
    family = family_named("chronoedit")
    target = build_target(family.transformer.class_name, family.transformer_config(family.variants[0]))
    return translate_shapes(load_table("wan/original_transformer").inverted(), target.schema) if original \
        else dict(target.schema)


def lazy(shapes: dict) -> dict[str, LazyTensor]:
    return {name: LazyTensor(torch.Size(shape), torch.float32, lambda: None) for name, shape in shapes.items()}


@pytest.mark.parametrize("original", [True, False], ids=["original-names", "diffusers-names"])
def test_full_size_weights_need_the_users_word(original, tmp_path):
    source = lazy(full_size_shapes(original))
    with pytest.raises(CogExportError, match="nothing says which it is"):
        plan_transformer(source, ExportOptions(), "run")
    chrono = plan_transformer(source, ExportOptions(model_name="ChronoEdit-14B"), "run")
    assert (chrono.family.name, chrono.label) == ("ChronoEdit", "ChronoEdit-14B")
    assert chrono.target.class_name == "ChronoEditTransformer3DModel"
    assert chrono.target.config["rope_temporal_skip_len"] == 8  # the published model's (the class's default)
    wan = plan_transformer(source, ExportOptions(model_name="Wan2.1-I2V-14B-480P"), "run")
    assert (wan.family.name, wan.label, wan.target.class_name) == \
        ("Wan", "Wan2.1-I2V-14B-480P", "WanTransformer3DModel")
    # a Wan config beside the weights says Wan, as it always has: the Wan repo's WanModel config.json
    (tmp_path / "config.json").write_text(json.dumps({
        "_class_name": "WanModel", "model_type": "i2v", "dim": 5120, "num_heads": 40, "ffn_dim": 13824,
        "num_layers": 40, "in_dim": 36, "out_dim": 16}))
    if original:
        beside = plan_transformer(source, ExportOptions(), "run", folders=[tmp_path])
        assert beside.family.name == "Wan" and "rope_temporal_skip_len" not in beside.target.config


def test_the_base_says_which_model_weights_alone_are(pipeline, tmp_path):
    """The tiny ChronoEdit's weights alone (no config beside them): a Wan I2V --base makes them a Wan model (the
    user's word, Wan's config: no RoPE skip), a ChronoEdit --base a ChronoEdit one."""
    import shutil

    from wan_fixtures import tiny_wan_pipeline

    alone = tmp_path / "run" / "model.safetensors"
    alone.parent.mkdir()
    shutil.copyfile(pipeline / "transformer" / "diffusion_pytorch_model.safetensors", alone)
    as_wan = export(alone, tmp_path / "wan", base=tiny_wan_pipeline("i2v") / "transformer", dtype="fp32")
    as_chronoedit = export(alone, tmp_path / "chronoedit", base=pipeline / "transformer", dtype="fp32")
    assert (as_wan.family, as_chronoedit.family) == ("Wan", "ChronoEdit")
    wan_config = json.loads((tmp_path / "wan" / "config.json").read_text())
    assert wan_config["_class_name"] == "WanTransformer3DModel" and "rope_temporal_skip_len" not in wan_config
    assert same_files(tmp_path / "chronoedit", pipeline / "transformer") == []


def sparse_safetensors(path: Path, shapes: dict[str, torch.Size]) -> Path:
    """A bf16 safetensors file of these shapes whose data is a hole (a sparse file: tens of GB that take no disk)."""
    offset, header = 0, {}
    for name, shape in shapes.items():
        size = 2 * torch.Size(shape).numel()
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text)
        file.truncate(8 + len(text) + offset)
    return path


def test_cli_refuses_a_full_size_release_that_does_not_say_which(cli, tmp_path):
    """A full-size Wan I2V / ChronoEdit file alone: one line naming both choices, exit 2, nothing written."""
    file = sparse_safetensors(tmp_path / "input" / "model.safetensors", full_size_shapes(original=True))
    before = (file.stat().st_size, file.stat().st_mtime_ns)
    assert_refusal(cli(file, tmp_path / "out"), *REFUSAL)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    assert (file.stat().st_size, file.stat().st_mtime_ns) == before
    inspected = cli("inspect", "--quick", "--json", file)
    assert inspected.exit_code == 0, inspected.stderr
    assert json.loads(inspected.stdout)["models"]["transformer"]["model"] == "Wan2.1-I2V-14B-480P or ChronoEdit-14B"


# -- a DiffSynth-Studio LoRA --------------------------------------------------------------------------------------
BLOCK_LAYERS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2")


@pytest.fixture(scope="module")
def diffsynth_lora(pipeline, tmp_path_factory):
    """ChronoEdit's LoRA training (DiffSynth-Studio, --lora_target_modules q,k,v,o,ffn.0,ffn.2) saves its PEFT
    adapter in the original names with PEFT's .default, and no alpha: the strength is in lora_B, applied at scale 1.
    Returns (the module -> (A, B, scale 1) truth, the file)."""
    base = weights(pipeline / "transformer")
    modules = [f"blocks.{i}.{layer}" for i in range(2) for layer in BLOCK_LAYERS]
    made = random_modules({name: t.shape for name, t in base.items()}, modules, 7, ((4, 4.0), (8, 8.0)))
    tensors = {}
    for module, (a, b, _, _) in made.items():
        tensors[f"{original_names(module)}.lora_A.default.weight"] = a
        tensors[f"{original_names(module)}.lora_B.default.weight"] = b
    path = tmp_path_factory.mktemp("diffsynth") / "epoch-4.safetensors"
    save_file(tensors, path)
    return {module: (a, b, 1.0) for module, (a, b, _, _) in made.items()}, path


def test_diffsynth_lora_to_comfyui_layout(pipeline, diffsynth_lora, tmp_path):
    """nv-tlabs/ChronoEdit #22: ComfyUI wants diffusion_model. and no .default; Diffusers' Wan loader (the ChronoEdit
    pipeline's) reads the file we write and fuses it exactly."""
    from diffusers import ChronoEditPipeline, ChronoEditTransformer3DModel

    truth, path = diffsynth_lora
    export(path, tmp_path / "comfy", base=pipeline, lora_format="comfyui")
    written = load_file(tmp_path / "comfy" / "lora.safetensors")
    assert all(name.startswith("diffusion_model.blocks.") and ".default" not in name for name in written)
    assert "diffusion_model.blocks.0.self_attn.q.lora_down.weight" in written  # ComfyUI's own names for A and B
    base = weights(pipeline / "transformer")
    config = ChronoEditTransformer3DModel.load_config(pipeline / "transformer")
    fused = diffusers_fused(ChronoEditPipeline, ChronoEditTransformer3DModel, config, base,
                            tmp_path / "comfy" / "lora.safetensors")
    assert_all_equal(fused, merged(base, truth))


def test_diffsynth_lora_fused_into_chronoedit(pipeline, diffsynth_lora, tmp_path):
    """--lora fuse onto the ChronoEdit --base: W + B A exactly (fp32), into ChronoEdit's class with its RoPE
    setting."""
    truth, path = diffsynth_lora
    result = export(path, tmp_path / "fused", base=pipeline / "transformer", lora="fuse", dtype="fp32")
    assert result.family == "ChronoEdit"
    assert json.loads((tmp_path / "fused" / "config.json").read_text())["rope_temporal_skip_len"] == TINY_ROPE_SKIP
    assert_all_equal(weights(tmp_path / "fused"), merged(weights(pipeline / "transformer"), truth))


def test_a_wan_lora_named_a_chronoedit_adapter_by_model_name(tmp_path):
    """--model-name ChronoEdit-14B puts a DiffSynth (Wan-named) adapter on ChronoEdit's model: checked against the
    published ChronoEdit-14B's shapes and named as its adapter (rank 1 on one full-size layer: a few kB)."""
    generator = torch.Generator().manual_seed(3)
    path = tmp_path / "epoch-0.safetensors"
    save_file({"blocks.0.self_attn.q.lora_A.default.weight": torch.randn(1, 5120, generator=generator),
               "blocks.0.self_attn.q.lora_B.default.weight": torch.randn(5120, 1, generator=generator)}, path)
    export(path, tmp_path / "out", model_name="ChronoEdit-14B", lora_format="comfyui")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "base_model: nvidia/ChronoEdit-14B-Diffusers" in card
    assert set(load_file(tmp_path / "out" / "lora.safetensors")) == {
        "diffusion_model.blocks.0.self_attn.q.lora_down.weight", "diffusion_model.blocks.0.self_attn.q.lora_up.weight"}


# -- quantized files ------------------------------------------------------------------------------------------------
def test_gguf_and_fp8_files_carry_the_original_names(pipeline, tmp_path):
    """Wan's quantization facts hold (key_maps/chronoedit/quantized.toml): the GGUF file (architecture wan, as
    ComfyUI-GGUF loads ChronoEdit) holds the original file's tensors, F16 exactly their fp16 cast where not kept in F32;
    the fp8 file quantizes Wan's layers, the image branch's among them."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    from cogexport.exporter import export_comfyui, export_gguf

    export_original(pipeline, tmp_path / "original", dtype="fp32")
    original = load_file(tmp_path / "original" / "diffusion_pytorch_model.safetensors")
    export_gguf(pipeline, tmp_path / "gguf", quant="F16")
    reader = gguf.GGUFReader(next((tmp_path / "gguf").glob("*.gguf")))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "wan"
    read = {t.name: torch.from_numpy(np.array(t.data)).reshape(tuple(reversed(t.shape.tolist())))
            for t in reader.tensors}
    assert set(read) == set(original)
    for name, tensor in read.items():
        assert torch.equal(tensor, original[name].to(tensor.dtype)), name
    assert read["blocks.0.ffn.0.weight"].dtype == torch.float16  # 1,536 values: more than convert.py keeps in F32
    assert read["blocks.0.modulation"].dtype == torch.float32  # convert.py's keys_hiprec
    export_comfyui(pipeline, tmp_path / "fp8", quant="fp8")
    with safe_open(next((tmp_path / "fp8").glob("*.safetensors")), "pt") as file:
        assert file.get_tensor("blocks.0.cross_attn.k_img.weight").dtype == torch.float8_e4m3fn
        assert file.get_tensor("blocks.0.norm3.weight").dtype != torch.float8_e4m3fn
