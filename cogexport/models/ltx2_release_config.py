"""The config JSON an LTX-2 release file keeps in its safetensors metadata ("config": {"transformer", "vae", "audio_vae",
"vocoder"} sections in the LTX-2 repository's own names and order), made from the Diffusers configs of the models
written into the file, and the release's transformer section read back into a Diffusers config.

Key names, order and the constant values are those of the LTX-2 repository's own release (checked on the file it
writes, ../shared/fixtures/ltx2): json.dumps of the result is that file's metadata string. The 2.3 and later keys
(gated attention, the prompt modulation, the feed-forward biases) are added after the 2.0 ones when a model has them.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import CogExportError

# the values every LTX-2 release's transformer section holds, whatever the size (its original class's own settings)
_TRANSFORMER_CONSTANTS = {
    "_class_name": "AVTransformer3DModel", "dropout": 0.0, "attention_bias": True, "num_vector_embeds": None,
    "activation_fn": "gelu-approximate", "num_embeds_ada_norm": 1000, "use_linear_projection": False,
    "only_cross_attention": False, "cross_attention_norm": True, "double_self_attention": False,
    "upcast_attention": False, "standardization_norm": "rms_norm", "norm_elementwise_affine": False,
    "qk_norm": "rms_norm", "positional_embedding_type": "rope", "use_audio_video_cross_attention": True,
    "share_ff": False, "av_cross_ada_norm": True, "use_middle_indices_grid": True, "attention_type": "default",
}
# Diffusers name -> release name, where only the name differs
_SAME_MEANING = {"attention_bias": "attention_bias", "activation_fn": "activation_fn",
                 "norm_elementwise_affine": "norm_elementwise_affine"}
_SIZES = ("num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers",
          "cross_attention_dim", "caption_channels", "norm_eps", "audio_num_attention_heads",
          "audio_attention_head_dim", "audio_in_channels", "audio_out_channels", "audio_cross_attention_dim")
_DOWNSAMPLE = {"spatial": "compress_space_res", "temporal": "compress_time_res", "spatiotemporal": "compress_all_res"}
_UPSAMPLE = {"spatial": "compress_space", "temporal": "compress_time", "spatiotemporal": "compress_all"}
_STFT_FILTER_LENGTH = 1024  # the audio preprocessing's STFT window: fixed in every release, not in Diffusers' config


def release_config(transformer: Mapping[str, Any], components: Mapping[str, Mapping[str, Any]]) -> dict:
    """The release's config JSON for a transformer config and the configs of the models written beside it."""
    config: dict[str, Any] = {"transformer": _transformer_section(transformer, components.get("connectors"))}
    makers = {"vae": _vae_section, "audio_vae": _audio_vae_section, "vocoder": _vocoder_section}
    for name, make in makers.items():
        if name in components:
            config[name] = make(components[name])
    return config


def _transformer_section(config: Mapping[str, Any], connectors: Mapping[str, Any] | None) -> dict:
    section = {**_TRANSFORMER_CONSTANTS, **{ours: config[theirs] for theirs, ours in _SAME_MEANING.items()}}
    section.update({name: config[name] for name in _SIZES})
    section.update({
        "positional_embedding_theta": config["rope_theta"],
        "positional_embedding_max_pos": [config["pos_embed_max_pos"], config["base_height"], config["base_width"]],
        "audio_positional_embedding_max_pos": [config["audio_pos_embed_max_pos"]],
        "timestep_scale_multiplier": config["timestep_scale_multiplier"],
        "av_ca_timestep_scale_multiplier": config["cross_attn_timestep_scale_multiplier"],
        "rope_type": config["rope_type"],
        "frequencies_precision": "float64" if config["rope_double_precision"] else "float32",
    })
    if connectors is not None:
        section.update(_connector_keys(connectors))
    section.update(_later_keys(config, connectors))
    return section


def _connector_keys(connectors: Mapping[str, Any]) -> dict:
    keys = {"connector_num_attention_heads": connectors["video_connector_num_attention_heads"],
            "connector_attention_head_dim": connectors["video_connector_attention_head_dim"],
            "connector_num_layers": connectors["video_connector_num_layers"],
            "connector_positional_embedding_max_pos": [connectors["connector_rope_base_seq_len"]]}
    audio = {"audio_connector_num_attention_heads": connectors["audio_connector_num_attention_heads"],
             "audio_connector_attention_head_dim": connectors["audio_connector_attention_head_dim"]}
    if list(audio.values()) != [keys["connector_num_attention_heads"], keys["connector_attention_head_dim"]]:
        keys.update(audio)  # 2.3 and later: an audio connector of its own width
    return keys


def _later_keys(config: Mapping[str, Any], connectors: Mapping[str, Any] | None) -> dict:
    """The flags of 2.3 and later, where the model has their layers (a 2.0 release writes none of them)."""
    keys: dict[str, Any] = {}
    if config.get("gated_attn") or config.get("cross_attn_mod"):
        keys.update(apply_gated_attention=bool(config.get("gated_attn")),
                    cross_attention_adaln=bool(config.get("cross_attn_mod")),
                    caption_proj_before_connector=not config.get("use_prompt_embeddings", True))
        if connectors is not None:
            keys["connector_apply_gated_attention"] = bool(connectors.get("video_gated_attn"))
    if not config.get("ff_bias", True) or config.get("use_keyframes_abs_pos_embedding"):
        keys.update(ff_bias=bool(config.get("ff_bias", True)), audio_ff_bias=bool(config.get("audio_ff_bias", True)),
                    use_keyframes_abs_pos_embedding=bool(config.get("use_keyframes_abs_pos_embedding")))
    return keys


def _vae_section(config: Mapping[str, Any]) -> dict:
    return {
        "_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": config["in_channels"],
        "out_channels": config["out_channels"], "latent_channels": config["latent_channels"],
        "encoder_blocks": _encoder_blocks(config), "decoder_blocks": _decoder_blocks(config),
        "scaling_factor": config["scaling_factor"], "norm_layer": "pixel_norm", "patch_size": config["patch_size"],
        "latent_log_var": "uniform", "use_quant_conv": False, "causal_decoder": config["decoder_causal"],
        "timestep_conditioning": config["timestep_conditioning"], "normalize_latent_channels": False,
        "encoder_spatial_padding_mode": config["encoder_spatial_padding_mode"],
        "decoder_spatial_padding_mode": config["decoder_spatial_padding_mode"],
    }


def _listed(value: Any, count: int) -> list:
    """A per-block setting as a list (Diffusers' configs may give one value for every block)."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * count


def _encoder_blocks(config: Mapping[str, Any]) -> list:
    """The encoder as the release lists it: each level's residual blocks and downsampler (its width multiplier), then
    the mid block (Diffusers' last layers_per_block entry)."""
    layers, widths = list(config["layers_per_block"]), list(config["block_out_channels"])
    kinds = _listed(config["downsample_type"], len(widths))
    blocks: list = []
    width = config["latent_channels"]
    for level, (out, kind) in enumerate(zip(widths, kinds)):
        blocks.append(["res_x", {"num_layers": layers[level]}])
        blocks.append([_DOWNSAMPLE[kind], {"multiplier": out // width}])
        width = out
    return blocks + [["res_x", {"num_layers": layers[-1]}]]


def _decoder_blocks(config: Mapping[str, Any]) -> list:
    """The decoder as the release lists it: from the output side in (the mid block last), which is the order of
    Diffusers' per-block lists, except upsample_type, which Diffusers indexes from the mid block out."""
    layers = list(config["decoder_layers_per_block"])
    levels = len(layers) - 1
    noise = _listed(config["decoder_inject_noise"], levels + 1)
    residual = _listed(config["upsample_residual"], levels)
    factor = _listed(config["upsample_factor"], levels)
    kinds = list(reversed(_listed(config["upsample_type"], levels)))
    blocks: list = []
    for level in range(levels):
        blocks.append(["res_x", {"num_layers": layers[level], "inject_noise": noise[level]}])
        blocks.append([_UPSAMPLE[kinds[level]], {"residual": residual[level], "multiplier": factor[level]}])
    return blocks + [["res_x", {"num_layers": layers[levels], "inject_noise": noise[levels]}]]


def _audio_vae_section(config: Mapping[str, Any]) -> dict:
    ddconfig = {
        "double_z": config["double_z"], "mel_bins": config["mel_bins"], "z_channels": config["latent_channels"],
        "resolution": config["resolution"], "in_channels": config["in_channels"],
        "out_ch": config["output_channels"], "ch": config["base_channels"], "ch_mult": list(config["ch_mult"]),
        "num_res_blocks": config["num_res_blocks"], "attn_resolutions": list(config["attn_resolutions"] or []),
        "dropout": config["dropout"], "mid_block_add_attention": config["mid_block_add_attention"],
        "norm_type": config["norm_type"], "causality_axis": config["causality_axis"],
    }
    return {"model": {"params": {"ddconfig": ddconfig, "sampling_rate": config["sample_rate"]}},
            "preprocessing": {"stft": {"filter_length": _STFT_FILTER_LENGTH, "hop_length": config["mel_hop_length"],
                                       "causal": config["is_causal"]},
                              "mel": {"n_mel_channels": config["mel_bins"]}}}


def _vocoder_section(config: Mapping[str, Any]) -> dict:
    if "bwe_hidden_channels" in config:
        return _vocoder_with_bwe_section(config)
    return {"resblock_kernel_sizes": list(config["resnet_kernel_sizes"]),
            "upsample_rates": list(config["upsample_factors"]),
            "upsample_kernel_sizes": list(config["upsample_kernel_sizes"]),
            "resblock_dilation_sizes": [list(d) for d in config["resnet_dilations"]],
            "upsample_initial_channel": config["hidden_channels"], "stereo": config["out_channels"] == 2,
            "resblock": "1", "output_sample_rate": config["output_sampling_rate"]}


def _vocoder_with_bwe_section(config: Mapping[str, Any]) -> dict:
    """2.3's and later's vocoder with bandwidth extension (LTX2VocoderWithBWE): the two generators' sections nested
    as ltx_core's VocoderConfigurator reads them ("vocoder" and "bwe", the latter with the mel front end and the two
    sampling rates). No 2.3 release was at hand: the keys are those its reader takes, in the order it reads them."""
    if config["window_length"] != config["filter_length"]:
        raise CogExportError(f"an LTX-2 release's vocoder has one STFT length (n_fft, its window too); this "
                             f"LTX2VocoderWithBWE's window_length {config['window_length']} is not its filter_length "
                             f"{config['filter_length']}")
    bwe = {**_generator_keys(config, "bwe_"), "input_sampling_rate": config["input_sampling_rate"],
           "output_sampling_rate": config["output_sampling_rate"], "n_fft": config["filter_length"],
           "hop_length": config["hop_length"], "num_mels": config["num_mel_channels"]}
    return {"vocoder": _generator_keys(config, ""), "bwe": bwe}


def _generator_keys(config: Mapping[str, Any], prefix: str) -> dict:
    """One generator of a vocoder with bandwidth extension (BigVGAN-like: anti-aliased SnakeBeta residual blocks)."""
    return {"resblock_kernel_sizes": list(config[f"{prefix}resnet_kernel_sizes"]),
            "upsample_rates": list(config[f"{prefix}upsample_factors"]),
            "upsample_kernel_sizes": list(config[f"{prefix}upsample_kernel_sizes"]),
            "resblock_dilation_sizes": [list(d) for d in config[f"{prefix}resnet_dilations"]],
            "upsample_initial_channel": config[f"{prefix}hidden_channels"],
            "resblock": "AMP1", "stereo": config[f"{prefix}out_channels"] == 2,
            "activation": config[f"{prefix}act_fn"], "use_tanh_at_final": config[f"{prefix}final_act_fn"] == "tanh",
            "use_bias_at_final": config[f"{prefix}final_bias"]}


# -- the way in: the release's transformer section as LTX2VideoTransformer3DModel's config ---------------------------
def transformer_config(original: Mapping[str, Any], where: str) -> dict:
    """The Diffusers config of the transformer a release's config section describes."""
    try:
        config: dict[str, Any] = {name: original[name] for name in _SIZES}
        video_pos, audio_pos = original["positional_embedding_max_pos"], original["audio_positional_embedding_max_pos"]
        config.update(
            pos_embed_max_pos=video_pos[0], base_height=video_pos[1], base_width=video_pos[2],
            audio_pos_embed_max_pos=audio_pos[0], rope_theta=original["positional_embedding_theta"],
            timestep_scale_multiplier=original["timestep_scale_multiplier"],
            cross_attn_timestep_scale_multiplier=original["av_ca_timestep_scale_multiplier"],
            rope_type=original["rope_type"], rope_double_precision=original["frequencies_precision"] == "float64")
    except (KeyError, TypeError, IndexError):
        raise CogExportError(f"{where} is not a complete LTX-2 transformer config (sizes, positional embedding, "
                             "timestep scales, rope type)") from None
    config.update({theirs: original[ours] for theirs, ours in _SAME_MEANING.items() if ours in original})
    config.update(_later_config(original))
    return config


def _later_config(original: Mapping[str, Any]) -> dict:
    config: dict[str, Any] = {}
    if "apply_gated_attention" in original:
        gated, adaln = bool(original["apply_gated_attention"]), bool(original.get("cross_attention_adaln"))
        config.update(gated_attn=gated, audio_gated_attn=gated, cross_attn_mod=adaln, audio_cross_attn_mod=adaln,
                      use_prompt_embeddings=not original.get("caption_proj_before_connector", adaln))
    for name in ("ff_bias", "audio_ff_bias", "use_keyframes_abs_pos_embedding"):
        if name in original:
            config[name] = bool(original[name])
    return config
