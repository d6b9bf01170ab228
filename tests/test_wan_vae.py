"""The Wan VAEs both ways. The 2.1 layout (Wan2.1_VAE.pth) is judged by Diffusers' own convert_wan_vae_to_diffusers;
the 2.2 layout (Wan2.2_VAE.pth, TI2V-5B), which no Diffusers single-file converter reads, by DiffSynth-Studio's
implementation of it (the original module names, loading the released file as it is): the same weights give
bit-identical latents and frames in its model and in Diffusers' AutoencoderKLWan after our export, and the way back
gives its state dict again, name for name."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from diffusers import AutoencoderKLWan
from wan_fixtures import (TINY_VAE21, TINY_VAE22, build_tiny_vae, diffsynth_wan_vae_module,
                          diffusers_reads_original_vae, same_files, weights)

from cogexport.exporter import export
from cogexport.exporter import export_original
from tiny_models import randomize_


def config_folder(path, config):
    AutoencoderKLWan(**config).save_config(path)
    return path


def test_vae21_way_back_is_read_by_diffusers_converter(tmp_path, cli):
    vae = build_tiny_vae("2.1", seed=4)
    vae.save_pretrained(tmp_path / "vae")
    result = cli(tmp_path / "vae", tmp_path / "original", "--to", "original", "--component", "vae")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md", "Wan2.1_VAE.pth"]
    original = torch.load(tmp_path / "original" / "Wan2.1_VAE.pth", weights_only=True)  # a plain state dict
    converted = diffusers_reads_original_vae(original)
    expected = vae.state_dict()
    assert set(converted) == set(expected)
    assert all(converted[n].dtype == torch.float32 and torch.equal(converted[n], t) for n, t in expected.items())


def test_vae21_pth_exports_like_save_pretrained(tmp_path):
    """Wan2.1_VAE.pth is a pickled OrderedDict: it opens through the safe reader and exports exactly."""
    vae = build_tiny_vae("2.1", seed=5)
    vae.save_pretrained(tmp_path / "theirs")
    export_original(tmp_path / "theirs", tmp_path / "original", component="vae")
    original = torch.load(tmp_path / "original" / "Wan2.1_VAE.pth", weights_only=True)
    torch.save(OrderedDict(original), tmp_path / "Wan2.1_VAE.pth")
    export(tmp_path / "Wan2.1_VAE.pth", tmp_path / "ours", component="vae",
           base=config_folder(tmp_path / "base", TINY_VAE21))
    assert same_files(tmp_path / "ours", tmp_path / "theirs") == []


@pytest.fixture
def original_vae22(tmp_path):
    """A tiny Wan 2.2 VAE built by DiffSynth's original-named class, saved as the release saves Wan2.2_VAE.pth."""
    module = diffsynth_wan_vae_module()
    torch.manual_seed(0)
    model = randomize_(module.VideoVAE38_(dim=TINY_VAE22["base_dim"], z_dim=TINY_VAE22["z_dim"],
                                          dec_dim=TINY_VAE22["decoder_base_dim"]), seed=6).eval()
    torch.save(model.state_dict(), tmp_path / "Wan2.2_VAE.pth")
    return model, tmp_path / "Wan2.2_VAE.pth"


def test_vae22_export_computes_what_the_original_computes(original_vae22, tmp_path, cli):
    model, pth = original_vae22
    result = cli("--component", "vae", pth, tmp_path / "out", "--base", config_folder(tmp_path / "base", TINY_VAE22))
    assert result.exit_code == 0, result.stderr
    assert len(weights(tmp_path / "out")) == len(model.state_dict())
    exported = AutoencoderKLWan.from_pretrained(tmp_path / "out").eval()
    video = torch.randn(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(1))
    no_scaling = [torch.zeros(TINY_VAE22["z_dim"]), torch.ones(TINY_VAE22["z_dim"])]
    with torch.no_grad():
        latents = exported.encode(video).latent_dist.mode()
        assert torch.equal(latents, model.encode(video, no_scaling))
        assert torch.equal(exported.decode(latents).sample, model.decode(latents, no_scaling))


def test_vae22_way_back_is_the_original_state_dict(original_vae22, tmp_path):
    model, pth = original_vae22
    export(pth, tmp_path / "diffusers", component="vae", dtype="fp32",
           base=config_folder(tmp_path / "base", TINY_VAE22))
    export_original(tmp_path / "diffusers", tmp_path / "original", component="vae")
    back = torch.load(tmp_path / "original" / "Wan2.2_VAE.pth", weights_only=True)
    expected = model.state_dict()
    assert set(back) == set(expected)
    assert all(torch.equal(back[name], tensor) for name, tensor in expected.items())


def test_vae21_and_vae22_layouts_are_told_apart(original_vae22, tmp_path, cli):
    _, pth = original_vae22
    report = cli("inspect", "--json", pth)
    assert '"layout": "wan/original_vae22"' in report.stdout
    build_tiny_vae("2.1").save_pretrained(tmp_path / "vae21")
    export_original(tmp_path / "vae21", tmp_path / "original", component="vae")
    report = cli("inspect", "--json", tmp_path / "original" / "Wan2.1_VAE.pth")
    assert '"layout": "wan/original_vae"' in report.stdout
