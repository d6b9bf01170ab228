"""An adapter of one expert of a two-expert model (Wan 2.2 A14B: transformer = high noise, transformer_2 = low noise)
goes into the expert it was trained for, by what its trainer records, and never silently into the other.

Each trainer's layout, written here as its saving code writes it (facts: cogexport/lora/experts.py):
- ai-toolkit: NAME_high_noise.safetensors and NAME_low_noise.safetensors side by side (ComfyUI names);
- musubi-tuner: one run per expert, the --dit file recorded in ss_sd_model_name; --dit_high_noise trains one
  adapter across both experts (ss_dit_high_noise_name);
- a run laid out like the release: high_noise_model/ and low_noise_model/;
- a file whose name, folder and metadata say nothing (DiffSynth-Studio's epoch-N.safetensors): --lora-expert.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_refused
from lora_helpers import assert_all_equal, write_comfyui_lora, write_musubi_lora
from safetensors.torch import load_file
from test_lora_wan import BLOCK_LAYERS, make_adapter, original
from wan_fixtures import tiny_wan_pipeline

from cogexport.exporter import export

WEIGHTS = "diffusion_pytorch_model.safetensors"
MODULES = [f"blocks.{i}.{layer}" for i in range(2) for layer in BLOCK_LAYERS]


@pytest.fixture(scope="module")
def a14b():
    """The tiny A14B pipeline, each expert's weights, and an adapter made for each."""
    base = tiny_wan_pipeline("t2v-a14b")
    weights = {c: load_file(base / c / WEIGHTS) for c in ("transformer", "transformer_2")}
    adapters = {"transformer": make_adapter(weights["transformer"], MODULES, seed=31),
                "transformer_2": make_adapter(weights["transformer_2"], MODULES, seed=32)}
    return base, weights, adapters


def comfy(path, adapter):
    return write_comfyui_lora(path, {original(m): lora for m, lora in adapter.modules.items()}, parts=("A", "B"))


def musubi(path, adapter, **metadata):
    path = write_musubi_lora(path, {original(m): lora for m, lora in adapter.modules.items()}, "networks.lora_wan")
    if metadata:  # musubi-tuner records the model it trained in the header
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(path, "pt") as handle:
            tensors, header = {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()
        save_file(tensors, path, metadata={**header, **metadata})
    return path


def fused(folder, component=""):
    return load_file(folder / component / WEIGHTS if component else folder / WEIGHTS)


def test_ai_toolkit_side_by_side_pair_is_read_as_the_two_experts(a14b, tmp_path):
    base, weights, adapters = a14b
    run = tmp_path / "run"
    comfy(run / "my_lora_high_noise.safetensors", adapters["transformer"])
    comfy(run / "my_lora_low_noise.safetensors", adapters["transformer_2"])
    result = export(run, tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    assert set(result.lora["experts"]) == {"high_noise_model", "low_noise_model"}
    for component, adapter in adapters.items():
        assert_all_equal(fused(tmp_path / "fused", component), adapter.truth(weights[component]))
    result = export(run, tmp_path / "adapters", base=base)
    assert result.files[:2] == ["high_noise_model/pytorch_lora_weights.safetensors",
                                "low_noise_model/pytorch_lora_weights.safetensors"]


@pytest.mark.parametrize("name, component", [("my_lora_low_noise.safetensors", "transformer_2"),
                                             ("my_lora_high_noise.safetensors", "transformer"),
                                             ("Wan22-LowNoise-style.safetensors", "transformer_2")])
def test_one_file_of_a_pair_goes_into_its_own_expert(a14b, tmp_path, name, component):
    """The reported case: the low-noise file with --component transformer was fused into the high-noise expert."""
    base, weights, adapters = a14b
    path = comfy(tmp_path / "lora" / name, adapters[component])
    export(path, tmp_path / "fused", base=base, lora="fuse", dtype="fp32", component="transformer")
    assert_all_equal(fused(tmp_path / "fused"), adapters[component].truth(weights[component]))


def test_musubi_records_the_expert_it_trained(a14b, tmp_path):
    base, weights, adapters = a14b
    path = musubi(tmp_path / "lora" / "run.safetensors", adapters["transformer_2"],
                  ss_sd_model_name="wan2.2_t2v_low_noise_14B_fp16.safetensors")
    export(path, tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    assert_all_equal(fused(tmp_path / "fused"), adapters["transformer_2"].truth(weights["transformer_2"]))


def test_musubi_trained_across_both_experts_goes_into_both(a14b, tmp_path):
    base, weights, adapters = a14b
    path = musubi(tmp_path / "lora" / "run.safetensors", adapters["transformer"],
                  ss_sd_model_name="wan2.2_t2v_low_noise_14B_fp16.safetensors",
                  ss_dit_high_noise_name="wan2.2_t2v_high_noise_14B_fp16.safetensors")
    export(path, tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    for component in ("transformer", "transformer_2"):
        assert_all_equal(fused(tmp_path / "fused", component), adapters["transformer"].truth(weights[component]))


def test_nothing_tells_so_the_user_says(a14b, tmp_path, cli):
    base, weights, adapters = a14b
    path = comfy(tmp_path / "run" / "epoch-3.safetensors", adapters["transformer_2"])
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", base, "--lora", "fuse"],
                   "is one adapter", "2 experts", "--lora-expert high_noise_model or low_noise_model",
                   inputs=[path.parent, base])
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", base], "--lora-expert", inputs=[path.parent, base])
    for given in ("low_noise_model", "low_noise", "transformer_2"):
        export(path, tmp_path / given, base=base, lora="fuse", dtype="fp32", lora_expert=given)
        assert_all_equal(fused(tmp_path / given), adapters["transformer_2"].truth(weights["transformer_2"]))
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", base, "--lora", "fuse", "--lora-expert", "middle"],
                   "--lora-expert 'middle' names no expert", inputs=[path.parent, base])


def test_evidence_that_disagrees_is_refused(a14b, tmp_path, cli):
    base, _, adapters = a14b
    path = musubi(tmp_path / "high_noise_model" / "run_high_noise.safetensors", adapters["transformer"],
                  ss_sd_model_name="wan2.2_t2v_low_noise_14B_fp16.safetensors")
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", base, "--lora", "fuse"], "--lora-expert",
                   inputs=[path.parent, base])


def test_several_pairs_in_one_folder_are_refused_each_named(a14b, tmp_path, cli):
    base, _, adapters = a14b
    run = tmp_path / "run"
    for step in ("000500", "001000"):
        comfy(run / f"my_lora_{step}_high_noise.safetensors", adapters["transformer"])
        comfy(run / f"my_lora_{step}_low_noise.safetensors", adapters["transformer_2"])
    message = assert_refused(cli, tmp_path, [run, tmp_path / "out", "--base", base, "--lora", "fuse"],
                             "holds 2 sets of expert adapters", inputs=[run, base])
    assert "my_lora_000500_high_noise.safetensors" in message and "my_lora_001000_low_noise.safetensors" in message


def test_an_adapter_for_one_expert_written_as_an_adapter_says_which_expert(a14b, tmp_path):
    base, _, adapters = a14b
    path = comfy(tmp_path / "lora" / "my_lora_low_noise.safetensors", adapters["transformer_2"])
    export(path, tmp_path / "adapter", base=base)
    card = (tmp_path / "adapter" / "README.md").read_text()
    assert "load_into_transformer_2=True" in card
    assert torch.equal(load_file(tmp_path / "adapter" / "pytorch_lora_weights.safetensors")[
        "transformer.blocks.0.attn1.to_q.lora_A.weight"], adapters["transformer_2"].modules["blocks.0.attn1.to_q"][0])
