"""The vocoder with bandwidth extension of LTX-2.3 and LTX-2.5 (LTX2VocoderWithBWE) for tests: a tiny one built by
DiffSynth-Studio's port of the LTX-2 code (ltx2_audio_vae.py, whose module tree and names are the release's), with
seeded random weights, saved as the releases hold it (under vocoder.: in 2.3's single file, in 2.5's audio VAE file),
and the same sizes as Diffusers' LTX2VocoderWithBWE config."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

# DiffSynth's LTX2VocoderWithBWE builds the release's full sizes only, so its three parts are rebuilt small here with
# DiffSynth's own classes. The stages must agree as in the release: the BWE generator turns each mel frame (hop
# samples at the input rate) into hop x (output rate / input rate) samples, 8 x 3 = 24 = 6 x 2 x 2 here (80 x 3 =
# 240 = 6 x 5 x 2 x 2 x 2 in the release). The mel front end keeps its 64 bins (its generator's conv_pre reads 2 x 64
# channels, fixed in DiffSynth's class); a 64-sample window makes it small.
HOP, WINDOW, MELS = 8, 64, 64
VOCODER = dict(resblock_kernel_sizes=[3, 7], upsample_rates=[2, 2], upsample_kernel_sizes=[4, 4],
               resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], upsample_initial_channel=32)
BWE = dict(resblock_kernel_sizes=[3, 7], upsample_rates=[6, 2, 2], upsample_kernel_sizes=[12, 4, 4],
           resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], upsample_initial_channel=32)
# the same vocoder as LTX2VocoderWithBWE's config (the class's defaults are the release's: the rest stays)
DIFFUSERS_CONFIG = dict(hidden_channels=32, upsample_kernel_sizes=[4, 4], upsample_factors=[2, 2],
                        resnet_kernel_sizes=[3, 7], resnet_dilations=[[1, 3, 5], [1, 3, 5]],
                        bwe_hidden_channels=32, bwe_upsample_kernel_sizes=[12, 4, 4], bwe_upsample_factors=[6, 2, 2],
                        bwe_resnet_kernel_sizes=[3, 7], bwe_resnet_dilations=[[1, 3, 5], [1, 3, 5]],
                        filter_length=WINDOW, hop_length=HOP, window_length=WINDOW, num_mel_channels=MELS)


def diffsynth_vocoder_with_bwe(seed: int = 0) -> torch.nn.Module:
    """DiffSynth-Studio's LTX2VocoderWithBWE at the tiny sizes, every weight random (the filters and the STFT and mel
    bases too: they are in the release's file, and the export must carry whatever is there)."""
    from diffsynth_models import diffsynth_module

    module = diffsynth_module("ltx2_audio_vae")
    # its __init__ builds the full-size parts: the model is put together here instead, the attributes its forward
    # reads set as that __init__ sets them (the release's 16 and 48 kHz, the resampler it computes, not stores)
    model = module.LTX2VocoderWithBWE.__new__(module.LTX2VocoderWithBWE)
    torch.nn.Module.__init__(model)
    model.input_sampling_rate, model.output_sampling_rate, model.hop_length = 16000, 48000, HOP
    model.resampler = module.UpSample1d(ratio=3, persistent=False, window_type="hann")
    common = dict(resblock="AMP1", activation="snakebeta", use_tanh_at_final=False, use_bias_at_final=False)
    model.vocoder = module.LTX2Vocoder(**VOCODER, **common, output_sampling_rate=model.input_sampling_rate)
    model.bwe_generator = module.LTX2Vocoder(**BWE, **common, apply_final_activation=False,
                                             output_sampling_rate=model.output_sampling_rate)
    model.mel_stft = module.MelSTFT(filter_length=WINDOW, hop_length=HOP, win_length=WINDOW, n_mel_channels=MELS)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
        # a mel filterbank is non-negative (the log of a negative energy would be clamped to 1e-5 everywhere)
        model.mel_stft.mel_basis.abs_()
    return model.eval()


def vocoder_with_bwe_file(folder: Path, name: str = "ltx-2.3-tiny-vocoder.safetensors",
                          beside: dict[str, torch.Tensor] | None = None, seed: int = 0) -> Path:
    """The tiny vocoder under vocoder., as a release file holds it (with ``beside``: another model's tensors in the
    same file, as 2.5's audio VAE file holds the audio VAE)."""
    tensors = {f"vocoder.{name}": t.contiguous() for name, t in diffsynth_vocoder_with_bwe(seed).state_dict().items()}
    path = folder / name
    save_file({**tensors, **(beside or {})}, path)
    return path


def vocoder_with_bwe_base(folder: Path) -> Path:
    """A folder holding the tiny vocoder's Diffusers config (vocoder/config.json), for --base."""
    from diffusers.pipelines.ltx2 import LTX2VocoderWithBWE

    with torch.device("meta"):
        model = LTX2VocoderWithBWE(**DIFFUSERS_CONFIG)
    (folder / "vocoder").mkdir(parents=True)
    model.save_config(folder / "vocoder")
    return folder


def script_converted(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What Diffusers' conversion script (scripts/convert_ltx2_to_diffusers.py, --version 2.3) makes of the release's
    vocoder, written out here: vocoder. taken off once, LTX_2_3_VOCODER_RENAME_DICT's replacements in its order, then
    its special case .ups. -> .upsamplers. (a plain "ups" replacement would hit "upsample")."""
    renames = (("resblocks", "resnets"), ("conv_pre", "conv_in"), ("conv_post", "conv_out"), ("act_post", "act_out"),
               ("downsample.lowpass", "downsample"))
    out = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("vocoder.")
        for old, new in renames:
            name = name.replace(old, new)
        out[name.replace(".ups.", ".upsamplers.")] = tensor
    return out
