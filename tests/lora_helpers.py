"""The judges of the LoRA tests: Diffusers' own loaders and PEFT's own merge, and W + (alpha / r) B A computed here in
the operation order of PEFT's merge ((B @ A) * scale, then added), so that equality is exact."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

Adapter = dict[str, tuple[torch.Tensor, torch.Tensor, float]]  # module -> (lora_A [r, in], lora_B [out, r], scale)


def merged(weights: dict[str, torch.Tensor], adapter: Adapter, bias_deltas: dict[str, torch.Tensor] | None = None):
    """W + (B @ A) * scale for every adapted module, in fp32; biases plus their deltas."""
    out = {name: tensor.float() for name, tensor in weights.items()}
    for module, (down, up, scale) in adapter.items():
        out[f"{module}.weight"] = out[f"{module}.weight"] + (up.float() @ down.float()) * scale
    for module, delta in (bias_deltas or {}).items():
        out[f"{module}.bias"] = out[f"{module}.bias"] + delta.float()
    return out


def assert_all_equal(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(actual) == set(expected), sorted(set(actual) ^ set(expected))[:5]
    wrong = [name for name in expected if not torch.equal(actual[name], expected[name])]
    assert not wrong, wrong[:5]


def diffusers_fused(pipeline_class, model_class, config: dict, weights: dict[str, torch.Tensor], lora: Path | dict,
                    **load) -> dict[str, torch.Tensor]:
    """What Diffusers makes of a LoRA file or folder: the pipeline's lora_state_dict (which converts the foreign
    layouts it knows), loaded into the base transformer with its metadata, fused at scale 1.0."""
    model = model_class.from_config(config)
    model.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    state_dict, metadata = pipeline_class.lora_state_dict(lora, return_lora_metadata=True, **load)
    model.load_lora_adapter(state_dict, prefix="transformer", metadata=metadata, adapter_name="trained")
    assert any("lora_A" in name for name, _ in model.named_parameters()), "Diffusers loaded no LoRA layers"
    model.fuse_lora(lora_scale=1.0)
    model.unload_lora()
    return model.state_dict()


def peft_fused(model_class, config: dict, weights: dict[str, torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    """What PEFT makes of an adapter folder (adapter_model.safetensors + adapter_config.json): its own merge."""
    from peft import PeftModel

    model = model_class.from_config(config)
    model.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    return PeftModel.from_pretrained(model, str(folder)).merge_and_unload().state_dict()


USUAL = (4, 8.0)  # the rank and alpha most modules of the tests' adapters have: LoraConfig's r and lora_alpha


def random_modules(shapes: dict, modules, seed: int, strengths) -> dict:
    """module -> (A, B, rank, alpha): random A and B (B non-zero) for each module's weight (its shape in ``shapes``
    under "{module}.weight"), the strengths in turn."""
    generator = torch.Generator().manual_seed(seed)
    made = {}
    for index, module in enumerate(modules):
        rank, alpha = strengths[index % len(strengths)]
        out, inp = shapes[f"{module}.weight"]
        made[module] = (torch.randn(rank, inp, generator=generator) * 0.3,
                        torch.randn(out, rank, generator=generator) * 0.3, rank, alpha)
    return made


def peft_patterns(modules: dict) -> dict:
    """PEFT LoraConfig arguments for module -> (A, B, rank, alpha): the usual strength, and patterns for the rest."""
    rank, alpha = USUAL
    return {"r": rank, "lora_alpha": alpha, "target_modules": sorted(modules),
            "rank_pattern": {m: r for m, (_, _, r, _) in modules.items() if r != rank},
            "alpha_pattern": {m: a for m, (_, _, _, a) in modules.items() if a != alpha}}


# -- the trainers' files on Diffusers module names, for module -> (A, B, rank, alpha) ------------------------------
def write_diffusers_lora(pipeline_class, folder: Path, modules: dict) -> Path:
    """The family pipeline's own save_lora_weights, with PEFT's rank and alpha patterns as its adapter metadata."""
    layers = {f"{m}.lora_{part}.weight": t.clone() for m, (a, b, _, _) in modules.items()
              for part, t in (("A", a), ("B", b))}
    pipeline_class.save_lora_weights(folder, transformer_lora_layers=layers,
                                     transformer_lora_adapter_metadata=peft_patterns(modules))
    return folder / "pytorch_lora_weights.safetensors"


# -- ... and on the original layer names, as kohya-style trainers and ComfyUI save them -------------------------------
def write_musubi_lora(path: Path, layers: dict, network_module: str) -> Path:
    """musubi-tuner: lora_unet_ + the original name with underscores, lora_down / lora_up and every .alpha."""
    tensors = {}
    for layer, (a, b, _, alpha) in layers.items():
        name = "lora_unet_" + layer.replace(".", "_")
        tensors.update({f"{name}.lora_down.weight": a, f"{name}.lora_up.weight": b,
                        f"{name}.alpha": torch.tensor(alpha)})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path, metadata={"ss_network_module": network_module, "ss_network_dim": "4",
                                       "ss_network_alpha": "8.0"})
    return path


def write_comfyui_lora(path: Path, layers: dict, parts: tuple[str, str] = ("down", "up"),
                       extra: dict[str, torch.Tensor] | None = None) -> Path:
    """ComfyUI: diffusion_model. + the original name, lora_down / lora_up (or lora_A / lora_B), .alpha only where the
    strength is not 1 (ComfyUI applies a module without one at scale 1); ``extra`` tensors as they are."""
    tensors = {}
    for layer, (a, b, rank, alpha) in layers.items():
        name = "diffusion_model." + layer
        tensors.update({f"{name}.lora_{parts[0]}.weight": a, f"{name}.lora_{parts[1]}.weight": b})
        if alpha != rank:
            tensors[f"{name}.alpha"] = torch.tensor(alpha)
    tensors.update(extra or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path)
    return path


def write_finetrainers_lora(path: Path, modules: dict) -> Path:
    """finetrainers: Diffusers names, one rank and alpha in its lora_config metadata (which Diffusers does not read)."""
    rank, alpha = USUAL
    tensors = {f"transformer.{m}.lora_{part}.weight": t.clone() for m, (a, b, _, _) in modules.items()
               for part, t in (("A", a), ("B", b))}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path, metadata={"lora_config": json.dumps(
        {"r": rank, "lora_alpha": alpha, "init_lora_weights": True, "target_modules": sorted(modules)})})
    return path


def peft_wrapped(model_class, config: dict, weights: dict[str, torch.Tensor], modules: dict):
    """The tiny model wrapped by PEFT itself, its adapters set to the test's values."""
    from peft import LoraConfig, get_peft_model

    model = model_class.from_config(config)
    model.load_state_dict(weights)
    wrapped = get_peft_model(model, LoraConfig(**peft_patterns(modules)))
    with torch.no_grad():
        for module, (a, b, _, _) in modules.items():
            layer = wrapped.base_model.model.get_submodule(module)
            layer.lora_A["default"].weight.copy_(a)
            layer.lora_B["default"].weight.copy_(b)
    return wrapped


def write_peft_adapter(folder: Path, wrapped) -> Path:
    wrapped.save_pretrained(str(folder))
    return folder / "adapter_model.safetensors"


def write_peft_checkpoint_file(folder: Path, wrapped) -> Path:
    """A DDP training checkpoint of the PEFT-wrapped model (module.base_model.model.<...>.base_layer.weight,
    .lora_A.default.weight, every other weight) with the run's adapter_config.json beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({f"module.{name}": t.contiguous() for name, t in wrapped.state_dict().items()},
              folder / "model.safetensors")
    wrapped.peft_config["default"].save_pretrained(str(folder))
    return folder / "model.safetensors"


def files_of(folder: Path) -> dict[str, object]:
    """Every tensor, the header metadata and the side files an adapter folder holds (not the model card)."""
    found: dict[str, object] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix == ".safetensors":
            found[path.name] = (load_file(path), header(path))
        elif path.name != "README.md":
            found[path.name] = path.read_text()
    return found


def assert_any_to_any_to_any(export, source: Path, name: str, base: Path, outputs, tmp_path: Path) -> None:
    """``source`` written in every layout (``{name}-{target}``), each of those again in every layout
    (``{name}-{middle}-{target}``): the same files as the direct way, bit for bit."""
    direct = {target: export(source, tmp_path / f"{name}-{target}", base=base, lora_format=target)
              and files_of(tmp_path / f"{name}-{target}") for target in outputs}
    for middle in outputs:
        for target in outputs:
            out = tmp_path / f"{name}-{middle}-{target}"
            export(tmp_path / f"{name}-{middle}", out, base=base, lora_format=target)
            assert_same_files(files_of(out), direct[target])


def assert_same_files(actual: dict, expected: dict) -> None:
    assert set(actual) == set(expected)
    for name, value in expected.items():
        if isinstance(value, tuple):
            assert_all_equal(actual[name][0], value[0])
            assert actual[name][1] == value[1], name
        else:
            assert actual[name] == value, name


def header(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as handle:
        return handle.metadata() or {}


def adapter_metadata(path: Path) -> dict:
    return json.loads(header(path)["lora_adapter_metadata"])
