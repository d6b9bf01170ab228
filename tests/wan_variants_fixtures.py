"""Inputs for the tests of Wan's variants (Wan VACE, Wan Animate, SkyReels-V2): tiny Diffusers models of every shape
class, tiny pipeline folders and fine-tunes made once and cached, and the judges: Diffusers' own single-file converter
(convert_wan_transformer_to_diffusers reads VACE and Animate releases, and SkyReels-V2's but for its fps embedding,
whose renames come from huggingface/diffusers' scripts/convert_skyreelsv2_to_diffusers.py)."""

from __future__ import annotations

import sys

import torch
from fixtures import SCRIPTS, DeepSpeedFixture, GroundTruth, cached_fixture
from wan_fixtures import diffusers_reads_original

sys.path.insert(0, str(SCRIPTS))
from wan_variants_tiny import SHAPE_CLASSES, build_tiny_variant, forward_inputs, tiny_config  # noqa: E402,F401

PIPELINE_SCRIPTS = ("make_tiny_wan_variants.py", "wan_variants_tiny.py", "make_tiny_wan.py", "wan_tiny_configs.py",
                    "tiny_models.py")
FINETUNE_SCRIPTS = ("finetune_tiny_wan_variants.py", "finetune_tiny_wan.py", "tiny_training.py",
                    "deepspeed_cpu.py", "make_deepspeed_checkpoint.py", *PIPELINE_SCRIPTS)

# Diffusers 0.42.1's convert_wan_transformer_to_diffusers has no rule for SkyReels-V2's fps projection (an nn.Sequential
# of Linear, SiLU, Linear): it passes the original names through. huggingface/diffusers'
# scripts/convert_skyreelsv2_to_diffusers.py renames them (its TRANSFORMER_KEYS_RENAME_DICT): these are its renames.
SKYREELS_SCRIPT_RENAMES = {"fps_projection.0.": "fps_projection.net.0.proj.",
                           "fps_projection.2.": "fps_projection.net.2."}


def judged(original: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What Diffusers makes of an original-layout state dict: its single-file converter, and for the one gap the
    conversion script's renames; the blur kernels the converter passes through (from_single_file drops them as
    unexpected keys) are left out."""
    converted = diffusers_reads_original(dict(original))
    renamed = {}
    for name, tensor in converted.items():
        for old, new in SKYREELS_SCRIPT_RENAMES.items():
            if name.startswith(old):
                name = new + name[len(old):]
        renamed[name] = tensor
    return {name: tensor for name, tensor in renamed.items() if not name.endswith(".kernel")}


def tiny_variant_pipeline(variant: str) -> "Path":  # noqa: F821
    """A complete tiny pipeline folder of make_tiny_wan_variants.py's variant (seed 0), made once."""
    return cached_fixture(f"wan-variant-pipeline-{variant}", PIPELINE_SCRIPTS,
                          [str(SCRIPTS / "make_tiny_wan_variants.py"), "--variant", variant])


def variant_finetune(variant: str, *arguments: str) -> DeepSpeedFixture:
    """A tiny variant's transformer fine-tuned two steps (finetune_tiny_wan_variants.py's ARGUMENTS), made once."""
    base = tiny_variant_pipeline(variant)
    name = f"wan-variant-finetune-{variant}-" + "-".join(a.lstrip("-") for a in arguments)
    root = cached_fixture(name, FINETUNE_SCRIPTS, [str(SCRIPTS / "finetune_tiny_wan_variants.py"), str(base),
                                                    *arguments])
    truth = GroundTruth(root)
    return DeepSpeedFixture(root, base, truth.truth.get("checkpoint") or truth.truth["settings"]["checkpoint"])
