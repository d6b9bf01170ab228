"""What exporting CogVideoX needs to know: the five published variants, how to tell them apart from tensor
shapes, their Diffusers configs, and each model's schema taken from the real Diffusers class on the meta device.

Every number here is a published config value (CogVideoX-2b, 5b, 5b-I2V, 1.5-5B, 1.5-5B-I2V). Anything else
(a different size, a tiny test model) gets its config from ``--base``, checked against the checkpoint's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from ..errors import CogExportError

PATCH = 2  # spatial patch size of every published variant
PATCH_T = 2  # 1.5's temporal patch size


@dataclass(frozen=True)
class CogVideoXVariant:
    name: str
    hub_id: str
    version: str  # "1.0" or "1.5"
    image_to_video: bool
    transformer: Mapping[str, object] = field(default_factory=dict)  # values that differ from the class defaults
    vae: Mapping[str, object] = field(default_factory=dict)
    snr_shift_scale: float = 1.0

    @property
    def model_type(self) -> str:
        return "i2v" if self.image_to_video else "t2v"

    @property
    def pipeline_class(self) -> str:
        return "CogVideoXImageToVideoPipeline" if self.image_to_video else "CogVideoXPipeline"

    @property
    def pipeline_tag(self) -> str:
        return "image-to-video" if self.image_to_video else "text-to-video"


_5B = {"num_layers": 42, "num_attention_heads": 48, "use_rotary_positional_embeddings": True}
_1_5 = {**_5B, "patch_size_t": PATCH_T, "patch_bias": False, "sample_height": 300, "sample_width": 300,
        "sample_frames": 81}
VARIANTS = (
    CogVideoXVariant("CogVideoX-2b", "THUDM/CogVideoX-2b", "1.0", False,
                     {"num_layers": 30, "num_attention_heads": 30}, {"scaling_factor": 1.15258426}, 3.0),
    CogVideoXVariant("CogVideoX-5b", "THUDM/CogVideoX-5b", "1.0", False, _5B, {"scaling_factor": 0.7}),
    CogVideoXVariant("CogVideoX-5b-I2V", "THUDM/CogVideoX-5b-I2V", "1.0", True,
                     {**_5B, "in_channels": 32, "use_learned_positional_embeddings": True}, {"scaling_factor": 0.7}),
    CogVideoXVariant("CogVideoX1.5-5B", "THUDM/CogVideoX1.5-5B", "1.5", False, _1_5,
                     {"scaling_factor": 0.7, "invert_scale_latents": True}),
    CogVideoXVariant("CogVideoX1.5-5B-I2V", "THUDM/CogVideoX1.5-5B-I2V", "1.5", True,
                     {**_1_5, "in_channels": 32, "ofs_embed_dim": 512},
                     {"scaling_factor": 0.7, "invert_scale_latents": True}),
)
VARIANT_NAMES = tuple(v.name for v in VARIANTS)


def variant_named(name: str) -> CogVideoXVariant:
    for variant in VARIANTS:
        if variant.name.lower() == name.lower():
            return variant
    raise CogExportError(f"unknown model name {name!r}; one of {', '.join(VARIANT_NAMES)}")


def scheduler_config(variant: CogVideoXVariant) -> dict:
    """CogVideoXDDIMScheduler as every variant uses it; only the SNR shift differs."""
    return {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
            "clip_sample": False, "set_alpha_to_one": True, "steps_offset": 0, "prediction_type": "v_prediction",
            "timestep_spacing": "trailing", "rescale_betas_zero_snr": True, "snr_shift_scale": variant.snr_shift_scale}


@dataclass(frozen=True)
class TransformerShape:
    """Facts read off a Diffusers-named transformer state dict."""

    hidden: int
    text_embed_dim: int
    time_embed_dim: int
    num_layers: int
    in_channels: int
    out_channels: int
    version: str
    has_ofs_embedding: bool
    has_position_table: bool  # patch_embed.pos_embedding: 5b-I2V's learned one, or a 2b file's fixed sin-cos copy

    @property
    def image_to_video(self) -> bool:
        return self.in_channels == 2 * self.out_channels

    @property
    def learned_positions(self) -> bool:
        """Trained position embeddings that the target model must have (CogVideoX-5b-I2V's)."""
        return self.has_position_table and self.image_to_video and self.version == "1.0"

    def describe(self) -> str:
        return (f"CogVideoX {self.version} transformer, hidden size {self.hidden}, {self.num_layers} layers, "
                f"in_channels {self.in_channels}")


def read_transformer_shape(shapes: Mapping[str, torch.Size]) -> TransformerShape:
    needed = ("patch_embed.proj.weight", "patch_embed.text_proj.weight", "proj_out.weight",
              "time_embedding.linear_1.weight")
    absent = [name for name in needed if name not in shapes]
    if absent:
        raise CogExportError(f"the checkpoint has no {', '.join(absent)}: it is not a CogVideoX transformer")
    proj = shapes["patch_embed.proj.weight"]
    version = "1.0" if len(proj) == 4 else "1.5"
    per_patch = PATCH * PATCH * (1 if version == "1.0" else PATCH_T)
    layers = {int(name.split(".")[1]) for name in shapes if name.startswith("transformer_blocks.")}
    return TransformerShape(
        hidden=shapes["patch_embed.text_proj.weight"][0],
        text_embed_dim=shapes["patch_embed.text_proj.weight"][1],
        time_embed_dim=shapes["time_embedding.linear_1.weight"][0],
        num_layers=max(layers) + 1 if layers else 0,
        in_channels=proj[1] if version == "1.0" else proj[1] // per_patch,
        out_channels=shapes["proj_out.weight"][0] // per_patch,
        version=version,
        has_ofs_embedding="ofs_embedding.linear_1.weight" in shapes,
        has_position_table="patch_embed.pos_embedding" in shapes,
    )


def published_variant(shape: TransformerShape) -> CogVideoXVariant | None:
    """The published variant with exactly this structure, if any."""
    for variant in VARIANTS:
        config = transformer_config(variant)
        if (variant.version == shape.version and variant.image_to_video == shape.image_to_video
                and config["num_layers"] == shape.num_layers
                and config["num_attention_heads"] * config["attention_head_dim"] == shape.hidden
                and config["text_embed_dim"] == shape.text_embed_dim and config["time_embed_dim"] == shape.time_embed_dim
                and config["in_channels"] == shape.in_channels):
            return variant
    return None


def variant_like(config: Mapping[str, object]) -> CogVideoXVariant:
    """The published variant a (possibly resized) transformer config is built like: decides the scheduler shift,
    the VAE's latent scaling and the pipeline class."""
    image_to_video = config.get("in_channels", 16) == 2 * config.get("out_channels", 16)
    if config.get("patch_size_t"):
        return variant_named("CogVideoX1.5-5B-I2V" if image_to_video else "CogVideoX1.5-5B")
    if not config.get("use_rotary_positional_embeddings"):
        return variant_named("CogVideoX-2b")
    return variant_named("CogVideoX-5b-I2V" if image_to_video else "CogVideoX-5b")


def _class_defaults(model_class) -> dict:
    import inspect

    return {name: p.default for name, p in inspect.signature(model_class.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def transformer_config(variant: CogVideoXVariant) -> dict:
    from diffusers import CogVideoXTransformer3DModel

    return {**_class_defaults(CogVideoXTransformer3DModel), **variant.transformer}


def vae_config(variant: CogVideoXVariant) -> dict:
    from diffusers import AutoencoderKLCogVideoX

    return {**_class_defaults(AutoencoderKLCogVideoX), **variant.vae}


@dataclass
class TargetModel:
    """A Diffusers model built on the meta device: its config (for config.json) and state_dict schema."""

    model: torch.nn.Module
    schema: dict[str, torch.Size]
    dtypes: dict[str, torch.dtype]
    counts: dict[str, int]

    @property
    def class_name(self) -> str:
        return type(self.model).__name__


def layout_schema(num_layers: int) -> dict[str, torch.Size]:
    """Every tensor name a CogVideoX transformer with ``num_layers`` blocks can have (1.5 I2V has them all), for
    checking names when the model's size is not known; its shapes are the 5B ones, not the checkpoint's."""
    from .base_folder import TRANSFORMER_CLASS

    config = {**transformer_config(variant_named("CogVideoX1.5-5B-I2V")), "num_layers": max(num_layers, 1)}
    return build_target(TRANSFORMER_CLASS, config).schema


def build_target(class_name: str, config: Mapping[str, object]) -> TargetModel:
    """Build the Diffusers class on the meta device: nothing is allocated, the config is always the class's own."""
    import diffusers

    model_class = getattr(diffusers, class_name)
    try:
        with torch.device("meta"):
            model = model_class.from_config(dict(config))
    except (TypeError, ValueError, AssertionError) as error:
        raise CogExportError(f"cannot build {class_name} from this config: {error}") from None
    state = model.state_dict()
    counts = {}
    if "up_block_types" in model.config:
        counts["num_up_blocks"] = len(model.config["up_block_types"])
    return TargetModel(model, {k: v.shape for k, v in state.items()}, {k: v.dtype for k, v in state.items()}, counts)
