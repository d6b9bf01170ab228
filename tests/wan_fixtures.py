"""Wan inputs for tests: tiny Diffusers models of every shape class, tiny pipeline folders (made once, cached), the
real tiny Wan 2.1 T2V written by the Wan repo's own class (shared/fixtures/wan21-t2v), and Diffusers' own converters,
the independent judges of the original layout."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from fixtures import CACHE, ROOT, SCRIPTS, DeepSpeedFixture, cached_fixture, locked
from safetensors.torch import load_file

sys.path.insert(0, str(SCRIPTS))
from wan_tiny_configs import TINY_VAE21, TINY_VAE22, build_tiny_transformer, build_tiny_vae  # noqa: E402,F401

SHARED = Path(os.environ.get("COGEXPORT_SHARED", ROOT.parent / "shared"))
REAL_WAN = SHARED / "fixtures" / "wan21-t2v"
TRUTH = "ground_truth.safetensors"  # the fixture's weights as its maker saved them, in Diffusers names
EXPERTS = ("high_noise_model", "low_noise_model")  # the A14B release's subfolders: transformer, transformer_2

# Diffusers 0.42.1's convert_wan_transformer_to_diffusers has no rule for FLF2V's image position table (facts page
# 1.5): it passes the original name through unchanged. Our files follow the original model (WanModel's img_emb.emb_pos);
# the tests check that the converter leaves exactly this name untranslated and compare it by hand.
CONVERTER_GAPS = {"img_emb.emb_pos": "condition_embedder.image_embedder.pos_embed"}


def real_wan() -> Path:
    if not (REAL_WAN / "original").is_dir():
        pytest.skip(f"the real Wan fixture is not at {REAL_WAN} (set COGEXPORT_SHARED)")
    return REAL_WAN


def real_wan_base() -> Path:
    """The real tiny Wan's Diffusers transformer folder as save_pretrained lays it out. The shared fixture keeps those
    weights as base/transformer/ground_truth.safetensors (the truth the tests compare with), a name from_pretrained
    never reads, so cogexport rightly refuses that folder as a model; this copy names them
    diffusion_pytorch_model.safetensors. Made once."""
    source = REAL_WAN / "base" / "transformer"
    folder = CACHE / f"wan21-t2v-base-{(source / TRUTH).stat().st_size}" / "transformer"
    with locked(folder.parent.with_suffix(".lock")):
        if not (folder / "diffusion_pytorch_model.safetensors").is_file():
            partial = folder.with_name("transformer.partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            shutil.copyfile(source / "config.json", partial / "config.json")
            shutil.copyfile(source / TRUTH, partial / "diffusion_pytorch_model.safetensors")
            os.rename(partial, folder)
    return folder


def tiny_wan_pipeline(variant: str) -> Path:
    """A complete tiny Wan pipeline folder of make_tiny_wan.py's variant (seed 0), made once."""
    scripts = ("make_tiny_wan.py", "wan_tiny_configs.py", "tiny_models.py")
    return cached_fixture(f"wan-pipeline-{variant}", scripts,
                          [str(SCRIPTS / "make_tiny_wan.py"), "--variant", variant])


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in ``folder`` (one file or shards)."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def diffusers_reads_original(original: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What Diffusers' own single-file converter makes of an original-layout Wan transformer state dict."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    return convert_wan_transformer_to_diffusers(dict(original))


def diffusers_reads_original_vae(original: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    return convert_wan_vae_to_diffusers(dict(original))


def same_files(ours: Path, theirs: Path) -> list[str]:
    """Names of the files that differ (or exist on one side only) between two folders, recursively; ``ours``'s model
    card (README.md, which save_pretrained does not write) aside."""
    names = {str(p.relative_to(ours)) for p in ours.rglob("*") if p.is_file() and p.name != "README.md"} | \
        {str(p.relative_to(theirs)) for p in theirs.rglob("*") if p.is_file()}
    return sorted(n for n in names if not ((ours / n).is_file() and (theirs / n).is_file()
                                           and (ours / n).read_bytes() == (theirs / n).read_bytes()))


def diffsynth_wan_vae_module():
    """DiffSynth-Studio's Wan VAE module (VideoVAE_ for 2.1, VideoVAE38_ for 2.2): an independent implementation in
    the original names, which loads Wan2.1_VAE.pth and Wan2.2_VAE.pth as they are. Loaded from its file alone: the
    diffsynth package's __init__ pulls in far more than this module needs (torch, einops, tqdm)."""
    import importlib.util
    import sysconfig

    path = Path(sysconfig.get_paths()["purelib"]) / "diffsynth" / "models" / "wan_video_vae.py"
    if not path.is_file():
        pytest.skip("diffsynth is not installed (scripts/setup_venv.sh installs it without its dependencies)")
    spec = importlib.util.spec_from_file_location("diffsynth_wan_video_vae", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wan_finetune() -> DeepSpeedFixture:
    """A tiny Wan 2.1 T2V fine-tuned two steps in the original names under DeepSpeed ZeRO-2 (2 ranks, bf16), with
    the fp32 masters taken inside training (truth.safetensors, original names). Made once."""
    base = tiny_wan_pipeline("t2v")
    scripts = ("finetune_tiny_wan.py", "tiny_training.py", "deepspeed_cpu.py", "make_deepspeed_checkpoint.py",
               "make_tiny_wan.py", "wan_tiny_configs.py", "tiny_models.py")
    return DeepSpeedFixture(cached_fixture("wan-finetune-t2v-zero2-ws2-bf16", scripts,
                                           [str(SCRIPTS / "finetune_tiny_wan.py"), str(base)]), base, "checkpoint-2")
