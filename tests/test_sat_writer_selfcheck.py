"""Self-check of the SAT checkpoint writer (scripts/make_sat_checkpoint.py), on its own terms.

The writer produces the SAT files that the exporter is tested against, so it must be right independently of the
exporter. These tests check it against the facts page (docs/cogvideox-formats.md): key counts, the documented SAT
name patterns and shapes, the 12-chunk adaLN order and the VAE up-block reversal on values, and a lossless round
trip through a small forward (SAT -> Diffusers) mapping written here, in the test only, straight from the page.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import make_sat_checkpoint as sat_writer  # noqa: E402
from cogvideox_tiny_configs import (  # noqa: E402
    VARIANTS,
    build_tiny_transformer,
    build_tiny_vae,
    full_transformer_config,
    full_vae_config,
    tiny_transformer_config,
    transformer_forward_inputs,
)

# Facts page, section 3: 24 tensors per block plus 16 top-level ones, plus pos_embedding (5B I2V), ofs (1.5 I2V).
EXTRA_DIFFUSERS_KEYS = {"2b": 0, "5b": 0, "5b-i2v": 1, "1.5-5b": 0, "1.5-5b-i2v": 4}
FULL_DIFFUSERS_KEYS = {"2b": 736, "5b": 1024, "5b-i2v": 1025, "1.5-5b": 1024, "1.5-5b-i2v": 1028}
# Section 2: per layer 9 SAT modules with weight and bias (q, k, v fused; both adaLN norms in one).
SAT_KEYS_PER_LAYER = 18

SAT_TRANSFORMER_PATTERNS = [
    r"transformer\.layers\.\d+\.(input_layernorm|post_attention_layernorm)\.(weight|bias)",
    r"transformer\.layers\.\d+\.attention\.(query_key_value|dense)\.(weight|bias)",
    r"transformer\.layers\.\d+\.mlp\.(dense_h_to_4h|dense_4h_to_h)\.(weight|bias)",
    r"mixins\.adaln_layer\.adaLN_modulations\.\d+\.1\.(weight|bias)",
    r"mixins\.adaln_layer\.(query|key)_layernorm_list\.\d+\.(weight|bias)",
    r"transformer\.final_layernorm\.(weight|bias)",
    r"(time_embed|ofs_embed)\.[02]\.(weight|bias)",
    r"mixins\.patch_embed\.(proj|text_proj)\.(weight|bias)",
    r"mixins\.pos_embed\.pos_embedding",
    r"mixins\.final_layer\.(norm_final|linear)\.(weight|bias)",
    r"mixins\.final_layer\.adaLN_modulation\.1\.(weight|bias)",
]
SAT_LORA_PATTERNS = [
    r"transformer\.layers\.\d+\.attention\.(query_key_value|dense)\.original\.(weight|bias)",
    r"transformer\.layers\.\d+\.attention\.query_key_value\.matrix_[AB]\.[012]",
    r"transformer\.layers\.\d+\.attention\.dense\.matrix_[AB]\.0",
]
SAT_DROPPED = {"mixins.pos_embed.freqs_sin", "mixins.pos_embed.freqs_cos", "transformer.position_embeddings.weight"}


# ---------------------------------------------------------------------------------------------------------------
# Forward mappings (SAT -> Diffusers) from the facts page, test-only, deliberately in a different style from the
# writer's inverse.

_LAYER_MODULES = {
    "input_layernorm": "norm1.norm",
    "attention.dense": "attn1.to_out.0",
    "post_attention_layernorm": "norm2.norm",
    "mlp.dense_h_to_4h": "ff.net.0.proj",
    "mlp.dense_4h_to_h": "ff.net.2",
}
_TOP_LEVEL_MODULES = {
    "transformer.final_layernorm": "norm_final",
    "time_embed.0": "time_embedding.linear_1",
    "time_embed.2": "time_embedding.linear_2",
    "ofs_embed.0": "ofs_embedding.linear_1",
    "ofs_embed.2": "ofs_embedding.linear_2",
    "mixins.patch_embed.proj": "patch_embed.proj",
    "mixins.patch_embed.text_proj": "patch_embed.text_proj",
    "mixins.final_layer.norm_final": "norm_out.norm",
    "mixins.final_layer.linear": "proj_out",
    "mixins.final_layer.adaLN_modulation.1": "norm_out.linear",
}


def sat_to_diffusers(sat: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}

    def put(key, tensor):
        assert key not in out, f"two SAT keys produce {key}"
        out[key] = tensor

    for key, tensor in sat.items():
        if key == "mixins.pos_embed.pos_embedding":
            put("patch_embed.pos_embedding", tensor)
        elif m := re.fullmatch(r"transformer\.layers\.(\d+)\.attention\.query_key_value\.(weight|bias)", key):
            q, k, v = tensor.chunk(3, dim=0)
            put(f"transformer_blocks.{m[1]}.attn1.to_q.{m[2]}", q)
            put(f"transformer_blocks.{m[1]}.attn1.to_k.{m[2]}", k)
            put(f"transformer_blocks.{m[1]}.attn1.to_v.{m[2]}", v)
        elif m := re.fullmatch(r"transformer\.layers\.(\d+)\.(.+)\.(weight|bias)", key):
            put(f"transformer_blocks.{m[1]}.{_LAYER_MODULES[m[2]]}.{m[3]}", tensor)
        elif m := re.fullmatch(r"mixins\.adaln_layer\.adaLN_modulations\.(\d+)\.1\.(weight|bias)", key):
            c = tensor.chunk(12, dim=0)
            put(f"transformer_blocks.{m[1]}.norm1.linear.{m[2]}", torch.cat([c[0], c[1], c[2], c[6], c[7], c[8]]))
            put(f"transformer_blocks.{m[1]}.norm2.linear.{m[2]}", torch.cat([c[3], c[4], c[5], c[9], c[10], c[11]]))
        elif m := re.fullmatch(r"mixins\.adaln_layer\.(query|key)_layernorm_list\.(\d+)\.(weight|bias)", key):
            norm = "norm_q" if m[1] == "query" else "norm_k"
            put(f"transformer_blocks.{m[2]}.attn1.{norm}.{m[3]}", tensor)
        else:
            module, part = key.rsplit(".", 1)
            put(f"{_TOP_LEVEL_MODULES[module]}.{part}", tensor)
    return out


def sat_vae_to_diffusers(sat: dict[str, torch.Tensor], num_up_blocks: int) -> dict[str, torch.Tensor]:
    """Facts page section 5, applied literally: the plain renames, then the reversed up index, loss.* dropped."""
    out = {}
    for key, tensor in sat.items():
        if key.startswith("loss."):
            continue
        for old, new in [
            ("block.", "resnets."),
            ("down.", "down_blocks."),
            ("downsample", "downsamplers.0"),
            ("upsample", "upsamplers.0"),
            ("nin_shortcut", "conv_shortcut"),
            ("encoder.mid.block_1", "encoder.mid_block.resnets.0"),
            ("encoder.mid.block_2", "encoder.mid_block.resnets.1"),
            ("decoder.mid.block_1", "decoder.mid_block.resnets.0"),
            ("decoder.mid.block_2", "decoder.mid_block.resnets.1"),
        ]:
            key = key.replace(old, new)
        key = re.sub(r"^decoder\.up\.(\d+)\.", lambda m: f"decoder.up_blocks.{num_up_blocks - 1 - int(m[1])}.", key)
        out[key] = tensor
    return out


def assert_same_tensors(actual: dict, expected: dict) -> None:
    assert set(actual) == set(expected), (sorted(set(actual) ^ set(expected)))[:10]
    for key in expected:
        assert actual[key].shape == expected[key].shape, key
        assert torch.equal(actual[key].float(), expected[key].float()), key


def load_model_states(path: Path) -> dict:
    # SAT files carry a numpy RNG state, which the weights-only unpickler refuses.
    return torch.load(path, map_location="cpu", weights_only=False)


def split_engine(module: dict) -> tuple[dict, dict]:
    """The transformer (prefix removed) and everything else, by prefix only."""
    prefix = sat_writer.SAT_MODEL_PREFIX
    transformer = {key[len(prefix):]: value for key, value in module.items() if key.startswith(prefix)}
    others = {key: value for key, value in module.items() if not key.startswith(prefix)}
    return transformer, others


# ---------------------------------------------------------------------------------------------------------------
# Configs


STRUCTURAL_FLAGS = ["use_rotary_positional_embeddings", "use_learned_positional_embeddings", "patch_size",
                    "patch_size_t", "patch_bias", "attention_bias", "activation_fn"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_config_keeps_structure_and_runs(variant):
    tiny, full = tiny_transformer_config(variant), full_transformer_config(variant)
    assert {flag: tiny[flag] for flag in STRUCTURAL_FLAGS} == {flag: full[flag] for flag in STRUCTURAL_FLAGS}
    assert (tiny["ofs_embed_dim"] is None) == (full["ofs_embed_dim"] is None)
    assert tiny["in_channels"] // tiny["out_channels"] == full["in_channels"] // full["out_channels"]
    assert tiny["num_layers"] >= 2

    model = build_tiny_transformer(variant, num_layers=2, seed=0)
    inputs = transformer_forward_inputs(tiny)
    with torch.no_grad():
        sample = model(**inputs).sample
    latents = inputs["hidden_states"]
    assert sample.shape == (*latents.shape[:2], tiny["out_channels"], *latents.shape[3:])
    assert torch.isfinite(sample).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_full_configs_have_the_documented_key_counts(variant):
    from diffusers import CogVideoXTransformer3DModel

    with torch.device("meta"):
        diffusers_sd = CogVideoXTransformer3DModel(**full_transformer_config(variant)).state_dict()
    assert len(diffusers_sd) == FULL_DIFFUSERS_KEYS[variant]
    layers = full_transformer_config(variant)["num_layers"]
    sat = sat_writer.diffusers_to_sat_transformer(diffusers_sd)
    assert len(sat) == SAT_KEYS_PER_LAYER * layers + 16 + EXTRA_DIFFUSERS_KEYS[variant]


def test_full_vae_has_436_tensors():
    from diffusers import AutoencoderKLCogVideoX

    with torch.device("meta"):
        vae = AutoencoderKLCogVideoX(**full_vae_config("2b"))
    assert len(vae.state_dict()) == 436
    assert sat_writer.num_vae_up_blocks(vae.state_dict()) == 4


def test_full_2b_shapes_come_from_the_real_class():
    meta = sat_writer.full_size_sat_meta("2b")
    assert len(meta) == SAT_KEYS_PER_LAYER * 30 + 16
    assert sum(tensor.numel() for tensor in meta.values()) == 1_693_783_872  # 3.39 GB in bf16
    assert meta["transformer.layers.29.attention.query_key_value.weight"].shape == (3 * 1920, 1920)
    assert meta["mixins.adaln_layer.adaLN_modulations.0.1.weight"].shape == (12 * 1920, 512)
    assert meta["mixins.patch_embed.proj.weight"].shape == (1920, 16, 2, 2)
    assert meta["mixins.patch_embed.text_proj.weight"].shape == (1920, 4096)
    assert meta["mixins.final_layer.adaLN_modulation.1.weight"].shape == (2 * 1920, 512)
    assert "mixins.pos_embed.pos_embedding" not in meta


# ---------------------------------------------------------------------------------------------------------------
# Transformer inverse


@pytest.mark.parametrize("num_layers", [2, 3])
@pytest.mark.parametrize("variant", VARIANTS)
def test_transformer_inverse(variant, num_layers):
    config = tiny_transformer_config(variant, num_layers)
    diffusers_sd = build_tiny_transformer(variant, num_layers, seed=num_layers).state_dict()
    sat = sat_writer.diffusers_to_sat_transformer(diffusers_sd)

    extra = EXTRA_DIFFUSERS_KEYS[variant]
    assert len(diffusers_sd) == 24 * num_layers + 16 + extra
    assert len(sat) == SAT_KEYS_PER_LAYER * num_layers + 16 + extra
    for key in sat:
        assert any(re.fullmatch(pattern, key) for pattern in SAT_TRANSFORMER_PATTERNS), key
    assert ("mixins.pos_embed.pos_embedding" in sat) == config["use_learned_positional_embeddings"]
    assert ("ofs_embed.0.weight" in sat) == (config["ofs_embed_dim"] is not None)

    # Documented shapes (section 2), with this config's widths.
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    time_dim, channels = config["time_embed_dim"], config["in_channels"]
    last = num_layers - 1
    assert sat[f"transformer.layers.{last}.attention.query_key_value.weight"].shape == (3 * hidden, hidden)
    assert sat[f"transformer.layers.{last}.attention.query_key_value.bias"].shape == (3 * hidden,)
    assert sat[f"mixins.adaln_layer.adaLN_modulations.{last}.1.weight"].shape == (12 * hidden, time_dim)
    assert sat[f"mixins.adaln_layer.query_layernorm_list.{last}.weight"].shape == (config["attention_head_dim"],)
    assert sat["mixins.final_layer.adaLN_modulation.1.weight"].shape == (2 * hidden, time_dim)
    assert sat["mixins.patch_embed.text_proj.weight"].shape == (hidden, config["text_embed_dim"])
    if config["patch_size_t"] is None:
        assert sat["mixins.patch_embed.proj.weight"].shape == (hidden, channels, 2, 2)
    else:
        assert sat["mixins.patch_embed.proj.weight"].shape == (hidden, channels * 8)
        assert "mixins.patch_embed.proj.bias" in sat  # 1.5's Linear keeps its bias despite patch_bias=False

    assert_same_tensors(sat_to_diffusers(sat), diffusers_sd)


@pytest.mark.parametrize("variant", ["2b", "1.5-5b-i2v"])
def test_adaln_chunks_and_qkv_are_in_sat_order(variant):
    diffusers_sd = build_tiny_transformer(variant, 2, seed=5).state_dict()
    sat = sat_writer.diffusers_to_sat_transformer(diffusers_sd)
    for layer in range(2):
        for part in ("weight", "bias"):
            norm1 = diffusers_sd[f"transformer_blocks.{layer}.norm1.linear.{part}"].chunk(6)
            norm2 = diffusers_sd[f"transformer_blocks.{layer}.norm2.linear.{part}"].chunk(6)
            chunks = sat[f"mixins.adaln_layer.adaLN_modulations.{layer}.1.{part}"].chunk(12)
            # SAT: shift, scale, gate (attention); shift, scale, gate (MLP); then the same for the text stream.
            expected = [norm1[0], norm1[1], norm1[2], norm2[0], norm2[1], norm2[2],
                        norm1[3], norm1[4], norm1[5], norm2[3], norm2[4], norm2[5]]
            for index, (got, want) in enumerate(zip(chunks, expected)):
                assert torch.equal(got, want), f"layer {layer} {part} chunk {index}"

            q, k, v = sat[f"transformer.layers.{layer}.attention.query_key_value.{part}"].chunk(3)
            assert torch.equal(q, diffusers_sd[f"transformer_blocks.{layer}.attn1.to_q.{part}"])
            assert torch.equal(k, diffusers_sd[f"transformer_blocks.{layer}.attn1.to_k.{part}"])
            assert torch.equal(v, diffusers_sd[f"transformer_blocks.{layer}.attn1.to_v.{part}"])
        # Randomized weights: the two norms of a block differ, so a norm1/norm2 swap cannot pass.
        assert not torch.equal(diffusers_sd[f"transformer_blocks.{layer}.norm1.norm.weight"],
                               diffusers_sd[f"transformer_blocks.{layer}.norm2.norm.weight"])


def test_inverse_refuses_keys_it_cannot_name():
    diffusers_sd = dict(build_tiny_transformer("5b", 2).state_dict())
    diffusers_sd["transformer_blocks.0.attn1.add_q_proj.weight"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="add_q_proj"):
        sat_writer.diffusers_to_sat_transformer(diffusers_sd)


# ---------------------------------------------------------------------------------------------------------------
# VAE inverse


def test_vae_inverse_reverses_up_blocks():
    vae_sd = build_tiny_vae(seed=3).state_dict()
    num_up = sat_writer.num_vae_up_blocks(vae_sd)
    assert num_up == 3
    sat = sat_writer.diffusers_to_sat_vae(vae_sd, num_up)

    up_weight = "decoder.{}.block.0.conv1.conv.weight"
    assert torch.equal(sat[up_weight.format("up.2")], vae_sd["decoder.up_blocks.0.resnets.0.conv1.conv.weight"])
    assert torch.equal(sat[up_weight.format("up.0")], vae_sd["decoder.up_blocks.2.resnets.0.conv1.conv.weight"])
    assert torch.equal(sat[up_weight.format("up.1")], vae_sd["decoder.up_blocks.1.resnets.0.conv1.conv.weight"])
    assert sat[up_weight.format("up.2")].shape != sat[up_weight.format("up.0")].shape
    assert "decoder.up.0.upsample.conv.weight" not in sat  # the last block Diffusers runs has no upsampler
    assert torch.equal(sat["decoder.up.2.upsample.conv.weight"], vae_sd["decoder.up_blocks.0.upsamplers.0.conv.weight"])
    assert torch.equal(sat["encoder.mid.block_2.conv1.conv.weight"],
                       vae_sd["encoder.mid_block.resnets.1.conv1.conv.weight"])
    assert torch.equal(sat["decoder.mid.block_1.norm1.norm_layer.weight"],
                       vae_sd["decoder.mid_block.resnets.0.norm1.norm_layer.weight"])
    assert torch.equal(sat["encoder.down.1.block.0.nin_shortcut.weight"],
                       vae_sd["encoder.down_blocks.1.resnets.0.conv_shortcut.weight"])
    assert torch.equal(sat["encoder.down.0.downsample.conv.weight"],
                       vae_sd["encoder.down_blocks.0.downsamplers.0.conv.weight"])

    diffusers_only = ("down_blocks", "up_blocks", "resnets", "downsamplers", "upsamplers", "conv_shortcut", "mid_block")
    assert not [key for key in sat if any(token in key for token in diffusers_only)]
    loss = [key for key in sat if key.startswith("loss.")]
    assert "loss.logvar" in loss and any(key.startswith("loss.discriminator.") for key in loss)
    assert len(sat) == len(vae_sd) + len(loss)
    assert_same_tensors(sat_vae_to_diffusers(sat, num_up), vae_sd)


def test_write_sat_vae(tmp_path):
    vae_sd = build_tiny_vae(seed=4).state_dict()
    path = sat_writer.write_sat_vae(tmp_path / "vae" / "3d-vae.pt", vae_sd, 3)
    stored = torch.load(path, weights_only=False)["state_dict"]
    assert all(tensor.dtype == torch.float32 for tensor in stored.values())
    assert_same_tensors(sat_vae_to_diffusers(stored, 3), vae_sd)


# ---------------------------------------------------------------------------------------------------------------
# Written runs


@pytest.mark.parametrize("variant", VARIANTS)
def test_written_run_has_the_sat_layout(tmp_path, variant):
    diffusers_sd = build_tiny_transformer(variant, 3, seed=11).state_dict()
    run = sat_writer.write_sat_run(tmp_path / "run", diffusers_sd, iteration=1000, ema=True)

    assert (tmp_path / "run" / "latest").read_text().strip() == "1000"
    states = load_model_states(tmp_path / "run" / "1000" / "mp_rank_00_model_states.pt")
    assert states["iteration"] == 1000
    assert {"client_lr_scheduler", "random_rng_state", "torch_rng_state", "np_rng_state"} <= set(states)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "run" / "1000" / "mp_rank_00_model_states.pt", weights_only=True)

    transformer, others = split_engine(states["module"])
    assert all(tensor.dtype == torch.bfloat16 for tensor in states["module"].values())
    assert SAT_DROPPED <= set(transformer)
    assert any(key.startswith("conditioner.embedders.0.transformer.encoder.") for key in others)
    assert "conditioner.embedders.0.transformer.shared.weight" in others
    assert any(key.startswith("first_stage_model.decoder.up.") for key in others)
    assert all(key.startswith(("conditioner.embedders.0.transformer.", "first_stage_model.")) for key in others)

    kept = {key: value for key, value in transformer.items() if key not in SAT_DROPPED}
    assert_same_tensors(sat_to_diffusers(kept), run.expected)
    # The ground truth is the original rounded to bf16, nothing more.
    for key, tensor in diffusers_sd.items():
        assert torch.equal(run.expected[key], tensor.to(torch.bfloat16).float()), key

    ema_states = load_model_states(tmp_path / "run" / "1000-ema" / "mp_rank_00_model_states.pt")
    ema_transformer, _ = split_engine(ema_states["module"])
    ema_kept = {key: value for key, value in ema_transformer.items() if key not in SAT_DROPPED}
    assert_same_tensors(sat_to_diffusers(ema_kept), run.expected_ema)
    differing = [key for key in run.expected if not torch.equal(run.expected[key], run.expected_ema[key])]
    assert len(differing) == len(run.expected)


def test_run_without_numpy_state_loads_weights_only(tmp_path):
    run = sat_writer.write_sat_run(
        tmp_path / "run", build_tiny_transformer("2b").state_dict(), numpy_rng=False, dtype=torch.float32,
        extra_t5=False, extra_vae_sd={}, drop_keys=False,
    )
    states = torch.load(run.model_states, weights_only=True)
    assert "np_rng_state" not in states
    assert all(key.startswith(sat_writer.SAT_MODEL_PREFIX) for key in states["module"])
    transformer, _ = split_engine(states["module"])
    assert all(tensor.dtype == torch.float32 for tensor in transformer.values())
    # fp32 storage: nothing is rounded, the ground truth is the model itself.
    assert_same_tensors(sat_to_diffusers(transformer), build_tiny_transformer("2b").state_dict())


def test_real_vae_inside_the_engine(tmp_path):
    vae_sd = build_tiny_vae(seed=2).state_dict()
    run = sat_writer.write_sat_run(tmp_path / "run", build_tiny_transformer("5b").state_dict(), extra_vae_sd=vae_sd)
    _, others = split_engine(load_model_states(run.model_states)["module"])
    prefix = sat_writer.SAT_VAE_PREFIX
    vae = {key[len(prefix):]: value for key, value in others.items() if key.startswith(prefix)}
    assert not any(key.startswith("loss.") for key in vae)
    rounded = {key: value.to(torch.bfloat16) for key, value in vae_sd.items()}
    assert_same_tensors(sat_vae_to_diffusers(vae, 3), rounded)


@pytest.mark.parametrize("variant", ["2b", "5b-i2v"])
def test_lora_run(tmp_path, variant):
    rank, layers = 3, 2
    run = sat_writer.write_sat_run(
        tmp_path / "run", build_tiny_transformer(variant, layers).state_dict(), lora_rank=rank, ema=True
    )
    transformer, _ = split_engine(load_model_states(run.model_states)["module"])
    transformer = {key: value.float() for key, value in transformer.items() if key not in SAT_DROPPED}
    for key in transformer:
        assert any(re.fullmatch(p, key) for p in SAT_TRANSFORMER_PATTERNS + SAT_LORA_PATTERNS), key
    assert len(transformer) == (SAT_KEYS_PER_LAYER + 8) * layers + 16 + EXTRA_DIFFUSERS_KEYS[variant]
    assert not any(re.fullmatch(r"transformer\.layers\.\d+\.attention\.(query_key_value|dense)\.(weight|bias)", key)
                   for key in transformer)

    hidden = run.expected["patch_embed.text_proj.weight"].shape[0]
    merged = run.expected_merged()
    for layer in range(layers):
        base = f"transformer.layers.{layer}.attention"
        block = f"transformer_blocks.{layer}.attn1"
        assert transformer[f"{base}.query_key_value.matrix_A.2"].shape == (rank, hidden)
        assert transformer[f"{base}.query_key_value.matrix_B.2"].shape == (hidden, rank)
        q, k, v = transformer[f"{base}.query_key_value.original.weight"].chunk(3)
        for j, (name, weight) in enumerate([("to_q", q), ("to_k", k), ("to_v", v)]):
            assert torch.equal(weight, run.expected[f"{block}.{name}.weight"])
            lora_a = transformer[f"{base}.query_key_value.matrix_A.{j}"]
            delta = transformer[f"{base}.query_key_value.matrix_B.{j}"] @ lora_a
            torch.testing.assert_close(merged[f"{block}.{name}.weight"], weight + delta / rank)
            assert delta.abs().max() > 0
        dense = transformer[f"{base}.dense.original.weight"]
        assert torch.equal(dense, run.expected[f"{block}.to_out.0.weight"])
        assert torch.equal(transformer[f"{base}.dense.original.bias"], run.expected[f"{block}.to_out.0.bias"])
        delta = transformer[f"{base}.dense.matrix_B.0"] @ transformer[f"{base}.dense.matrix_A.0"]
        torch.testing.assert_close(merged[f"{block}.to_out.0.weight"], dense + delta / rank)

    ema, _ = split_engine(load_model_states(run.ema_model_states)["module"])
    adapter = "transformer.layers.0.attention.dense.matrix_A.0"
    assert torch.equal(ema[adapter].float(), run.lora_pairs_ema["transformer_blocks.0.attn1.to_out.0"][0])
    assert not torch.equal(ema[adapter].float(), transformer[adapter])


def test_cli_tiny_run_writes_ground_truth(tmp_path):
    from click.testing import CliRunner
    from diffusers import CogVideoXTransformer3DModel
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        sat_writer.main, [str(run_dir), "--variant", "1.5-5b-i2v", "--num-layers", "3", "--lora-rank", "2"]
    )
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run.config.json").read_text())
    assert config.pop("_class_name") == "CogVideoXTransformer3DModel"
    model = CogVideoXTransformer3DModel.from_config(config)
    expected = load_file(tmp_path / "run.expected.safetensors")
    assert set(expected) == set(model.state_dict())
    assert all(tensor.dtype == torch.float32 for tensor in expected.values())

    transformer, _ = split_engine(load_model_states(run_dir / "1000" / "mp_rank_00_model_states.pt")["module"])
    base = {key.replace(".original.", "."): value for key, value in transformer.items()
            if key not in SAT_DROPPED and ".matrix_" not in key}
    assert_same_tensors(sat_to_diffusers(base), expected)

    lora = load_file(tmp_path / "run.expected-lora.safetensors")
    assert len(lora) == 3 * 4 * 2
    assert torch.equal(lora["transformer.transformer_blocks.2.attn1.to_v.lora_B.weight"],
                       transformer["transformer.layers.2.attention.query_key_value.matrix_B.2"].float())
    merged = load_file(tmp_path / "run.expected-merged.safetensors")
    to_q = "transformer_blocks.0.attn1.to_q.weight"
    assert not torch.equal(merged[to_q], expected[to_q])
