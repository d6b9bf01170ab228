"""MiniMax-H3 LoRA files as the trainers that adapt its original module tree save them, read from what their code
writes: ai-toolkit (its convert_lora_weights_before_save: diffusion_model. + the original names, lora_A / lora_B),
diffusion-pipe (ComfyPipeline.save_adapter: the same names in adapter_model.safetensors, PEFT's adapter_config.json
beside it, alpha = r), musubi-tuner (networks.lora_minimax_h3: lora_unet_blocks_0_attn_qkv_proj, lora_down / lora_up,
.alpha) and SimpleTuner (simpletuner/helpers/models/minimaxh3/, at bghira/SimpleTuner bc8e6ab7: Diffusers'
save_lora_weights on Diffusers names, recording swiglu_gate_first in lora_adapter_metadata: false on the Diffusers
transformer, true on its gate-first transformer, whose ff.net.0.proj rows are [gate; value]; or its ComfyUI format,
_convert_minimax_h3_diffusers_lora_to_comfyui: the release's names, q, k, v fused, fc1 [gate; value], .alpha, the
setting recorded true without the component prefix). Every one of them trains on the Comfy-Org single file's
qkv_proj, stacked [q; k; v].

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


def halves_swapped(weights: dict, adapter: dict) -> dict:
    """The feed-forward inputs W + scale B A fused with fc1's lora_B halves in the other order than the truth."""
    wrong = {module: (down, torch.cat(up.chunk(2)[::-1]), scale)
             for module, (down, up, scale) in on_diffusers_modules(adapter).items() if module.endswith("ff.net.0.proj")}
    fused = merged(weights, wrong)
    return {f"{module}.weight": fused[f"{module}.weight"] for module in wrong}


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


def write_simpletuner(folder: Path, adapter: dict, gate_first: bool = False) -> Path:
    """SimpleTuner's Diffusers-format save (its save_lora_weights: Diffusers' pack_weights and write_lora_layers) of
    the adapter on Diffusers names (transformer.transformer_blocks.0.attn.to_q.lora_A.weight), its ranks and alphas
    and transformer.swiglu_gate_first in lora_adapter_metadata. On its gate-first transformer ff.net.0.proj's rows are
    the release's fc1 order, [gate; value], kept as they are; on the Diffusers transformer [value; gate]."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    modules = simpletuner_modules(adapter, gate_first)
    layers = {f"{m}.lora_{part}.weight": t.clone() for m, (a, b, _, _) in modules.items()
              for part, t in (("A", a), ("B", b))}
    MiniMaxH3LoraLoaderMixin.save_lora_weights(
        folder, transformer_lora_layers=layers,
        transformer_lora_adapter_metadata={**peft_patterns(modules), "swiglu_gate_first": gate_first})
    return folder / "pytorch_lora_weights.safetensors"


def simpletuner_modules(adapter: dict, gate_first: bool) -> dict:
    """The adapter on the Diffusers modules SimpleTuner's transformer has, module -> (A, B, rank, alpha): fc1's lora_B
    [gate; value] becomes ff.net.0.proj's [value; gate], or stays as it is on its gate-first transformer."""
    modules = {}
    for layer, (_, up, rank, alpha) in adapter.items():
        for module, (down, split_up, _) in on_diffusers_modules({layer: adapter[layer]}).items():
            modules[module] = (down, up if gate_first and module.endswith("ff.net.0.proj") else split_up, rank, alpha)
    return modules


def write_simpletuner_gate_first(folder: Path, adapter: dict) -> Path:
    return write_simpletuner(folder, adapter, gate_first=True)


def simpletuner_comfyui_tensors(modules: dict) -> dict:
    """What SimpleTuner's _convert_minimax_h3_diffusers_lora_to_comfyui makes of Diffusers-named modules (module ->
    (A, B, rank, alpha)) of the Diffusers transformer, by its string rules: diffusion_model. + the release's names,
    lora_A / lora_B and an fp32 .alpha per module; ff.net.0.proj's rows swapped to fc1's [gate; value]; to_q, to_k,
    to_v fused in that order into qkv_proj: one lora_A and the lora_B stacked when the three share lora_A and scale,
    else lora_A stacked, lora_B block-diagonal with each scale folded in, and alpha the summed rank."""
    def native(module: str) -> str:
        for diffusers, release in (("transformer_blocks.", "blocks."), ("token_refiner.refiner_blocks.",
                                   "token_refiner.blocks."), (".attn.to_out.0", ".attn.out_proj"),
                                   (".ff.net.0.proj", ".mlp.fc1"), (".ff.net.2", ".mlp.fc2")):
            module = module.replace(diffusers, release, 1)
        return f"diffusion_model.{module}"

    tensors, fused = {}, {}
    for module, (down, up, rank, alpha) in modules.items():
        if module.endswith((".to_q", ".to_k", ".to_v")):
            fused.setdefault(module[: -len(".to_q")], {})[module[-1]] = (down, up, alpha / rank)
            continue
        if module.endswith(".ff.net.0.proj"):
            value, gate = up.chunk(2)
            up = torch.cat((gate, value))
        tensors.update({f"{native(module)}.lora_A.weight": down, f"{native(module)}.lora_B.weight": up,
                        f"{native(module)}.alpha": torch.tensor(float(alpha))})
    for attn, parts in fused.items():
        (qa, qb, qs), (ka, kb, ks), (va, vb, vs) = parts["q"], parts["k"], parts["v"]
        if torch.equal(qa, ka) and torch.equal(qa, va) and qs == ks == vs:
            down, up, alpha = qa, torch.cat((qb, kb, vb)), qs * qa.shape[0]
        else:
            down, up = torch.cat((qa, ka, va)), torch.zeros(3 * qb.shape[0], 3 * qa.shape[0])
            for j, (a, b, scale) in enumerate((parts["q"], parts["k"], parts["v"])):
                up[j * b.shape[0]:(j + 1) * b.shape[0], j * a.shape[0]:(j + 1) * a.shape[0]] = b * scale
            alpha = float(down.shape[0])
        name = native(f"{attn}.qkv_proj")
        tensors.update({f"{name}.lora_A.weight": down, f"{name}.lora_B.weight": up,
                        f"{name}.alpha": torch.tensor(float(alpha))})
    return tensors


def write_simpletuner_comfyui(folder: Path, adapter: dict, modules: dict | None = None) -> Path:
    """SimpleTuner's lora_format comfyui save (ModelFoundation.save_lora_weights' comfyui_save_function): its
    conversion of the Diffusers-named adapter, and lora_adapter_metadata holding the adapter config and
    swiglu_gate_first = true without the component prefix."""
    modules = modules if modules is not None else simpletuner_modules(adapter, gate_first=False)
    folder.mkdir(parents=True, exist_ok=True)
    recorded = json.dumps({**peft_patterns(modules), "swiglu_gate_first": True}, indent=2, sort_keys=True)
    save_file(simpletuner_comfyui_tensors(modules), folder / "pytorch_lora_weights.safetensors",
              metadata={"format": "pt", "lora_adapter_metadata": recorded})
    return folder / "pytorch_lora_weights.safetensors"


# (writer, the blocks the trainer adapts by default, the strengths its file can hold)
TRAINERS = {
    "ai-toolkit": (write_ai_toolkit, ("blocks", "token_refiner.blocks"), ((4, 4.0),)),
    "diffusion-pipe": (write_diffusion_pipe, ("blocks", "token_refiner.blocks"), ((4, 4.0),)),
    "musubi-tuner": (write_musubi, ("blocks",), ((4, 8.0), (4, 2.0), (2, 1.0))),
    "simpletuner": (write_simpletuner, ("blocks", "token_refiner.blocks"), ((4, 8.0), (2, 2.0))),
    "simpletuner-gate-first": (write_simpletuner_gate_first, ("blocks", "token_refiner.blocks"), ((4, 8.0), (2, 2.0))),
    "simpletuner-comfyui": (write_simpletuner_comfyui, ("blocks", "token_refiner.blocks"), ((4, 8.0), (2, 2.0))),
}
# the trainers' files that Diffusers' own MiniMax-H3 loader reads as the trainer meant them: it knows no
# swiglu_gate_first (a gate-first Diffusers-named file loads with its halves swapped) and takes SimpleTuner's ComfyUI
# file's unprefixed lora_adapter_metadata for its LoraConfig, which PEFT then refuses (KeyError 'model_type')
DIFFUSERS_READS = ("ai-toolkit", "diffusion-pipe", "musubi-tuner")


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
    ours = load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors")
    assert_all_equal(ours, merged(weights, on_diffusers_modules(adapter)))
    # the check tells the SwiGLU halves apart: fc1's lora_B in the other order is another model
    assert not any(torch.equal(ours[name], tensor) for name, tensor in halves_swapped(weights, adapter).items())
    result = cli(lora, tmp_path / "adapter", "--base", base)
    assert result.exit_code == 0, result.stderr
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    if trainer in DIFFUSERS_READS:  # Diffusers' own MiniMax-H3 loader, given the trainer's file, fuses the same model
        theirs = diffusers_fused(MiniMaxH3LoraLoaderMixin, MiniMaxH3Transformer3DModel, CONFIG, weights, lora)
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


def test_a_simpletuner_comfyui_lora_of_separate_q_k_v_adapters_fuses_to_its_own_b_a_and_writes_back_gate_first(
        base, cli, tmp_path):
    """SimpleTuner's ComfyUI file of a PEFT run on the Diffusers transformer (to_q, to_k and to_v each with their own
    lora_A): one qkv_proj adapter, lora_A stacked, lora_B block-diagonal with each scale folded in, alpha the summed
    rank; fc1's rows [gate; value]. Fused: W + scale B A of the file's own tensors (torch.equal), the per-projection
    truth to rounding. Written as ComfyUI's layout again: the same fc1 rows, gate first."""
    modules = simpletuner_modules(make_adapter(("blocks",), ((4, 8.0), (2, 2.0)), seed=7), gate_first=False)
    generator = torch.Generator().manual_seed(8)
    for module in [m for m in modules if m.endswith((".to_k", ".to_v"))]:  # each its own lora_A, rank and alpha
        down, up, rank, alpha = modules[module]
        modules[module] = (torch.randn(down.shape, generator=generator), up, rank, alpha + 1.0)
    lora = write_simpletuner_comfyui(tmp_path / "simpletuner", {}, modules)
    result = cli(lora, tmp_path / "fused", "--base", base, "--lora", "fuse", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    weights, file = load_file(base / "diffusion_pytorch_model.safetensors"), load_file(lora)
    ours = load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors")
    assert_all_equal(ours, merged(weights, file_on_diffusers_modules(file)))
    truth = merged(weights, {m: (a, b, alpha / rank) for m, (a, b, rank, alpha) in modules.items()})
    assert all(torch.allclose(ours[name], truth[name], atol=1e-6, rtol=0) for name in truth)
    result = cli(lora, tmp_path / "again", "--base", base, "--lora-format", "comfyui")
    assert result.exit_code == 0, result.stderr
    again = load_file(tmp_path / "again" / "lora.safetensors")
    for i in range(2):
        fc1 = f"diffusion_model.blocks.{i}.mlp.fc1"
        assert torch.equal(again[f"{fc1}.lora_up.weight"], file[f"{fc1}.lora_B.weight"])


def file_on_diffusers_modules(file: dict) -> dict:
    """A SimpleTuner ComfyUI file's adapters on Diffusers' modules, module -> (A, B, alpha / r), by plain string
    rules: qkv_proj's lora_B rows in thirds (q, k, v) sharing its lora_A, fc1's halves to [value; gate]."""
    split = {}
    for key in [k for k in file if k.endswith(".lora_A.weight")]:
        name = key[len("diffusion_model."): -len(".lora_A.weight")]
        down, up = file[key], file[key.replace("lora_A", "lora_B")]
        scale = file[key.replace("lora_A.weight", "alpha")].item() / down.shape[0]
        target = name.replace("token_refiner.blocks.", "token_refiner.refiner_blocks.") if "token_refiner" in name \
            else name.replace("blocks.", "transformer_blocks.", 1)
        if name.endswith("attn.qkv_proj"):
            for projection, rows in zip(("to_q", "to_k", "to_v"), up.chunk(3)):
                split[target.replace("qkv_proj", projection)] = (down, rows, scale)
        elif name.endswith("mlp.fc1"):
            gate, value = up.chunk(2)
            split[target.replace("mlp.fc1", "ff.net.0.proj")] = (down, torch.cat((value, gate)), scale)
        else:
            split[target.replace("attn.out_proj", "attn.to_out.0").replace("mlp.fc2", "ff.net.2")] = (down, up, scale)
    return split


@pytest.mark.parametrize("layout, recorded", [("diffusers", "maybe"), ("comfyui", False)])
def test_a_simpletuner_lora_recording_a_swiglu_order_it_cannot_place_is_refused(layout, recorded, base, cli,
                                                                                tmp_path):
    """swiglu_gate_first says which half of ff.net.0.proj's lora_B is the gate: read true or false on Diffusers'
    names and true on the release's (SimpleTuner's ComfyUI format, fc1 as the release has it). A value that is no
    boolean, or false on the release's names (no file SimpleTuner writes), cannot be placed: refused in one line,
    never fused with the halves guessed."""
    from safetensors import safe_open

    from conftest import assert_refused

    write = write_simpletuner if layout == "diffusers" else write_simpletuner_comfyui
    lora = write(tmp_path / "simpletuner", make_adapter(("blocks",), ((4, 8.0),), seed=1))
    with safe_open(lora, "pt") as handle:
        metadata, tensors = handle.metadata(), {key: handle.get_tensor(key) for key in handle.keys()}
    config = json.loads(metadata["lora_adapter_metadata"])
    config["transformer.swiglu_gate_first" if layout == "diffusers" else "swiglu_gate_first"] = recorded
    save_file(tensors, lora, metadata={**metadata, "lora_adapter_metadata": json.dumps(config)})
    assert_refused(cli, tmp_path, [lora, tmp_path / "out", "--base", base, "--lora", "fuse"],
                   "records swiglu_gate_first", "gate first", inputs=[lora])
