"""Tiny Diffusers transformers whose widths suit every GGML type (rows of 256 or multiples of it, as the K types
need), their original-layout tensors (cogexport's key map run backwards: these are only the inputs; Diffusers
judges the result), forward inputs, and Diffusers' own single-file converter for each family."""

from __future__ import annotations

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


@dataclass(frozen=True)
class TinyFamily:
    key: str  # the key_maps folder
    class_name: str
    config: dict[str, Any]
    table: str
    converter: str  # diffusers.loaders.single_file_utils function
    inputs: Callable[[torch.Generator], dict[str, Any]]

    def model_class(self):
        import diffusers

        return getattr(diffusers, self.class_name)

    def build(self, seed: int = 0):
        torch.manual_seed(seed)
        return randomize_(self.model_class()(**self.config), seed).eval()

    def converter_function(self) -> Callable[[dict], dict]:
        from diffusers.loaders import single_file_utils

        function = getattr(single_file_utils, self.converter)
        if self.key == "hunyuanvideo":  # the converter hard-codes the release's hidden size (see hunyuanvideo_tiny.py)
            from hunyuanvideo_tiny import with_hidden

            return with_hidden(function, HIDDEN)
        return function


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


FAMILIES = {
    "wan": TinyFamily("wan", "WanTransformer3DModel",
                      dict(num_attention_heads=2, attention_head_dim=128, in_channels=4, out_channels=4, text_dim=HIDDEN,
                           freq_dim=HIDDEN, ffn_dim=2 * HIDDEN, num_layers=1, patch_size=(1, 2, 2)),
                      "wan/original_transformer", "convert_wan_transformer_to_diffusers", _wan_inputs),
    "hunyuanvideo": TinyFamily("hunyuanvideo", "HunyuanVideoTransformer3DModel",
                               dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=128,
                                    num_layers=1, num_single_layers=1, num_refiner_layers=1, text_embed_dim=HIDDEN,
                                    pooled_projection_dim=HIDDEN, rope_axes_dim=(16, 56, 56)),
                               "hunyuanvideo/original_transformer", "convert_hunyuan_video_transformer_to_diffusers",
                               _hunyuan_inputs),
    "ltx_video": TinyFamily("ltx_video", "LTXVideoTransformer3DModel",
                            dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=128,
                                 cross_attention_dim=HIDDEN, num_layers=1, caption_channels=HIDDEN),
                            "ltx_video/original_transformer", "convert_ltx_transformer_checkpoint_to_diffusers",
                            _ltx_inputs),
}


def original_tensors(family: TinyFamily, model) -> dict[str, LazyTensor]:
    """The model's tensors under the original release's names (cogexport's table run backwards)."""
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    source = {name: LazyTensor(t.shape, t.dtype, lambda t=t: t, name) for name, t in state.items()}
    return dict(plan_translation(load_table(family.table).inverted(), source, None, {}).tensors)
