"""A LoRA format carries what it knows (where its loaders read the strength, how people load it, its file, header
and side files), so a new writable format is one entry and one table per family, nothing else: a toy format
registered here is read and written through the same code as the shipped ones, and what a writable format or its
table lacks is refused when it loads, in one line, never with a KeyError after tensors were written."""

from __future__ import annotations

import json

import pytest
import torch
from lora_helpers import assert_all_equal, merged
from safetensors.torch import load_file, save_file
from wan_fixtures import REAL_WAN

from cogexport.errors import CogExportError
from cogexport.keymap.table import TableError
from cogexport.lazy import LazyTensor
from cogexport.lora import plan_fused, plan_output, read_adapter, writable_format, writable_formats
from cogexport.lora.formats import FormatError, LoraFormat, register_format, unregister_format
from cogexport.lora.parts import ALPHA, DOWN, UP
from cogexport.precision import PrecisionPolicy

TOY = LoraFormat("toy", "Toy loader", {".toy_down": DOWN, ".toy_up": UP, ".toy_alpha": ALPHA}, prefix="toy_model.",
                 write_prefix="toy_model.", file="toy.safetensors",
                 write_parts={DOWN: ".toy_down", UP: ".toy_up", ALPHA: ".toy_alpha"},
                 strength_where="each module's alpha is in its .toy_alpha tensor", loaders=("comfyui",))
TOY_WAN = """
[table]
name = "wan/toy_lora"
description = "Toy Wan LoRA"
source = "the toy loader's LoRA (toy_model. + Diffusers names)"

[lora]
format = "toy"
modules = "wan/diffusers_transformer"
writes = true
default_alpha = "rank"
default_alpha_reason = "no .toy_alpha: scale 1"
alpha_recorded = true
"""


@pytest.fixture
def toy():
    register_format(TOY, {"wan": TOY_WAN})
    yield TOY
    unregister_format("toy")


def lazy(tensors: dict[str, torch.Tensor]) -> dict[str, LazyTensor]:
    return {name: LazyTensor(t.shape, t.dtype, (lambda t=t: t)) for name, t in tensors.items()}


@pytest.mark.skipif(not REAL_WAN.is_dir(), reason=f"the real Wan fixtures are not at {REAL_WAN}")
def test_a_registered_format_is_read_and_written_like_the_shipped_ones(toy, tmp_path):
    from test_lora_wan import BASE_FOLDER, BASE_TRUTH, every_block_layer, make_adapter, write_musubi

    weights = load_file(BASE_TRUTH)
    adapter = make_adapter(weights, every_block_layer(), seed=41)
    musubi = load_file(write_musubi(tmp_path / "in" / "lora.safetensors", adapter))
    read = read_adapter(lazy(musubi), "musubi file")
    assert writable_formats()[-1] == "toy" and writable_format("toy") is toy
    planned = plan_output(read, "toy", read.names, PrecisionPolicy(torch.float32), "musubi file")
    assert planned.file == "toy.safetensors" and planned.metadata == {"format": "pt"} and not planned.side_files
    written = {name: t.load() for name, t in planned.tensors.items()}
    assert written["toy_model.blocks.0.attn1.to_k.toy_alpha"].item() == adapter.modules["blocks.0.attn1.to_k"][3]
    save_file(written, tmp_path / "toy.safetensors")
    again = read_adapter(lazy(load_file(tmp_path / "toy.safetensors")), "toy file")
    assert again.table.name == "wan/toy_lora" and again.ranks == read.ranks
    fused = plan_fused(again, lazy(weights), "toy file")
    assert_all_equal({name: t.load() for name, t in fused.items()},
                     merged(weights, {m: (a, b, alpha / r) for m, (a, b, r, alpha) in adapter.modules.items()}))
    usage = toy.usage_lines("WanPipeline", None, {"transformer": "out/toy.safetensors"})
    assert usage[-1] == "# or in ComfyUI (LoraLoaderModelOnly): out/toy.safetensors at strength 1.0"


def test_what_a_format_or_its_table_lacks_is_refused_when_it_loads():
    with pytest.raises(FormatError, match="^LoRA format 'half': a writable format says where its loaders read"):
        LoraFormat("half", "Half", {".d": DOWN, ".u": UP}, file="half.safetensors", write_parts={DOWN: ".d", UP: ".u"})
    with pytest.raises(FormatError, match="its strength needs a place"):
        LoraFormat("no-alpha", "No alpha", {".d": DOWN, ".u": UP}, file="x.safetensors",
                   write_parts={DOWN: ".d", UP: ".u"}, strength_where="nowhere", loaders=("comfyui",))
    kohya = LoraFormat("kohya-like", "Kohya-like", {".d": DOWN, ".u": UP, ".a": ALPHA}, prefix="k_", encoded=True,
                       file="k.safetensors", write_parts={DOWN: ".d", UP: ".u", ALPHA: ".a"},
                       strength_where="in .a", kohya_metadata=True, loaders=("comfyui",))
    table = TOY_WAN.replace('"toy"', '"kohya-like"').replace("wan/toy_lora", "wan/kohya_like")
    with pytest.raises(TableError, match="^key map wan/kohya_like: --lora-format kohya-like writes ss_network_module"):
        register_format(kohya, {"wan": table})
    assert "kohya-like" not in writable_formats()  # nothing half-registered
    with pytest.raises(CogExportError, match="^--lora-format 'kohya-like' is not one of diffusers, peft, comfyui, "
                                             "musubi, lycoris$"):
        writable_format("kohya-like")


def test_each_format_says_where_its_strength_lives_and_how_it_is_loaded():
    assert writable_formats() == ("diffusers", "peft", "comfyui", "musubi", "lycoris")
    for name in writable_formats():
        fmt = writable_format(name)
        assert fmt.name == name and fmt.title and fmt.strength_where
    files = {"transformer": "out/high_noise_model/adapter_model.safetensors",
             "transformer_2": "out/low_noise_model/adapter_model.safetensors"}
    peft = writable_format("peft").usage_lines("WanPipeline", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", files)
    assert peft[:3] == ["import torch", "from diffusers import WanPipeline", "from peft import PeftModel"]
    assert 'pipe = WanPipeline.from_pretrained("Wan-AI/Wan2.2-T2V-A14B-Diffusers", dtype=torch.bfloat16)' in peft
    assert peft[-1] == ('pipe.transformer_2 = PeftModel.from_pretrained(pipe.transformer_2, "out/low_noise_model")'
                        ".merge_and_unload()")
    diffusers = writable_format("diffusers").usage_lines("WanPipeline", None, {
        "transformer": "out/high_noise_model/pytorch_lora_weights.safetensors",
        "transformer_2": "out/low_noise_model/pytorch_lora_weights.safetensors"})
    assert diffusers[-2:] == ['pipe.load_lora_weights("out/high_noise_model/pytorch_lora_weights.safetensors")',
                              'pipe.load_lora_weights("out/low_noise_model/pytorch_lora_weights.safetensors", '
                              'load_into_transformer_2=True)']
    musubi = writable_format("musubi").usage_lines("WanPipeline", None, {"transformer": "out/lora.safetensors"})
    assert musubi[-1] == ("# or in ComfyUI (LoraLoaderModelOnly), musubi-tuner (--lora_weight): out/lora.safetensors "
                          "at strength 1.0")
    lycoris = writable_format("lycoris").usage_lines("WanPipeline", None, {"transformer": "out/lycoris.safetensors"})
    assert "from lycoris import create_lycoris_from_weights" in lycoris and lycoris[-1] == "network.apply_to()"
    assert json.dumps(lycoris)  # plain strings, for the card


def test_a_registered_format_carries_its_layout_and_a_family_gives_only_its_modules():
    """A format's ``layout`` holds what its tables share (the table's name, description and source with {family}
    for the family's name, whether it writes, the default alpha); a family's layout names the key map of its modules
    and only what differs, as family.toml's [[lora.layout]] entries do."""
    from cogexport.keymap.table_fields import LoraLayout
    from cogexport.lora.tables import lora_tables, output_table
    from cogexport.models.family import family_named

    layout = LoraLayout(name="toy_lora", description="Toy {family} LoRA", source="the toy loader's LoRA",
                        writes=True, default_alpha="rank", default_alpha_reason="no .toy_alpha: scale 1",
                        alpha_recorded=True)
    toy = LoraFormat(**{**TOY.__dict__, "layout": layout})
    register_format(toy, {"wan": LoraLayout(modules="diffusers_transformer")})
    try:
        table = output_table(family_named("wan"), "toy")
        assert (table.name, table.description, table.source, table.modules.name) == (
            "wan/toy_lora", "Toy Wan LoRA", "the toy loader's LoRA", "wan/diffusers_transformer")
        assert (table.default_alpha, table.alpha_recorded, table.writes) == ("rank", True, True)
        assert table in lora_tables()
    finally:
        unregister_format("toy")


def test_two_layouts_of_a_family_that_write_one_format_are_refused():
    from cogexport.keymap.table_fields import LoraLayout
    from cogexport.lora.tables import lora_tables, register_tables

    before = lora_tables()
    second = LoraLayout(format="comfyui", name="second_comfyui_lora", modules="diffusers_transformer")
    with pytest.raises(TableError, match="^key map wan/second_comfyui_lora: wan/comfyui_lora writes comfyui files "
                                         "for its family already; give the other layouts writes = false$"):
        register_tables({"wan": second})
    assert lora_tables() == before


@pytest.mark.parametrize("reads, refused", [
    ({"swiglu_gate_first": ("yes",)}, "reads_settings swiglu_gate_first must be a list of unset, true, false"),
    ({"gate_order": ("true",)}, "reads_settings names gate_order, which is not one of MiniMax-H3's [lora] "
                                "recorded_settings (swiglu_gate_first)")])
def test_a_layout_reads_only_values_of_the_settings_its_family_records(reads, refused):
    """reads_settings says which recorded values of the family's [lora] recorded_settings a layout is the reading of
    ("unset", "true", "false"): another setting or value is refused when the tables load, and nothing registered."""
    import re

    from cogexport.keymap.table_fields import LoraLayout
    from cogexport.lora.tables import lora_tables, register_tables

    before = lora_tables()
    layout = LoraLayout(format="diffusers", name="settings_lora", modules="diffusers_transformer", writes=False,
                        reads_settings=reads)
    with pytest.raises(TableError, match=f"^key map minimax_h3/settings_lora: {re.escape(refused)}$"):
        register_tables({"minimax_h3": layout})
    assert lora_tables() == before
