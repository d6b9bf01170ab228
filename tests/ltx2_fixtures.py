"""LTX-2 inputs for tests: the LTX-2 repository's own tiny release (../shared/fixtures/ltx2, made by ltx_core), tiny
pipeline folders (made once, cached), tiny fine-tunes under real DeepSpeed and FSDP2/DCP, and Diffusers' own
single-file converters as the judges, each given the release file split by prefix first (on the whole file its VAE
converter's replace("vae.", "") turns audio_vae.* into audio_*)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import SCRIPTS, DeepSpeedFixture, cached_fixture
from safetensors.torch import load_file
from wan_fixtures import SHARED

FIXTURE = SHARED / "fixtures" / "ltx2"
RELEASE = FIXTURE / "original" / "ltx-2-19b-dev-tiny.safetensors"
PIPELINE_SCRIPTS = ("make_tiny_ltx2.py", "tiny_models.py")
# the release's prefixes, one model each (the connectors keep two: see connectors_of)
PREFIXES = {"transformer": "model.diffusion_model.", "vae": "vae.", "audio_vae": "audio_vae.", "vocoder": "vocoder."}
CONNECTOR_KEYS = ("model.diffusion_model.video_embeddings_connector.", "model.diffusion_model.audio_embeddings_connector.",
                  "text_embedding_projection.")


def release() -> Path:
    if not RELEASE.is_file():
        pytest.skip(f"the LTX-2 repository's tiny release is not at {RELEASE} (set COGEXPORT_SHARED)")
    return RELEASE


def reference_io() -> dict[str, torch.Tensor]:
    """The inputs and outputs the LTX-2 repository's own model gave on the shared fixture (skipped without it)."""
    path = FIXTURE / "reference_io.safetensors"
    if not path.is_file():
        pytest.skip(f"the LTX-2 repository's reference inputs are not at {path} (set COGEXPORT_SHARED)")
    return load_file(path)


def release_tensors() -> dict[str, torch.Tensor]:
    return load_file(release())


def tiny_pipeline(layout: str = "render", task: str = "t2v") -> Path:
    """A tiny LTX-2 pipeline folder (seed 0), made once: ``release`` at the shared release's sizes, ``render`` at
    sizes whose models fit together (it renders frames and audio)."""
    return cached_fixture(f"tiny-ltx2-{layout}-{task}", PIPELINE_SCRIPTS,
                          [str(SCRIPTS / "make_tiny_ltx2.py"), "--layout", layout, "--task", task])


def split(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The keys of one model of the release, prefix kept (as a file of that model alone would hold them)."""
    return {name: tensor for name, tensor in tensors.items() if name.startswith(prefix)}


def judged(component: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Diffusers' own single-file conversion of one model of a release (transformer, vae, audio_vae), given only
    that model's keys."""
    from diffusers.loaders import single_file_utils as converters

    convert = {"transformer": converters.convert_ltx2_transformer_to_diffusers,
               "vae": converters.convert_ltx2_vae_to_diffusers,
               "audio_vae": converters.convert_ltx2_audio_vae_to_diffusers}[component]
    return convert(split(tensors, PREFIXES[component]))


def connectors_of(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The release's text connectors under the names LTX2TextConnectors gives them, from the renames Diffusers' own
    conversion script lists for them (scripts/convert_ltx2_to_diffusers.py: video/audio_embeddings_connector ->
    video/audio_connector, transformer_1d_blocks -> transformer_blocks, aggregate_embed -> text_proj_in,
    q_norm / k_norm -> norm_q / norm_k), written out here independently of cogexport's table."""
    renamed = {}
    for name, tensor in tensors.items():
        if not name.startswith(CONNECTOR_KEYS):
            continue
        short = name.removeprefix("model.diffusion_model.").removeprefix("text_embedding_projection.")
        for old, new in (("_embeddings_connector", "_connector"), ("transformer_1d_blocks", "transformer_blocks"),
                         ("aggregate_embed", "text_proj_in"), ("q_norm", "norm_q"), ("k_norm", "norm_k")):
            short = short.replace(old, new)
        renamed[short] = tensor
    return renamed


def vocoder_of(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The release's vocoder under LTX2Vocoder's names, from the conversion script's list (ups -> upsamplers,
    resblocks -> resnets, conv_pre / conv_post -> conv_in / conv_out), written out here."""
    renamed = {}
    for name, tensor in split(tensors, "vocoder.").items():
        short = name.removeprefix("vocoder.")
        for old, new in (("ups.", "upsamplers."), ("resblocks.", "resnets."), ("conv_pre", "conv_in"),
                         ("conv_post", "conv_out")):
            short = short.replace(old, new) if short.startswith(old) else short
        renamed[short] = tensor
    return renamed


def finetune(writer: str = "deepspeed", stage: int = 2, world_size: int = 2, dtype: str = "bf16") -> DeepSpeedFixture:
    """A tiny LTX-2 transformer fine-tuned on CPU ranks (DeepSpeed ZeRO, or FSDP2 saved with DCP), with its base."""
    base = tiny_pipeline("render")
    scripts = ("finetune_tiny_ltx2.py", *PIPELINE_SCRIPTS, "deepspeed_cpu.py", "make_deepspeed_checkpoint.py",
               "make_dcp_checkpoint.py", "tiny_training.py")
    command = [str(SCRIPTS / "finetune_tiny_ltx2.py"), str(base), "--writer", writer, "--stage", str(stage),
               "--world-size", str(world_size), "--dtype", dtype]
    name = f"finetune-ltx2-{writer}" + (f"-zero{stage}-{dtype}" if writer == "deepspeed" else "") + f"-ws{world_size}"
    return DeepSpeedFixture(cached_fixture(name, scripts, command), base)
