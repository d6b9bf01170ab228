"""Write CogVideoX checkpoints in the SAT (SwissArmyTransformer + DeepSpeed) layout, from Diffusers weights.

This is test and benchmark data for the exporter, written independently of it: every rename below is the inverse
of the facts page (docs/cogvideox-formats.md, sections 2, 3, 5 and 6), spelled out by hand, so that exporting these
files back to Diffusers and comparing with the original tensors checks the exporter against the facts rather than
against itself.

    python scripts/make_sat_checkpoint.py RUN_DIR --variant 5b-i2v [--num-layers 3] [--ema] [--lora-rank 4]
    python scripts/make_sat_checkpoint.py RUN_DIR --variant 2b --size full      # ~3.4 GB, random bf16 weights

A tiny run writes, next to RUN_DIR: RUN_DIR.expected.safetensors (the Diffusers transformer state dict in fp32,
holding exactly the values stored in the SAT file, i.e. already rounded to the SAT dtype), RUN_DIR.config.json
(the Diffusers config), and when asked RUN_DIR.expected-ema.safetensors, RUN_DIR.expected-merged.safetensors
(LoRA merged at SAT's alpha 1) and RUN_DIR.expected-lora.safetensors (the same adapters under Diffusers LoRA names).

The SAT file holds a numpy RNG state on purpose: it loads only with torch.load(weights_only=False).
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import click
import numpy as np
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cogvideox_tiny_configs import (  # noqa: E402
    VARIANTS,
    build_tiny_transformer,
    build_tiny_vae,
    full_transformer_config,
    tiny_transformer_config,
    tiny_vae_config,
)

SAT_MODEL_PREFIX = "model.diffusion_model."
SAT_T5_PREFIX = "conditioner.embedders.0.transformer."
SAT_VAE_PREFIX = "first_stage_model."
MODEL_STATES_FILE = "mp_rank_00_model_states.pt"
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
SAT_LORA_ALPHA = 1.0

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

StateDict = Mapping[str, Tensor]


# --------------------------------------------------------------------------------------------------------------
# Transformer: Diffusers -> SAT


def num_transformer_layers(state_dict: StateDict) -> int:
    indices = {int(key.split(".")[1]) for key in state_dict if key.startswith("transformer_blocks.")}
    if indices != set(range(len(indices))):
        raise ValueError(f"transformer_blocks indices are not contiguous from 0: {sorted(indices)}")
    return len(indices)


def diffusers_to_sat_transformer(state_dict: StateDict) -> OrderedDict[str, Tensor]:
    """Diffusers CogVideoXTransformer3DModel keys -> SAT keys (without the ``model.diffusion_model.`` prefix).

    Output order follows SAT's module order: embeddings, all transformer layers, then the mixins. Any Diffusers key
    left unmapped is an error, so nothing is lost silently.
    """
    src = dict(state_dict)
    out: OrderedDict[str, Tensor] = OrderedDict()

    def move(sat: str, diffusers: str) -> None:
        out[f"{sat}.weight"] = src.pop(f"{diffusers}.weight")
        if f"{diffusers}.bias" in src:
            out[f"{sat}.bias"] = src.pop(f"{diffusers}.bias")

    num_layers = num_transformer_layers(src)

    move("time_embed.0", "time_embedding.linear_1")
    move("time_embed.2", "time_embedding.linear_2")
    if "ofs_embedding.linear_1.weight" in src:
        move("ofs_embed.0", "ofs_embedding.linear_1")
        move("ofs_embed.2", "ofs_embedding.linear_2")

    for i in range(num_layers):
        block, layer = f"transformer_blocks.{i}", f"transformer.layers.{i}"
        move(f"{layer}.input_layernorm", f"{block}.norm1.norm")
        for part in ("weight", "bias"):
            if f"{block}.attn1.to_q.{part}" in src:
                out[f"{layer}.attention.query_key_value.{part}"] = torch.cat(
                    [src.pop(f"{block}.attn1.{name}.{part}") for name in ("to_q", "to_k", "to_v")], dim=0
                )
        move(f"{layer}.attention.dense", f"{block}.attn1.to_out.0")
        move(f"{layer}.post_attention_layernorm", f"{block}.norm2.norm")
        move(f"{layer}.mlp.dense_h_to_4h", f"{block}.ff.net.0.proj")
        move(f"{layer}.mlp.dense_4h_to_h", f"{block}.ff.net.2")
    move("transformer.final_layernorm", "norm_final")

    # The 2B sin-cos table is a non-persistent buffer, so it is only in the state dict for learned positions.
    if "patch_embed.pos_embedding" in src:
        out["mixins.pos_embed.pos_embedding"] = src.pop("patch_embed.pos_embedding")
    move("mixins.patch_embed.proj", "patch_embed.proj")
    move("mixins.patch_embed.text_proj", "patch_embed.text_proj")

    for i in range(num_layers):
        for part in ("weight", "bias"):
            out[f"mixins.adaln_layer.adaLN_modulations.{i}.1.{part}"] = _sat_adaln_chunks(
                src.pop(f"transformer_blocks.{i}.norm1.linear.{part}"),
                src.pop(f"transformer_blocks.{i}.norm2.linear.{part}"),
            )
    for i in range(num_layers):
        move(f"mixins.adaln_layer.query_layernorm_list.{i}", f"transformer_blocks.{i}.attn1.norm_q")
    for i in range(num_layers):
        move(f"mixins.adaln_layer.key_layernorm_list.{i}", f"transformer_blocks.{i}.attn1.norm_k")

    move("mixins.final_layer.norm_final", "norm_out.norm")
    move("mixins.final_layer.linear", "proj_out")
    move("mixins.final_layer.adaLN_modulation.1", "norm_out.linear")

    if src:
        raise ValueError(f"Diffusers keys with no SAT name: {sorted(src)}")
    return out


def _sat_adaln_chunks(norm1: Tensor, norm2: Tensor) -> Tensor:
    """Rebuild SAT's 12-chunk modulation from Diffusers' two 6-chunk ones.

    Diffusers' norm1 (attention) and norm2 (MLP) each hold shift, scale, gate, text-shift, text-scale, text-gate.
    SAT holds the video stream's attention and MLP sixes first, then the text stream's.
    """
    attn, mlp = norm1.chunk(6, dim=0), norm2.chunk(6, dim=0)
    return torch.cat([*attn[:3], *mlp[:3], *attn[3:], *mlp[3:]], dim=0)


# --------------------------------------------------------------------------------------------------------------
# SAT LoRA


def make_lora_pairs(
    transformer_sd: StateDict, rank: int, *, seed: int = 0, dtype: torch.dtype = torch.float32,
    layers: Sequence[int] | None = None,
) -> dict[str, tuple[Tensor, Tensor]]:
    """Random adapters for every attention q/k/v/out projection (of ``layers`` only, as LoraMixin's layer_range).

    Keys are Diffusers module paths (``transformer_blocks.{i}.attn1.to_q``); values are (A [r, in], B [out, r]).
    B is nonzero (a trained adapter), and both are rounded to ``dtype`` so fp32 references match the stored values.
    """
    generator = torch.Generator().manual_seed(seed)
    pairs = {}
    for i in range(num_transformer_layers(transformer_sd)):
        if layers is not None and i not in layers:
            continue
        for target in LORA_TARGETS:
            module = f"transformer_blocks.{i}.attn1.{target}"
            out_features, in_features = transformer_sd[f"{module}.weight"].shape
            lora_a = torch.randn(rank, in_features, generator=generator) * 0.1
            lora_b = torch.randn(out_features, rank, generator=generator) * 0.1
            pairs[module] = (_round_to(lora_a, dtype), _round_to(lora_b, dtype))
    return pairs


def diffusers_to_sat_lora(
    transformer_sd: StateDict, lora_pairs: Mapping[str, tuple[Tensor, Tensor]], rank: int
) -> OrderedDict[str, Tensor]:
    """SAT keys of a LoRA-wrapped model: base q/k/v and dense weights under ``.original``, plus the adapters.

    ``query_key_value`` carries one adapter per partition (0=q, 1=k, 2=v), ``attention.dense`` one (0). Layers
    without adapters in ``lora_pairs`` stay plain, as LoraMixin leaves the layers outside its layer_range.
    """
    sat = diffusers_to_sat_transformer(transformer_sd)
    wrapped = re.compile(r"transformer\.layers\.(\d+)\.attention\.(query_key_value|dense)\.(weight|bias)")
    out: OrderedDict[str, Tensor] = OrderedDict()
    for key, tensor in sat.items():
        match = wrapped.fullmatch(key)
        if match is None or f"transformer_blocks.{match.group(1)}.attn1.to_q" not in lora_pairs:
            out[key] = tensor
            continue
        layer, module, part = match.groups()
        if part == "bias":
            continue  # already written next to its weight
        base = f"transformer.layers.{layer}.attention.{module}"
        out[f"{base}.original.weight"] = tensor
        if f"{base}.bias" in sat:
            out[f"{base}.original.bias"] = sat[f"{base}.bias"]
        targets = ("to_q", "to_k", "to_v") if module == "query_key_value" else ("to_out.0",)
        adapters = [lora_pairs[f"transformer_blocks.{layer}.attn1.{target}"] for target in targets]
        for lora_a, lora_b in adapters:
            if lora_a.shape[0] != rank or lora_b.shape[1] != rank:
                shapes = f"A {tuple(lora_a.shape)}, B {tuple(lora_b.shape)}"
                raise ValueError(f"adapter for {base} is not rank {rank}: {shapes}")
        for j, (lora_a, _) in enumerate(adapters):
            out[f"{base}.matrix_A.{j}"] = lora_a
        for j, (_, lora_b) in enumerate(adapters):
            out[f"{base}.matrix_B.{j}"] = lora_b
    return out


def merge_lora(
    transformer_sd: StateDict, lora_pairs: Mapping[str, tuple[Tensor, Tensor]], rank: int, alpha: float = SAT_LORA_ALPHA
) -> OrderedDict[str, Tensor]:
    """The Diffusers state dict with W + (alpha / rank) * B @ A folded in, computed in fp32."""
    merged = OrderedDict((key, tensor.float()) for key, tensor in transformer_sd.items())
    for module, (lora_a, lora_b) in lora_pairs.items():
        merged[f"{module}.weight"] = merged[f"{module}.weight"] + (alpha / rank) * (lora_b.float() @ lora_a.float())
    return merged


def lora_pairs_to_diffusers(lora_pairs: Mapping[str, tuple[Tensor, Tensor]]) -> OrderedDict[str, Tensor]:
    """The adapters under ``pytorch_lora_weights.safetensors`` names."""
    out: OrderedDict[str, Tensor] = OrderedDict()
    for module, (lora_a, lora_b) in lora_pairs.items():
        out[f"transformer.{module}.lora_A.weight"] = lora_a
        out[f"transformer.{module}.lora_B.weight"] = lora_b
    return out


# --------------------------------------------------------------------------------------------------------------
# VAE: Diffusers -> SAT


def diffusers_to_sat_vae(
    state_dict: StateDict, num_up_blocks: int, *, loss_keys: bool = True
) -> OrderedDict[str, Tensor]:
    """AutoencoderKLCogVideoX keys -> SAT ``3d-vae.pt`` keys, plus (by default) training-loss keys to be dropped."""
    out: OrderedDict[str, Tensor] = OrderedDict()
    for key, tensor in state_dict.items():
        sat_key = _sat_vae_key(key, num_up_blocks)
        if sat_key in out:
            raise ValueError(f"two VAE keys map to {sat_key}")
        out[sat_key] = tensor
    if loss_keys:
        out.update(_fake_vae_loss_keys())
    return out


def num_vae_up_blocks(state_dict: StateDict) -> int:
    return 1 + max(int(key.split(".")[2]) for key in state_dict if key.startswith("decoder.up_blocks."))


def _sat_vae_key(key: str, num_up_blocks: int) -> str:
    parts = key.split(".")
    if parts[:2] == ["decoder", "up_blocks"]:
        # SAT builds its up list from the highest resolution down and runs it reversed; Diffusers stores run order.
        index = int(parts[2])
        if not 0 <= index < num_up_blocks:
            raise ValueError(f"{key}: up block index out of range for {num_up_blocks} up blocks")
        parts[1:3] = ["up", str(num_up_blocks - 1 - index)]
    elif parts[:2] == ["encoder", "down_blocks"]:
        parts[1] = "down"
    elif parts[1:3] == ["mid_block", "resnets"]:
        parts[1:4] = ["mid", f"block_{int(parts[3]) + 1}"]
    renamed = ".".join(parts)
    renamed = renamed.replace(".resnets.", ".block.")
    renamed = renamed.replace(".downsamplers.0.", ".downsample.")
    renamed = renamed.replace(".upsamplers.0.", ".upsample.")
    renamed = renamed.replace(".conv_shortcut.", ".nin_shortcut.")
    return renamed


def _fake_vae_loss_keys() -> OrderedDict[str, Tensor]:
    """A few of the training-loss tensors the official 3d-vae.pt carries (LPIPS net, discriminator, logvar)."""
    generator = torch.Generator().manual_seed(7)
    return OrderedDict(
        [
            ("loss.logvar", torch.zeros(())),
            ("loss.perceptual_loss.net.slice1.0.weight", torch.randn(4, 3, 3, 3, generator=generator)),
            ("loss.perceptual_loss.net.slice1.0.bias", torch.randn(4, generator=generator)),
            ("loss.discriminator.main.0.weight", torch.randn(4, 3, 3, 3, 3, generator=generator)),
            ("loss.discriminator.main.0.bias", torch.randn(4, generator=generator)),
        ]
    )


# --------------------------------------------------------------------------------------------------------------
# Engine extras the exporter must leave alone


def fake_t5_state_dict(generator: torch.Generator) -> OrderedDict[str, Tensor]:
    """A token frozen T5 encoder (real names, tiny shapes): keys that must be filtered out, never renamed."""
    width, vocab = 8, 32
    names_and_shapes = [
        ("shared.weight", (vocab, width)),
        ("encoder.embed_tokens.weight", (vocab, width)),
        ("encoder.block.0.layer.0.SelfAttention.q.weight", (width, width)),
        ("encoder.block.0.layer.0.SelfAttention.k.weight", (width, width)),
        ("encoder.block.0.layer.0.SelfAttention.v.weight", (width, width)),
        ("encoder.block.0.layer.0.SelfAttention.o.weight", (width, width)),
        ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", (32, 2)),
        ("encoder.block.0.layer.0.layer_norm.weight", (width,)),
        ("encoder.block.0.layer.1.DenseReluDense.wi_0.weight", (2 * width, width)),
        ("encoder.block.0.layer.1.DenseReluDense.wo.weight", (width, 2 * width)),
        ("encoder.final_layer_norm.weight", (width,)),
    ]
    return OrderedDict((name, torch.randn(shape, generator=generator)) for name, shape in names_and_shapes)


def fake_sat_vae_state_dict(generator: torch.Generator) -> OrderedDict[str, Tensor]:
    """A token frozen VAE in SAT names (``up.``, ``mid.block_1``): a blind prefix strip would mangle these."""
    names_and_shapes = [
        ("encoder.conv_in.conv.weight", (4, 3, 3, 3, 3)),
        ("encoder.down.0.block.0.conv1.conv.weight", (4, 4, 3, 3, 3)),
        ("encoder.mid.block_1.norm1.weight", (4,)),
        ("decoder.mid.block_2.conv2.conv.weight", (4, 4, 3, 3, 3)),
        ("decoder.up.0.block.0.norm1.norm_layer.weight", (4,)),
        ("decoder.up.1.upsample.conv.weight", (4, 4, 3, 3)),
        ("decoder.conv_out.conv.weight", (3, 4, 3, 3, 3)),
    ]
    return OrderedDict((name, torch.randn(shape, generator=generator)) for name, shape in names_and_shapes)


def droppable_sat_keys(hidden: int, head_dim: int, generator: torch.Generator) -> OrderedDict[str, Tensor]:
    """Keys some SAT files carry inside the transformer prefix and an export must drop (facts page, section 2)."""
    grid = (3, 4, 6, head_dim)  # (latent frames, h patches, w patches, head dim) of a RoPE table
    return OrderedDict(
        [
            ("mixins.pos_embed.freqs_sin", torch.randn(grid, generator=generator)),
            ("mixins.pos_embed.freqs_cos", torch.randn(grid, generator=generator)),
            ("transformer.position_embeddings.weight", torch.randn(64, hidden, generator=generator)),
        ]
    )


# --------------------------------------------------------------------------------------------------------------
# Writing runs


@dataclass
class WrittenRun:
    """What a written run must export to; ``expected*`` are Diffusers-named fp32 dicts equal to the stored values."""

    run_dir: Path
    iteration: int
    expected: OrderedDict[str, Tensor]
    expected_ema: OrderedDict[str, Tensor] | None = None
    lora_rank: int | None = None
    lora_alpha: float = SAT_LORA_ALPHA
    lora_pairs: dict[str, tuple[Tensor, Tensor]] | None = None
    lora_pairs_ema: dict[str, tuple[Tensor, Tensor]] | None = None

    @property
    def model_states(self) -> Path:
        return self.run_dir / str(self.iteration) / MODEL_STATES_FILE

    @property
    def ema_model_states(self) -> Path:
        return self.run_dir / f"{self.iteration}-ema" / MODEL_STATES_FILE

    def expected_merged(self, ema: bool = False) -> OrderedDict[str, Tensor]:
        """The transformer with the LoRA folded in at SAT's alpha (what a merging export must produce)."""
        if self.lora_rank is None:
            raise ValueError("not a LoRA run")
        weights, pairs = (self.expected_ema, self.lora_pairs_ema) if ema else (self.expected, self.lora_pairs)
        return merge_lora(weights, pairs, self.lora_rank, self.lora_alpha)


def sat_engine_state_dict(
    transformer_sd: StateDict,
    *,
    dtype: torch.dtype = torch.bfloat16,
    lora_pairs: Mapping[str, tuple[Tensor, Tensor]] | None = None,
    lora_rank: int | None = None,
    extra_t5: bool = True,
    extra_vae_sd: StateDict | None = None,
    drop_keys: bool = True,
    seed: int = 0,
) -> OrderedDict[str, Tensor]:
    """The ``module`` dict of a fine-tuned SAT engine: transformer, frozen T5, frozen VAE, all in ``dtype``.

    ``extra_vae_sd`` None puts a token SAT-named VAE under ``first_stage_model.``; a Diffusers VAE state dict puts
    that VAE there (converted, without loss keys); an empty dict puts none.
    """
    generator = torch.Generator().manual_seed(seed + 1)
    if lora_pairs is not None:
        sat = diffusers_to_sat_lora(transformer_sd, lora_pairs, lora_rank)
    else:
        sat = diffusers_to_sat_transformer(transformer_sd)
    module: OrderedDict[str, Tensor] = OrderedDict()
    for key, tensor in sat.items():
        module[SAT_MODEL_PREFIX + key] = tensor
    if drop_keys:
        hidden = sat["mixins.patch_embed.text_proj.weight"].shape[0]
        head_dim = sat["mixins.adaln_layer.query_layernorm_list.0.weight"].shape[0]
        for key, tensor in droppable_sat_keys(hidden, head_dim, generator).items():
            module[SAT_MODEL_PREFIX + key] = tensor
    if extra_t5:
        for key, tensor in fake_t5_state_dict(generator).items():
            module[SAT_T5_PREFIX + key] = tensor
    if extra_vae_sd is None:
        vae = fake_sat_vae_state_dict(generator)
    elif extra_vae_sd:
        vae = diffusers_to_sat_vae(extra_vae_sd, num_vae_up_blocks(extra_vae_sd), loss_keys=False)
    else:
        vae = {}
    for key, tensor in vae.items():
        module[SAT_VAE_PREFIX + key] = tensor
    # Fresh contiguous storage per tensor: torch.save would otherwise write whole shared storages of views.
    return OrderedDict((key, tensor.detach().to(dtype).contiguous().clone()) for key, tensor in module.items())


def save_model_states(tag_dir: Path, module: StateDict, iteration: int, *, numpy_rng: bool = True) -> Path:
    """``{tag}/mp_rank_00_model_states.pt`` as SAT's save_checkpoint + DeepSpeed write it (no optimizer state)."""
    tag_dir.mkdir(parents=True, exist_ok=True)
    states = {
        "module": module,
        "buffer_names": [],
        "optimizer": None,
        "lr_scheduler": None,
        "skipped_steps": 0,
        "global_steps": iteration,
        "global_samples": iteration,
        "dp_world_size": 1,
        "mp_world_size": 1,
        "ds_version": "0.14.4",
        "iteration": iteration,
        "client_lr_scheduler": {},
        "random_rng_state": random.getstate(),
        "torch_rng_state": torch.get_rng_state(),
    }
    if numpy_rng:
        states["np_rng_state"] = np.random.get_state()
    path = tag_dir / MODEL_STATES_FILE
    torch.save(states, path)
    return path


def write_sat_run(
    run_dir: str | Path,
    transformer_sd: StateDict,
    *,
    iteration: int = 1000,
    ema: bool = False,
    extra_t5: bool = True,
    extra_vae_sd: StateDict | None = None,
    drop_keys: bool = True,
    numpy_rng: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    lora_rank: int | None = None,
    lora_layers: Sequence[int] | None = None,
    seed: int = 0,
) -> WrittenRun:
    """Write ``run_dir/latest`` and ``run_dir/{iteration}[-ema]/mp_rank_00_model_states.pt``.

    The returned ``expected`` dicts are ``transformer_sd`` (and its EMA perturbation) rounded through ``dtype`` and
    held in fp32, so an exact comparison is fair. With ``lora_rank`` the file holds the LoRA-wrapped layout: the
    base weights are ``expected`` and the adapters are ``lora_pairs`` (EMA: same base, ``lora_pairs_ema``), on
    every layer or on ``lora_layers`` only. ``extra_vae_sd``: None adds a token SAT-named VAE, a Diffusers VAE state dict adds that VAE, {} adds none.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    expected = OrderedDict((key, _round_to(tensor, dtype)) for key, tensor in transformer_sd.items())
    run = WrittenRun(run_dir=run_dir, iteration=iteration, expected=expected, lora_rank=lora_rank)
    if lora_rank is not None:
        run.lora_pairs = make_lora_pairs(expected, lora_rank, seed=seed + 2, dtype=dtype, layers=lora_layers)

    def write(tag: str, weights: StateDict, pairs) -> None:
        module = sat_engine_state_dict(
            weights, dtype=dtype, lora_pairs=pairs, lora_rank=lora_rank,
            extra_t5=extra_t5, extra_vae_sd=extra_vae_sd, drop_keys=drop_keys, seed=seed,
        )
        save_model_states(run_dir / tag, module, iteration, numpy_rng=numpy_rng)

    write(str(iteration), expected, run.lora_pairs)
    if ema:
        generator = torch.Generator().manual_seed(seed + 3)
        if run.lora_pairs is None:
            run.expected_ema = _perturbed(expected, generator, dtype)
        else:
            # Under LoRA only the adapters train, so only they have an EMA that differs.
            run.expected_ema = expected
            run.lora_pairs_ema = {
                module: (_perturb(a, generator, dtype), _perturb(b, generator, dtype))
                for module, (a, b) in run.lora_pairs.items()
            }
        write(f"{iteration}-ema", run.expected_ema, run.lora_pairs_ema)
    (run_dir / "latest").write_text(str(iteration))
    return run


def write_sat_vae(
    path: str | Path, vae_sd: StateDict, num_up_blocks: int, *, dtype: torch.dtype = torch.float32
) -> Path:
    """A ``3d-vae.pt`` like the official SAT download: ``{"state_dict": ...}`` with ``loss.*`` keys included."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state_dict = OrderedDict(
        (key, tensor.detach().to(dtype).contiguous().clone())
        for key, tensor in diffusers_to_sat_vae(vae_sd, num_up_blocks).items()
    )
    torch.save({"state_dict": state_dict}, path)
    return path


def _round_to(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    return tensor.detach().to(dtype).to(torch.float32)


def _perturb(tensor: Tensor, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """An EMA-like neighbour: close to the weights, but different in every element even after rounding."""
    return _round_to(tensor + 0.01 * torch.randn(tensor.shape, generator=generator), dtype)


def _perturbed(state_dict: StateDict, generator: torch.Generator, dtype: torch.dtype) -> OrderedDict[str, Tensor]:
    return OrderedDict((key, _perturb(tensor, generator, dtype)) for key, tensor in state_dict.items())


# --------------------------------------------------------------------------------------------------------------
# Full size (benchmark)


def full_size_sat_meta(
    variant: str = "2b", num_layers: int | None = None, lora_rank: int | None = None
) -> OrderedDict[str, Tensor]:
    """SAT meta tensors of a real-size variant: the Diffusers class built on the meta device, through the inverse.

    Shapes are right by construction and nothing is allocated.
    """
    from diffusers import CogVideoXTransformer3DModel

    with torch.device("meta"):
        model = CogVideoXTransformer3DModel(**full_transformer_config(variant, num_layers))
        diffusers_sd = model.state_dict()
        if lora_rank is None:
            return diffusers_to_sat_transformer(diffusers_sd)
        pairs = {}
        for i in range(num_transformer_layers(diffusers_sd)):
            for target in LORA_TARGETS:
                out_features, in_features = diffusers_sd[f"transformer_blocks.{i}.attn1.{target}.weight"].shape
                pairs[f"transformer_blocks.{i}.attn1.{target}"] = (
                    torch.empty(lora_rank, in_features),
                    torch.empty(out_features, lora_rank),
                )
        return diffusers_to_sat_lora(diffusers_sd, pairs, lora_rank)


def write_full_size_run(
    run_dir: str | Path,
    variant: str = "2b",
    *,
    num_layers: int | None = None,
    iteration: int = 1000,
    ema: bool = False,
    lora_rank: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> list[Path]:
    """A real-size SAT run with random weights (N(0, 0.02)), generated tensor by tensor straight in ``dtype``.

    Peak memory is about one copy of the weights in ``dtype`` (3.4 GB for 2B in bf16); no fp32 model is built.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = full_size_sat_meta(variant, num_layers, lora_rank)
    hidden = meta["mixins.patch_embed.text_proj.weight"].shape[0]
    head_dim = meta["mixins.adaln_layer.query_layernorm_list.0.weight"].shape[0]
    written = []
    for offset, tag in enumerate([str(iteration)] + ([f"{iteration}-ema"] if ema else [])):
        generator = torch.Generator().manual_seed(seed + 10 * offset)
        module: OrderedDict[str, Tensor] = OrderedDict()
        for key, tensor in meta.items():
            weights = torch.empty(tensor.shape, dtype=dtype)
            module[SAT_MODEL_PREFIX + key] = weights.normal_(0.0, 0.02, generator=generator)
        extras = [
            (SAT_MODEL_PREFIX, droppable_sat_keys(hidden, head_dim, generator)),
            (SAT_T5_PREFIX, fake_t5_state_dict(generator)),
            (SAT_VAE_PREFIX, fake_sat_vae_state_dict(generator)),
        ]
        for prefix, tensors in extras:
            for key, tensor in tensors.items():
                module[prefix + key] = tensor.to(dtype)
        written.append(save_model_states(run_dir / tag, module, iteration))
        del module
    (run_dir / "latest").write_text(str(iteration))
    return written


# --------------------------------------------------------------------------------------------------------------
# CLI


def _sidecar(run_dir: Path, suffix: str) -> Path:
    return run_dir.parent / f"{run_dir.name}.{suffix}"


def _save_safetensors(path: Path, tensors: StateDict, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    save_file({key: tensor.contiguous() for key, tensor in tensors.items()}, str(path), metadata=metadata)


def _config_json(class_name: str, config: dict) -> str:
    return json.dumps({"_class_name": class_name, **config}, indent=2, sort_keys=True) + "\n"


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--variant", type=click.Choice(VARIANTS), default="2b", show_default=True)
@click.option("--size", type=click.Choice(["tiny", "full"]), default="tiny", show_default=True)
@click.option("--num-layers", type=click.IntRange(min=1), default=None, help="Default: 2 (tiny) or the real count.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--iteration", type=click.IntRange(min=0), default=1000, show_default=True)
@click.option("--ema", is_flag=True, help="Also write {iteration}-ema/ with different weights.")
@click.option("--lora-rank", type=click.IntRange(min=1), default=None, help="Write the SAT LoRA-wrapped layout.")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="bf16", show_default=True)
@click.option("--with-vae", is_flag=True, help="Tiny only: embed a real tiny VAE and write RUN_DIR.3d-vae.pt.")
def main(run_dir: Path, variant, size, num_layers, seed, iteration, ema, lora_rank, dtype, with_vae) -> None:
    """Write a SAT CogVideoX training run to RUN_DIR (plus ground-truth sidecar files for tiny runs)."""
    start = time.perf_counter()
    torch_dtype = DTYPES[dtype]
    if size == "full":
        if with_vae:
            raise click.UsageError("--with-vae is for tiny runs only")
        paths = write_full_size_run(
            run_dir, variant, num_layers=num_layers, iteration=iteration, ema=ema,
            lora_rank=lora_rank, dtype=torch_dtype, seed=seed,
        )
        _sidecar(run_dir, "config.json").write_text(
            _config_json("CogVideoXTransformer3DModel", full_transformer_config(variant, num_layers))
        )
        for path in paths:
            click.echo(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB)")
        click.echo(f"done in {time.perf_counter() - start:.1f}s")
        return

    layers = num_layers or 2
    model = build_tiny_transformer(variant, layers, seed)
    vae_sd = None
    if with_vae:
        vae = build_tiny_vae(seed)
        vae_sd = OrderedDict((key, _round_to(tensor, torch_dtype)) for key, tensor in vae.state_dict().items())
    run = write_sat_run(
        run_dir, model.state_dict(), iteration=iteration, ema=ema, extra_vae_sd=vae_sd,
        dtype=torch_dtype, lora_rank=lora_rank, seed=seed,
    )
    _save_safetensors(_sidecar(run_dir, "expected.safetensors"), run.expected)
    _sidecar(run_dir, "config.json").write_text(
        _config_json("CogVideoXTransformer3DModel", tiny_transformer_config(variant, layers))
    )
    if ema:
        _save_safetensors(_sidecar(run_dir, "expected-ema.safetensors"), run.expected_ema)
    if lora_rank is not None:
        _save_safetensors(_sidecar(run_dir, "expected-merged.safetensors"), run.expected_merged())
        metadata = {
            "lora_adapter_metadata": json.dumps(
                {"transformer.r": lora_rank, "transformer.lora_alpha": SAT_LORA_ALPHA,
                 "transformer.target_modules": list(LORA_TARGETS)}
            )
        }
        lora = lora_pairs_to_diffusers(run.lora_pairs)
        _save_safetensors(_sidecar(run_dir, "expected-lora.safetensors"), lora, metadata)
    if vae_sd is not None:
        # vae_sd was rounded once, so the engine's copy (in --dtype) and the fp32 3d-vae.pt hold the same values.
        write_sat_vae(_sidecar(run_dir, "3d-vae.pt"), vae_sd, num_vae_up_blocks(vae_sd))
        _save_safetensors(_sidecar(run_dir, "vae-expected.safetensors"), vae_sd)
        _sidecar(run_dir, "vae-config.json").write_text(_config_json("AutoencoderKLCogVideoX", tiny_vae_config()))
    elapsed = time.perf_counter() - start
    click.echo(f"wrote {run.model_states} ({len(run.expected)} Diffusers tensors) in {elapsed:.1f}s")


if __name__ == "__main__":
    main()
