"""LoKr and LoHa adapters as trainers save them, and what their own code makes of them.

Written by the trainers' own saving code where it is installed: lycoris-lora's create_lycoris + save_weights (the
LyCORIS layout SimpleTuner saves), PEFT's LoKrConfig / LoHaConfig + save_pretrained. Written here, from the facts of
the trainer's source, where it is not (each writer says whose source it follows): musubi-tuner's networks.lokr /
networks.loha, ai-toolkit's LoKr, diffusion-pipe's LoKr.

The references, computed in float32 as the trainers merge (factor products first, the scale last, then added to W):
- LyCORIS: its module's own forward weight, ``get_weight(shape) * scalar`` (lycoris/modules/lokr.py, loha.py
  _rebuild_forward / forward). Not its merge_to: lycoris-lora 4.1.3's get_merged_weight multiplies get_weight, which
  is already scaled, by the scale again.
- PEFT: ``merge_and_unload`` of the adapter folder.
- ComfyUI (comfy/weight_adapter/lokr.py, loha.py calculate_weight), written out here: alpha / dim with dim w2_b's
  rows (LoKr; else w1_b's; alpha not applied when both factors are whole or there is no .alpha), w1_b's rows (LoHa);
  ``weight += (strength * alpha) * kron(w1, w2)`` or ``* (w1_a w1_b) * (w2_a w2_b)`` at strength 1.
- musubi-tuner (networks/lokr.py merge_weights_to_tensor, networks/loha.py merge_to), written out here: a whole w2
  divides alpha by its larger side.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# -- the factor math, as each trainer's source writes it --------------------------------------------------------
def comfy_delta(factors: dict[str, torch.Tensor], alpha: float | None) -> torch.Tensor:
    """ComfyUI's lokr / loha delta at strength 1.0 (comfy/weight_adapter/lokr.py, loha.py)."""
    f = {k: v.float() for k, v in factors.items()}
    if "hada_w1_a" in f:
        scale = 1.0 if alpha is None else alpha / f["hada_w1_b"].shape[0]
        return (1.0 * scale) * ((f["hada_w1_a"] @ f["hada_w1_b"]) * (f["hada_w2_a"] @ f["hada_w2_b"]))
    dim = None
    w1 = f.get("lokr_w1")
    if w1 is None:
        dim = f["lokr_w1_b"].shape[0]
        w1 = f["lokr_w1_a"] @ f["lokr_w1_b"]
    w2 = f.get("lokr_w2")
    if w2 is None:
        dim = f["lokr_w2_b"].shape[0]
        w2 = f["lokr_w2_a"] @ f["lokr_w2_b"]
    scale = alpha / dim if alpha is not None and dim is not None else 1.0
    return (1.0 * scale) * torch.kron(w1, w2)


def musubi_delta(factors: dict[str, torch.Tensor], alpha: float) -> torch.Tensor:
    """musubi-tuner's merge (networks/lokr.py merge_weights_to_tensor; networks/loha.py merge_to, whose scale is
    the fp32 alpha tensor over w1_b's rows) at multiplier 1.0."""
    f = {k: v.float() for k, v in factors.items()}
    if "hada_w1_a" in f:
        scale = torch.tensor(alpha, dtype=torch.float32) / f["hada_w1_b"].shape[0]
        return (f["hada_w1_a"] @ f["hada_w1_b"]) * (f["hada_w2_a"] @ f["hada_w2_b"]) * scale * 1.0
    if "lokr_w2_a" in f:
        w2, dim = f["lokr_w2_a"] @ f["lokr_w2_b"], f["lokr_w2_a"].shape[1]
    else:
        w2, dim = f["lokr_w2"], max(f["lokr_w2"].shape)
    return 1.0 * (torch.kron(f["lokr_w1"], w2.contiguous()) * (alpha / dim))


def added(weights: dict[str, torch.Tensor], deltas: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """W + delta for each module (by its Diffusers name), in float32; the other weights as they are."""
    out = {name: tensor.float() for name, tensor in weights.items()}
    for module, delta in deltas.items():
        out[f"{module}.weight"] = out[f"{module}.weight"] + delta.reshape(out[f"{module}.weight"].shape)
    return out


def random_factors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {part: torch.randn(shape, generator=generator) * 0.3 for part, shape in shapes.items()}


# -- LyCORIS's own save -----------------------------------------------------------------------------------------
def lycoris_saved(model: torch.nn.Module, specs: dict[str, dict], path: Path, seed: int,
                  dtype: torch.dtype = torch.float32) -> tuple[Path, dict[str, torch.Tensor]]:
    """LyCORIS wraps ``model``'s modules named in ``specs`` (module -> {"algo": "lokr", "dim": ..., "alpha": ...,
    "factor": ..., "decompose_both": ...}), its factors set to seeded random values, saved by its own save_weights;
    returns the file and each module's delta as its forward computes it (get_weight * scalar)."""
    from lycoris import LycorisNetwork, create_lycoris

    saved = {key: getattr(LycorisNetwork, key) for key in ("TARGET_REPLACE_MODULE", "TARGET_REPLACE_NAME",
                                                           "NAME_ALGO_MAP", "MODULE_ALGO_MAP")}
    try:
        LycorisNetwork.apply_preset({"target_module": [], "target_name": list(specs), "name_algo_map": specs})
        network = create_lycoris(model, 1.0, linear_dim=4, linear_alpha=1, algo="lora")
    finally:
        for key, value in saved.items():
            setattr(LycorisNetwork, key, value)
    network.apply_to()  # registers the modules whose weights save_weights writes
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    network.save_weights(str(path), dtype, {"lycoris_config": json.dumps({"algo": "per module"})})
    deltas = lycoris_deltas(network, model)
    network.restore()
    return path, deltas


def lycoris_deltas(network, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each wrapped module's weight change as LyCORIS's forward builds it."""
    names = {id(module): name for name, module in model.named_modules()}
    with torch.no_grad():
        return {names[id(lora.org_module[0])]: (lora.get_weight(lora.shape) * lora.scalar).float()
                for lora in network.loras}


def lycoris_loaded(model: torch.nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """What LyCORIS's own loader (create_lycoris_from_weights) makes of a file on ``model``: each module's delta."""
    from lycoris import create_lycoris_from_weights

    network, _ = create_lycoris_from_weights(1.0, str(path), model)
    assert network.loras, "LyCORIS loaded no modules"
    network.apply_to()
    deltas = lycoris_deltas(network, model)
    network.restore()
    return deltas


# -- trainers whose code is not installed: writers that follow their sources ------------------------------------------
def write_musubi_lycoris(path: Path, modules: dict[str, tuple[dict[str, torch.Tensor], float]], algo: str,
                         factor: int = -1) -> Path:
    """musubi-tuner's networks.lokr / networks.loha save: lora_unet_ + the original module name with underscores,
    each factor under its LyCORIS name, an .alpha per module; networks.lokr also saves its network-level
    ``lokr_factor`` (an int64 0-dim tensor) and kohya's metadata names the network module."""
    tensors = {}
    for module, (factors, alpha) in modules.items():
        name = "lora_unet_" + module.replace(".", "_")
        tensors.update({f"{name}.{part}": tensor for part, tensor in factors.items()})
        tensors[f"{name}.alpha"] = torch.tensor(alpha)
    if algo == "lokr":
        tensors["lokr_factor"] = torch.tensor(factor, dtype=torch.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path, metadata={"ss_network_module": f"networks.{algo}", "ss_network_dim": "4",
                                       "ss_network_alpha": "1.0"})
    return path


AITOOLKIT_WAN_RENAMES = (("attn1", "self_attn"), ("attn2", "cross_attn"))
AITOOLKIT_WAN_PARTS = (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("add_k_proj", "k_img"), ("add_v_proj", "v_img"))


def aitoolkit_wan_key(module: str, part: str, prefix: str = "lycoris_") -> str:
    """ai-toolkit's key for a Wan LoKr module: its network names it lora_transformer_ + the Diffusers path with
    underscores, its older LoKr format swaps that prefix for lycoris_ (toolkit/network_mixins.py get_state_dict),
    then the Wan saver's convert_to_original (toolkit/models/wan21/wan_lora_convert.py) replaces substrings: attn1 or
    attn2, then the first of to_out.0 (never in an underscore name), to_q, to_k, to_v, add_k_proj, add_v_proj."""
    key = f"{prefix}{module.replace('.', '_')}.{part}"
    for old, new in AITOOLKIT_WAN_RENAMES:
        if old in key:
            key = key.replace(old, new)
            break
    for old, new in AITOOLKIT_WAN_PARTS:
        if old in key:
            return key.replace(old, new)
    return key
