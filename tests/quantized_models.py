"""Tiny Diffusers transformers whose widths suit every GGML type (rows of 256 or multiples of it, as the K types
need), their original-layout tensors (cogexport's key map run backwards: these are only the inputs; Diffusers
judges the result), forward inputs, and the judge of the original names for each family: Diffusers' own single-file
converter where it has one (for HunyuanVideo 1.5, which it lacks, the conversion script's facts).

``FAMILIES`` are the families every quantized-output test runs on; ``MORE_FAMILIES`` the others with quantized
outputs, which tests/test_quantized_families.py judges the same ways at fewer quantization types (``NO_LOADER_FAMILIES``
among them: the families whose GGUF files no loader reads, judged by the forward of their weights mapped back)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from fixtures import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
from tiny_models import randomize_  # noqa: E402

from cogexport.keymap.plan import plan_translation  # noqa: E402
from cogexport.keymap.table import load_table  # noqa: E402
from cogexport.lazy import LazyTensor  # noqa: E402

HIDDEN = 256  # two heads of 128: every Linear's rows hold whole K blocks


def diffusers_converter(name: str) -> Callable[[], Callable[[dict], dict]]:
    """Diffusers' single-file converter ``name`` (diffusers.loaders.single_file_utils), as it is."""
    def converter() -> Callable[[dict], dict]:
        from diffusers.loaders import single_file_utils

        return getattr(single_file_utils, name)
    return converter


def _hunyuanvideo_converter() -> Callable[[dict], dict]:
    """The converter hard-codes the release's hidden size (see hunyuanvideo_tiny.py)."""
    from diffusers.loaders import single_file_utils
    from hunyuanvideo_tiny import with_hidden

    return with_hidden(single_file_utils.convert_hunyuan_video_transformer_to_diffusers, HIDDEN)


def _skyreels_converter() -> Callable[[dict], dict]:
    """Diffusers' Wan converter, with the conversion script's renames of the fps projection it lacks."""
    from wan_variants_fixtures import SKYREELS_SCRIPT_RENAMES

    convert = diffusers_converter("convert_wan_transformer_to_diffusers")()

    def converted(checkpoint: dict, **options) -> dict:  # (from_single_file passes the config)
        out = {}
        for name, tensor in convert(checkpoint, **options).items():
            old = next((old for old in SKYREELS_SCRIPT_RENAMES if name.startswith(old)), None)
            out[SKYREELS_SCRIPT_RENAMES[old] + name[len(old):] if old else name] = tensor
        return out
    return converted


def _mochi_converter() -> Callable[[dict], dict]:
    """Diffusers' converter hard-codes the release's 48 blocks (see mochi_fixtures.py)."""
    from mochi_fixtures import judge_transformer

    return lambda checkpoint, **options: judge_transformer(checkpoint, num_layers=MOCHI_LAYERS)


def _hunyuanvideo15_converter() -> Callable[[dict], dict]:
    """No Diffusers converter: the renames of Diffusers' conversion script (hunyuanvideo15_tiny.py)."""
    from hunyuanvideo15_tiny import reference_to_diffusers

    return lambda checkpoint, **options: reference_to_diffusers(dict(checkpoint))


@dataclass(frozen=True)
class TinyFamily:
    key: str  # the key_maps folder
    class_name: str
    config: dict[str, Any]
    table: str
    converter: Callable[[], Callable[[dict], dict]]  # the judge of the original names -> Diffusers' names
    inputs: Callable[[torch.Generator], dict[str, Any]]
    diffusers_loads: bool = True  # Diffusers' single-file table has the class: its GGUF loader reads the file
    runs_forward: bool = True  # the model runs on ``inputs`` (judged by its forward, else by its weights alone)

    def model_class(self):
        import diffusers

        return getattr(diffusers, self.class_name)

    def build(self, seed: int = 0):
        torch.manual_seed(seed)
        return randomize_(self.model_class()(**self.config), seed).eval()

    def converter_function(self) -> Callable[[dict], dict]:
        return self.converter()


def _wan_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 4, 2, 4, 6, generator=generator),
                encoder_hidden_states=torch.randn(1, 8, HIDDEN, generator=generator), timestep=torch.tensor([500]))


def _hunyuan_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 4, 2, 4, 4, generator=generator), timestep=torch.tensor([500]),
                encoder_hidden_states=torch.randn(1, 6, HIDDEN, generator=generator),
                encoder_attention_mask=torch.ones(1, 6, dtype=torch.bool),
                pooled_projections=torch.randn(1, HIDDEN, generator=generator), guidance=torch.tensor([4000.0]))


def _ltx_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 2 * 4 * 4, 8, generator=generator),
                encoder_hidden_states=torch.randn(1, 6, HIDDEN, generator=generator), timestep=torch.tensor([500]),
                encoder_attention_mask=torch.ones(1, 6), num_frames=2, height=4, width=4)


def _vace_inputs(generator: torch.Generator) -> dict[str, Any]:
    return {**_wan_inputs(generator), "control_hidden_states": torch.randn(1, 8, 2, 4, 6, generator=generator)}


def _skyreels_inputs(generator: torch.Generator) -> dict[str, Any]:
    return {**_wan_inputs(generator), "fps": [0]}


def _animate_inputs(generator: torch.Generator) -> dict[str, Any]:
    """Two latent frames and the reference frame; the face video at the motion encoder's 512 pixels."""
    return dict(hidden_states=torch.randn(1, 12, 3, 4, 6, generator=generator),
                encoder_hidden_states=torch.randn(1, 8, HIDDEN, generator=generator), timestep=torch.tensor([500]),
                encoder_hidden_states_image=torch.randn(1, 4, HIDDEN, generator=generator),
                pose_hidden_states=torch.randn(1, 4, 2, 4, 6, generator=generator),
                face_pixel_values=torch.randn(1, 3, 2, 512, 512, generator=generator))


def _ltx2_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 8, 8, generator=generator),
                audio_hidden_states=torch.randn(1, 4, 8, generator=generator),
                encoder_hidden_states=torch.randn(1, 6, HIDDEN, generator=generator),
                audio_encoder_hidden_states=torch.randn(1, 6, HIDDEN, generator=generator),
                timestep=torch.tensor([500.0]), num_frames=2, height=2, width=2, audio_num_frames=4)


def _mochi_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 4, 2, 4, 4, generator=generator),
                encoder_hidden_states=torch.randn(1, 8, HIDDEN, generator=generator), timestep=torch.tensor([500]),
                encoder_attention_mask=torch.ones(1, 8, dtype=torch.bool))


def _hunyuanvideo15_inputs(generator: torch.Generator) -> dict[str, Any]:
    raise NotImplementedError("HunyuanVideo 1.5 files are judged by name, not run: Diffusers cannot load them")


def _cosmos_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 4, 2, 4, 4, generator=generator), timestep=torch.tensor([500.0]),
                encoder_hidden_states=torch.randn(1, 6, HIDDEN, generator=generator))


def _minimax_h3_converter() -> Callable[[dict], dict]:
    """Diffusers' converter takes the model's config (the head count splits qkv_proj) and the row order: a single
    file's, stacked [q; k; v], its default."""
    convert = diffusers_converter("convert_minimax_h3_transformer_checkpoint_to_diffusers")()
    return lambda checkpoint, config=None, **options: convert(dict(checkpoint), config=config or _MINIMAX_H3)


def _minimax_h3_inputs(generator: torch.Generator) -> dict[str, Any]:
    raise NotImplementedError("MiniMax-H3's forward takes packed sequences: its files are judged by their weights")


def _animate2_inputs(generator: torch.Generator) -> dict[str, Any]:
    raise NotImplementedError("Wan-Animate-2's forward is a KV-cache driver's: its files are judged by their weights")


_WAN = dict(num_attention_heads=2, attention_head_dim=128, in_channels=4, out_channels=4, text_dim=HIDDEN,
            freq_dim=HIDDEN, ffn_dim=2 * HIDDEN, num_layers=1, patch_size=(1, 2, 2))
_WAN_CONVERTER = diffusers_converter("convert_wan_transformer_to_diffusers")
_MINIMAX_H3 = dict(num_attention_heads=2, attention_head_dim=128, hidden_size=HIDDEN, num_layers=1,
                   num_refiner_layers=1, ffn_dim=2 * HIDDEN, in_channels=4, audio_in_channels=8, text_dim=HIDDEN,
                   freq_dim=HIDDEN, time_embed_hidden_dim=HIDDEN, time_embed_dim=HIDDEN, rope_freq_dim=2)
# Mochi's feed-forwards are 8/3 of their stream's width: 768 is the narrowest whose rows and theirs fill K blocks
MOCHI_LAYERS, MOCHI_HIDDEN = 2, 768

FAMILIES = {
    "wan": TinyFamily("wan", "WanTransformer3DModel", _WAN, "wan/original_transformer", _WAN_CONVERTER, _wan_inputs),
    "hunyuanvideo": TinyFamily("hunyuanvideo", "HunyuanVideoTransformer3DModel",
                               dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128,
                                    num_layers=1, num_single_layers=1, num_refiner_layers=1, text_embed_dim=HIDDEN,
                                    pooled_projection_dim=HIDDEN, rope_axes_dim=(16, 56, 56)),
                               "hunyuanvideo/original_transformer", _hunyuanvideo_converter, _hunyuan_inputs),
    "ltx_video": TinyFamily("ltx_video", "LTXVideoTransformer3DModel",
                            dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=128,
                                 cross_attention_dim=HIDDEN, num_layers=1, caption_channels=HIDDEN),
                            "ltx_video/original_transformer",
                            diffusers_converter("convert_ltx_transformer_checkpoint_to_diffusers"), _ltx_inputs),
}


def _animate_config() -> dict[str, Any]:
    """Animate's own parts at the tiny sizes of wan_variants_tiny.py; its blocks at the widths above."""
    from wan_variants_tiny import _motion_channels

    return {**_WAN, "in_channels": 12, "latent_channels": 4, "num_layers": 2, "image_dim": HIDDEN,
            "added_kv_proj_dim": HIDDEN, "motion_encoder_size": 512, "motion_style_dim": 8, "motion_dim": 6,
            "motion_encoder_dim": 10, "face_encoder_hidden_dim": HIDDEN, "face_encoder_num_heads": 2,
            "inject_face_latents_blocks": 2, "motion_encoder_channel_sizes": _motion_channels()}


MORE_FAMILIES = {
    "wan_vace": TinyFamily("wan_vace", "WanVACETransformer3DModel",
                           {**_WAN, "num_layers": 2, "vace_layers": [0], "vace_in_channels": 8},
                           "wan_vace/original_transformer", _WAN_CONVERTER, _vace_inputs),
    "wan_animate": TinyFamily("wan_animate", "WanAnimateTransformer3DModel", _animate_config(),
                              "wan_animate/original_transformer", _WAN_CONVERTER, _animate_inputs),
    "skyreels_v2": TinyFamily("skyreels_v2", "SkyReelsV2Transformer3DModel", {**_WAN, "inject_sample_info": True},
                              "skyreels_v2/original_transformer", _skyreels_converter, _skyreels_inputs),
    "hunyuanvideo15": TinyFamily("hunyuanvideo15", "HunyuanVideo15Transformer3DModel",
                                 dict(num_attention_heads=2, attention_head_dim=128, num_layers=1, num_refiner_layers=1,
                                      in_channels=9, out_channels=4, text_embed_dim=HIDDEN, text_embed_2_dim=HIDDEN,
                                      image_embed_dim=HIDDEN, rope_axes_dim=(16, 56, 56)),
                                 "hunyuanvideo15/original_transformer", _hunyuanvideo15_converter,
                                 _hunyuanvideo15_inputs, diffusers_loads=False),
    "ltx2": TinyFamily("ltx2", "LTX2VideoTransformer3DModel",
                       dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=128,
                            cross_attention_dim=HIDDEN, audio_in_channels=8, audio_out_channels=8,
                            audio_num_attention_heads=2, audio_attention_head_dim=128, audio_cross_attention_dim=HIDDEN,
                            num_layers=1, caption_channels=HIDDEN, rope_type="split"),
                       "ltx2/original_transformer", diffusers_converter("convert_ltx2_transformer_to_diffusers"),
                       _ltx2_inputs),
    # no padding-mask channel: Diffusers resizes that mask with torchvision, which the test set-up does not install
    "cosmos": TinyFamily("cosmos", "CosmosTransformer3DModel",
                         dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128,
                              num_layers=1, text_embed_dim=HIDDEN, adaln_lora_dim=HIDDEN, max_size=(8, 16, 16),
                              rope_scale=(1.0, 3.0, 3.0), extra_pos_embed_type=None, concat_padding_mask=False),
                         "cosmos/original_transformer",
                         diffusers_converter("convert_cosmos_transformer_checkpoint_to_diffusers"), _cosmos_inputs),
    "wan_animate2": TinyFamily("wan_animate2", "WanAnimate2Transformer3DModel",
                               dict(dim=HIDDEN, ffn_dim=2 * HIDDEN, freq_dim=HIDDEN, text_dim=HIDDEN, num_heads=2,
                                    num_layers=1, in_dim=36, out_dim=16, text_len=8),
                               "wan_animate2/original_transformer",
                               diffusers_converter("convert_wan_animate_2_transformer_to_diffusers"),
                               _animate2_inputs, runs_forward=False),
    # in ComfyUI's single-file layout (qkv stacked), which its quantized.toml names for its quantized files
    "minimax_h3": TinyFamily("minimax_h3", "MiniMaxH3Transformer3DModel", _MINIMAX_H3, "minimax_h3/comfy_transformer",
                             _minimax_h3_converter, _minimax_h3_inputs, runs_forward=False),
    "mochi": TinyFamily("mochi", "MochiTransformer3DModel",
                        dict(num_attention_heads=MOCHI_HIDDEN // 128, attention_head_dim=128, num_layers=MOCHI_LAYERS,
                             pooled_projection_dim=MOCHI_HIDDEN, in_channels=4, text_embed_dim=HIDDEN,
                             max_sequence_length=8),
                        "mochi/original_transformer", _mochi_converter, _mochi_inputs),
}


def original_tensors(family: TinyFamily, model) -> dict[str, LazyTensor]:
    """The model's tensors under the original release's names (cogexport's table run backwards)."""
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    source = {name: LazyTensor(t.shape, t.dtype, lambda t=t: t, name) for name, t in state.items()}
    return dict(plan_translation(load_table(family.table).inverted(), source, None, {}).tensors)


def saved_tiny(family: TinyFamily, tmp_path_factory):
    """A tiny model of ``family`` built, its config saved (``folder/config``): the family, the model, its tensors in
    original names and the folder, as the quantized-file tests take them."""
    model = family.build()
    folder = tmp_path_factory.mktemp(family.key)
    model.save_config(folder / "config")
    return family, model, original_tensors(family, model), folder


# ---- the families no GGUF loader reads (ComfyUI-GGUF lists no architecture of theirs, Diffusers' single-file table no
# class): judged by their forward output, each file mapped back to Diffusers' names by a path independent of
# cogexport's tables (Diffusers' SAT converter's renames for CogVideoX; the layouts' own independent writers run
# backwards for Kandinsky 6 and SanaVideo; none for the families whose release names are Diffusers' own).

def _identity_converter() -> Callable[[dict], dict]:
    return lambda checkpoint, **options: dict(checkpoint)


def _cogvideox_converter() -> Callable[[dict], dict]:
    """The renames of Diffusers' scripts/convert_cogvideox_to_diffusers.py (benchmark_export.py's copy of them)."""
    from benchmark_export import SAT_PREFIX, rename_in_place

    def converted(checkpoint: dict, **options) -> dict:
        state = {SAT_PREFIX + name: tensor for name, tensor in checkpoint.items()}
        rename_in_place(state)
        return state
    return converted


def _renamed_back(rename: Callable[[str], str], names: Callable[[], list[str]]) -> Callable[[], Callable]:
    """The inverse of an independent Diffusers -> native renaming, over the tiny model's Diffusers names."""
    def converter() -> Callable[[dict], dict]:
        back = {rename(name): name for name in names()}
        return lambda checkpoint, **options: {back[name]: tensor for name, tensor in checkpoint.items()}
    return converter


def _kandinsky6_names() -> list[str]:
    return list(NO_LOADER_FAMILIES["kandinsky6"].build().state_dict())


def _kandinsky6_sr_names() -> list[str]:
    return list(NO_LOADER_FAMILIES["kandinsky6_sr"].build().state_dict())


def _kandinsky6_converter() -> Callable[[dict], dict]:
    from kandinsky6_fixtures import native_name

    return _renamed_back(native_name, _kandinsky6_names)()


def _kandinsky6_sr_converter() -> Callable[[dict], dict]:
    from kandinsky6_fixtures import sr_native_name

    return _renamed_back(sr_native_name, _kandinsky6_sr_names)()


def _sana_video_converter() -> Callable[[dict], dict]:
    """make_tiny_sana_video.release_state_dict (an independent writer of NVlabs' layout) run backwards: its renames
    inverted, the fused projections split, the buffers SanaVideoTransformer3DModel has no place for left out."""
    from make_tiny_sana_video import original_name, release_buffers

    names = list(NO_LOADER_FAMILIES["sana_video"].build().state_dict())
    fused = re.compile(r".*\.(attn1\.to_[qkv]|attn2\.to_[kv])\.")
    back = {original_name(name): name for name in names if not fused.match(name)}
    buffers = set(release_buffers(NO_LOADER_FAMILIES["sana_video"].config))

    def converted(checkpoint: dict, **options) -> dict:
        out = {}
        for name, tensor in checkpoint.items():
            block = name.split(".")[1] if name.startswith("blocks.") else None
            if name.endswith(".attn.qkv.weight"):
                out.update(zip((f"transformer_blocks.{block}.attn1.to_{p}.weight" for p in "qkv"), tensor.chunk(3)))
            elif ".cross_attn.kv_linear." in name:
                kind = name.rsplit(".", 1)[1]
                out.update(zip((f"transformer_blocks.{block}.attn2.to_{p}.{kind}" for p in "kv"), tensor.chunk(2)))
            elif name not in buffers:
                out[back[name]] = tensor
        return out
    return converted


def _cogvideox_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 2, 4, 4, 4, generator=generator),
                encoder_hidden_states=torch.randn(1, 6, HIDDEN, generator=generator), timestep=torch.tensor([500]))


def _framepack_inputs(generator: torch.Generator) -> dict[str, Any]:
    def noise(*shape):
        return torch.randn(*shape, generator=generator)

    return dict(hidden_states=noise(1, 4, 2, 8, 8), timestep=torch.tensor([500.0]),
                encoder_hidden_states=noise(1, 5, HIDDEN), encoder_attention_mask=torch.ones(1, 5, dtype=torch.long),
                pooled_projections=noise(1, HIDDEN), image_embeds=noise(1, 3, HIDDEN),
                indices_latents=torch.tensor([4, 5]), guidance=torch.tensor([6000.0]),
                latents_clean=noise(1, 4, 2, 8, 8), indices_latents_clean=torch.tensor([0, 3]),
                latents_history_2x=noise(1, 4, 2, 8, 8), indices_latents_history_2x=torch.tensor([1, 2]),
                latents_history_4x=noise(1, 4, 4, 8, 8), indices_latents_history_4x=torch.tensor([6, 7, 8, 9]))


def _kandinsky5_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 2, 4, 4, 9, generator=generator),
                encoder_hidden_states=torch.randn(1, 6, HIDDEN, generator=generator), timestep=torch.tensor([0.5]),
                pooled_projections=torch.randn(1, HIDDEN, generator=generator),
                visual_rope_pos=[torch.arange(2), torch.arange(2), torch.arange(2)], text_rope_pos=torch.arange(6))


def _kandinsky6_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 2, 4, 4, 9, generator=generator),
                audio_hidden_states=torch.randn(1, 6, 8, generator=generator),
                encoder_hidden_states=torch.randn(1, 5, HIDDEN, generator=generator),
                pooled_projections=torch.randn(1, HIDDEN, generator=generator), timestep=torch.tensor([500.0]),
                visual_token_type_ids=torch.tensor([[0, 1]]))


def _kandinsky6_sr_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 1, 8, 8, 9, generator=generator), timestep=torch.tensor([500.0]))


def _sana_video_inputs(generator: torch.Generator) -> dict[str, Any]:
    return dict(hidden_states=torch.randn(1, 4, 2, 4, 4, generator=generator),
                encoder_hidden_states=torch.randn(1, 5, HIDDEN, generator=generator),
                encoder_attention_mask=torch.tensor([[1, 1, 1, 1, 0]]), timestep=torch.tensor([500.0]))


_KANDINSKY = dict(in_text_dim=HIDDEN, in_text_dim2=HIDDEN, time_dim=HIDDEN, model_dim=HIDDEN, ff_dim=2 * HIDDEN,
                  num_text_blocks=1, num_visual_blocks=1, axes_dims=(32, 48, 48))
NO_LOADER_FAMILIES = {
    "cogvideox": TinyFamily("cogvideox", "CogVideoXTransformer3DModel",
                            dict(num_attention_heads=2, attention_head_dim=128, in_channels=4, out_channels=4,
                                 time_embed_dim=HIDDEN, text_embed_dim=HIDDEN, num_layers=1, sample_width=8,
                                 sample_height=8, sample_frames=5, max_text_seq_length=6),
                            "cogvideox/sat_transformer", _cogvideox_converter, _cogvideox_inputs,
                            diffusers_loads=False),
    "framepack": TinyFamily("framepack", "HunyuanVideoFramepackTransformer3DModel",
                            dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128,
                                 num_layers=1, num_single_layers=1, num_refiner_layers=1, text_embed_dim=HIDDEN,
                                 pooled_projection_dim=HIDDEN, rope_axes_dim=(16, 56, 56), has_image_proj=True,
                                 image_proj_dim=HIDDEN, has_clean_x_embedder=True),
                            "framepack/transformer", _identity_converter, _framepack_inputs, diffusers_loads=False),
    "kandinsky5": TinyFamily("kandinsky5", "Kandinsky5Transformer3DModel",
                             dict(_KANDINSKY, in_visual_dim=4, out_visual_dim=4, visual_cond=True),
                             "kandinsky5/transformer", _identity_converter, _kandinsky5_inputs, diffusers_loads=False),
    "kandinsky6": TinyFamily("kandinsky6", "Kandinsky6Transformer3DModel",
                             dict(_KANDINSKY, in_visual_dim=4, out_visual_dim=4, in_audio_dim=8, out_audio_dim=8,
                                  model_dim_a=HIDDEN, time_dim_a=HIDDEN, ff_dim_a=2 * HIDDEN, axes_dims_a=(32, 48, 48),
                                  audio_freqs_scaling=0.144, text_token_padding=True, ca_rope=True, cross_gates=True,
                                  fix_modulation=True, visual_token_type_num_embeddings=2),
                             "kandinsky6/original_transformer", _kandinsky6_converter, _kandinsky6_inputs,
                             diffusers_loads=False),
    "kandinsky6_sr": TinyFamily("kandinsky6_sr", "Kandinsky6SRTransformer3DModel",
                                dict(in_visual_dim=4, out_visual_dim=4, time_dim=HIDDEN, model_dim=HIDDEN,
                                     ff_dim=2 * HIDDEN, num_visual_blocks=1, axes_dims=(32, 48, 48)),
                                "kandinsky6_sr/original_transformer", _kandinsky6_sr_converter, _kandinsky6_sr_inputs,
                                diffusers_loads=False),
    "sana_video": TinyFamily("sana_video", "SanaVideoTransformer3DModel",
                             dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128,
                                  num_layers=1, num_cross_attention_heads=2, cross_attention_head_dim=128,
                                  cross_attention_dim=HIDDEN, caption_channels=HIDDEN, mlp_ratio=2.0,
                                  attention_bias=False, sample_size=8, patch_size=(1, 2, 2),
                                  norm_elementwise_affine=False, norm_eps=1e-6, qk_norm="rms_norm_across_heads",
                                  rope_max_seq_len=64),
                             "sana_video/original_transformer", _sana_video_converter, _sana_video_inputs,
                             diffusers_loads=False),
}
# judged with the others (read back, verified, what each keeps), and by their forward (test_quantized_families.py)
MORE_FAMILIES.update(NO_LOADER_FAMILIES)
