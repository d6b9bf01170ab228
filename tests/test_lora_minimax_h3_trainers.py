"""MiniMax-H3 LoRA files as the trainers that adapt its original module tree save them, read from what their code
writes: ai-toolkit (its convert_lora_weights_before_save: diffusion_model. + the original names, lora_A / lora_B),
diffusion-pipe (ComfyPipeline.save_adapter: the same names in adapter_model.safetensors, PEFT's adapter_config.json
beside it, alpha = r), musubi-tuner (networks.lora_minimax_h3: lora_unet_blocks_0_attn_qkv_proj, lora_down / lora_up,
.alpha) and SimpleTuner (Diffusers' save_lora_weights on Diffusers names). Every one of them trains on the
Comfy-Org single file's qkv_proj, stacked [q; k; v].

Judged by Diffusers' own MiniMax-H3 LoRA converter (which reads every one of these layouts), by W + (alpha / r) B A
in PEFT's merge order (fp32, torch.equal), and by Diffusers loading the written adapter with the fused model's
output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora_helpers import (assert_all_equal, diffusers_fused, merged, peft_patterns, random_modules, write_comfyui_lora,
                          write_diffusers_lora, write_musubi_lora)
from minimax_h3_fixtures import diffusers_forward, packed_inputs
from safetensors.torch import load_file, save_file
from test_lora_minimax_h3 import CONFIG

INNER, HIDDEN, FFN = 2 * 128, CONFIG["hidden_size"], CONFIG["ffn_dim"]
# the original modules the trainers adapt, their weights' shapes, and the Diffusers modules each becomes: (module,
# which chunks of lora_B's rows it takes, out of how many)
ORIGINAL = {"attn.qkv_proj": ((3 * INNER, HIDDEN), (("attn.to_q", [0]), ("attn.to_k", [1]), ("attn.to_v", [2])), 3),
            "attn.out_proj": ((HIDDEN, INNER), (("attn.to_out.0", [0]),), 1),
            "mlp.fc1": ((2 * FFN, HIDDEN), (("ff.net.0.proj", [1, 0]),), 2),  # [gate; value] -> [value; gate]
            "mlp.fc2": ((HIDDEN, FFN), (("ff.net.2", [0]),), 1)}
STACKS = {"blocks": ("transformer_blocks", 2), "token_refiner.blocks": ("token_refiner.refiner_blocks", 1)}


def layers(stacks=tuple(STACKS)) -> dict[str, tuple]:
    """original module -> (shape, Diffusers parts, chunks) for the blocks of ``stacks``."""
    found = {}
    for stack in stacks:
        target, count = STACKS[stack]
        for i in range(count):
            for module, (shape, parts, chunks) in ORIGINAL.items():
                found[f"{stack}.{i}.{module}"] = (shape, tuple((f"{target}.{i}.{m}", c) for m, c in parts), chunks)
    return found


def make_adapter(stacks, strengths, seed: int) -> dict:
    modules = layers(stacks)
    return random_modules({f"{m}.weight": shape for m, (shape, _, _) in modules.items()}, sorted(modules), seed,
                          strengths)


def on_diffusers_modules(adapter: dict) -> dict:
    """The adapter on Diffusers' modules, module -> (A, B, scale): each takes its chunks of lora_B's rows."""
    split, modules = {}, layers()
    for layer, (down, up, rank, alpha) in adapter.items():
        _, parts, chunks = modules[layer]
        pieces = torch.chunk(up, chunks, dim=0)
        for module, take in parts:
            split[module] = (down, torch.cat([pieces[i] for i in take]), alpha / rank)
    return split


# -- the trainers' files -------------------------------------------------------------------------------------------
def write_ai_toolkit(folder: Path, adapter: dict) -> Path:
    """diffusion_model. + the original names, lora_A / lora_B (its LoRA network saves no alpha here: alpha = r)."""
    return write_comfyui_lora(folder / "my_lora.safetensors", adapter, parts=("A", "B"))


def write_diffusion_pipe(folder: Path, adapter: dict) -> Path:
    """PEFT's adapter state dict prefixed diffusion_model., adapter_config.json beside (lora_alpha = r)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"diffusion_model.{m}.lora_{part}.weight": t for m, (a, b, _, _) in adapter.items()
               for part, t in (("A", a), ("B", b))}
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **peft_patterns(adapter)}))
    return folder / "adapter_model.safetensors"


def write_musubi(folder: Path, adapter: dict) -> Path:
    return write_musubi_lora(folder / "h3_lora.safetensors", adapter, "networks.lora_minimax_h3")


def write_simpletuner(folder: Path, adapter: dict) -> Path:
    """Diffusers' save_lora_weights of the adapter on Diffusers names (transformer.transformer_blocks.0.attn.to_q
    .lora_A.weight), its ranks and alphas in lora_adapter_metadata."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    rank = {layer: (r, alpha) for layer, (_, _, r, alpha) in adapter.items()}
    modules = {module: (down, up, *rank[layer]) for layer in adapter
               for module, (down, up, _) in on_diffusers_modules({layer: adapter[layer]}).items()}
    return write_diffusers_lora(MiniMaxH3LoraLoaderMixin, folder, modules)


# (writer, the blocks the trainer adapts by default, the strengths its file can hold)
TRAINERS = {
    "ai-toolkit": (write_ai_toolkit, ("blocks", "token_refiner.blocks"), ((4, 4.0),)),
    "diffusion-pipe": (write_diffusion_pipe, ("blocks", "token_refiner.blocks"), ((4, 4.0),)),
    "musubi-tuner": (write_musubi, ("blocks",), ((4, 8.0), (4, 2.0), (2, 1.0))),
    "simpletuner": (write_simpletuner, ("blocks", "token_refiner.blocks"), ((4, 8.0), (2, 2.0))),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from diffusers import MiniMaxH3Transformer3DModel

    folder = tmp_path_factory.mktemp("minimax_h3_trainers") / "base"
    torch.manual_seed(0)
    MiniMaxH3Transformer3DModel.from_config(CONFIG).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_trainers_lora_fuses_exactly_and_its_diffusers_adapter_loads_with_the_same_output(trainer, base, cli,
                                                                                           tmp_path):
    from diffusers import MiniMaxH3Transformer3DModel

    write, stacks, strengths = TRAINERS[trainer]
    adapter = make_adapter(stacks, strengths, seed=len(trainer))
    lora = write(tmp_path / trainer, adapter)
    result = cli(lora, tmp_path / "fused", "--base", base, "--lora", "fuse", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    weights = load_file(base / "diffusion_pytorch_model.safetensors")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"),
                     merged(weights, on_diffusers_modules(adapter)))
    result = cli(lora, tmp_path / "adapter", "--base", base)
    assert result.exit_code == 0, result.stderr
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    if trainer != "simpletuner":  # Diffusers' own MiniMax-H3 loader, given the trainer's file, fuses the same model
        theirs = diffusers_fused(MiniMaxH3LoraLoaderMixin, MiniMaxH3Transformer3DModel, CONFIG, weights, lora)
        ours = load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors")
        assert all(torch.allclose(ours[name], theirs[name], atol=1e-6, rtol=0) for name in ours)
    # the written adapter as Diffusers loads it (its lora_adapter_metadata carries each module's rank and alpha)
    state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(tmp_path / "adapter", return_lora_metadata=True)
    model = MiniMaxH3Transformer3DModel.from_pretrained(base).eval()
    model.load_lora_adapter(state, prefix="transformer", metadata=metadata)
    given = packed_inputs(seed=4)
    fused = MiniMaxH3Transformer3DModel.from_pretrained(tmp_path / "fused").eval()
    assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-4)
               for a, b in zip(diffusers_forward(fused, given), diffusers_forward(model, given)))



def test_a_musubi_lora_written_back_is_the_trainers_file(base, cli, tmp_path):
    """--lora-format musubi of a musubi-tuner file: its tensors again, name for name (qkv stacked as it was)."""
    lora = write_musubi(tmp_path / "musubi", make_adapter(("blocks",), ((4, 8.0), (2, 1.0)), seed=5))
    result = cli(lora, tmp_path / "again", "--base", base, "--lora-format", "musubi")
    assert result.exit_code == 0, result.stderr
    assert_all_equal(load_file(next((tmp_path / "again").glob("*.safetensors"))), load_file(lora))


@pytest.mark.parametrize("gate_first", [True, "true", False])
def test_a_simpletuner_lora_recording_gate_first_swiglu_is_refused_not_fused_in_the_wrong_order(gate_first, base, cli,
                                                                                              tmp_path):
    """SimpleTuner records swiglu_gate_first in lora_adapter_metadata (true for its ComfyUI-format LoRAs): its
    ff.net.0.proj rows are then [gate; value], not Diffusers' order, which no layout reads; read as Diffusers' they
    would fuse into a silently wrong model. Recorded as false, the file is Diffusers' own layout."""
    from safetensors import safe_open

    from conftest import assert_refused

    write, stacks, strengths = TRAINERS["simpletuner"]
    lora = write(tmp_path / "simpletuner", make_adapter(stacks, strengths, seed=1))
    with safe_open(lora, "pt") as handle:
        metadata, tensors = handle.metadata(), {key: handle.get_tensor(key) for key in handle.keys()}
    recorded = json.loads(metadata["lora_adapter_metadata"])
    recorded["transformer.swiglu_gate_first"] = gate_first
    save_file(tensors, lora, metadata={**metadata, "lora_adapter_metadata": json.dumps(recorded)})
    if gate_first is False:
        assert cli(lora, tmp_path / "out", "--base", base, "--lora", "fuse").exit_code == 0
        return
    assert_refused(cli, tmp_path, [lora, tmp_path / "out", "--base", base, "--lora", "fuse"],
                   "records swiglu_gate_first", "gate first", inputs=[lora])
