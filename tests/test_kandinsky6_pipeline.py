"""Kandinsky 6 pipeline folders: a fine-tune exported with a --base pipeline folder (a tiny Kandinsky6TI2VAPipeline
that Diffusers' own classes built and saved: Qwen2.5-VL, CLIP, HunyuanVideo's VAE, MMAudio's VAE and vocoder; or a
tiny Kandinsky6SRPipeline: the K-VAE and the latent upscaler bank) is the whole pipeline: the transformer exported,
everything else --base's files as they are, the scheduler the variant's. The judge is Diffusers: the folder loads
with from_pretrained, holds the trained weights exactly and renders (TI2VA: video and audio; SR: the upscaled
video)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from diffusers import (Kandinsky6SRPipeline, Kandinsky6SRTransformer3DModel, Kandinsky6TI2VAPipeline,
                       Kandinsky6Transformer3DModel)
from kandinsky6_fixtures import native_file, sr_native_name, tiny_pipeline

WEIGHTS = "diffusion_pytorch_model.safetensors"
# what a render of the tiny pipeline asks: 5 frames of 32x32 (2 latent frames of 4x4), a short prompt window
RENDER = dict(prompt="a cat playing guitar", height=32, width=32, num_frames=5, num_inference_steps=2,
              max_sequence_length=16, output_type="np")


def training_inputs(config: dict, seed: int = 1) -> dict[str, torch.Tensor]:
    """2 latent frames of 4x4 (the noisy latents, a condition and its mask), 6 audio frames, 5 text tokens."""
    generator = torch.Generator().manual_seed(seed)
    channels = 2 * config["in_visual_dim"] + 1
    return {"hidden_states": torch.randn(1, 2, 4, 4, channels, generator=generator),
            "audio_hidden_states": torch.randn(1, 6, config["in_audio_dim"], generator=generator),
            "encoder_hidden_states": torch.randn(1, 5, config["in_text_dim"], generator=generator),
            "pooled_projections": torch.randn(1, config["in_text_dim2"], generator=generator),
            "timestep": torch.tensor([500.0]), "visual_token_type_ids": torch.tensor([[0, 1]])}


@pytest.fixture(scope="module")
def finetune(tmp_path_factory):
    """(the tiny pipeline folder, a DCP save of its transformer after one AdamW step, the trained weights): a plain
    training loop's save (dcp.save of model, optimizer and step; one process, whose file is what each rank writes of
    its shard)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    base = tiny_pipeline()
    run = tmp_path_factory.mktemp("kandinsky6-pipeline") / "run" / "step-1"
    model = Kandinsky6Transformer3DModel.from_pretrained(base / "transformer").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    output = model(**training_inputs(model.config))
    (output.sample.square().mean() + output.audio_sample.square().mean()).backward()
    optimizer.step()
    trained = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": trained, "optimizer": get_optimizer_state_dict(model, optimizer), "step": 1},
                 checkpoint_id=str(run))
    return base, run, trained


def files_below(folder: Path, *skipped: str) -> dict[str, bytes]:
    """Every file's bytes but those below ``skipped`` and the fixture cache's own marks (.complete, .seconds)."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and path.relative_to(folder).parts[0] not in skipped and not path.name.startswith(".")}


def assert_renders(pipe, audio: bool = True, **settings) -> None:
    output = pipe(**RENDER, sample_audio=audio, generator=torch.Generator().manual_seed(0), **settings)
    frames = torch.from_numpy(output.frames)
    assert frames.shape == (1, 5, 32, 32, 3) and bool(torch.isfinite(frames).all()) and frames.std() > 0
    if audio:
        waveform = torch.as_tensor(output.audio)
        assert waveform.shape[0] == 1 and waveform.numel() > 0 and bool(torch.isfinite(waveform).all())
        assert waveform.std() > 0
    else:
        assert output.audio is None


def test_a_finetune_exports_the_whole_pipeline_that_loads_and_renders(finetune, tmp_path, cli):
    """The pipeline folder: the trained transformer exactly; every other file (the text encoders, tokenizers, both
    VAEs, the vocoder, and model_index.json and the scheduler, which cogexport writes as Diffusers does) byte for
    byte --base's; Diffusers loads it and renders video and audio."""
    base, run, trained = finetune
    result = cli(run, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    assert files_below(out, "transformer", "README.md") == files_below(base, "transformer")
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["_class_name"] == "FlowMatchEulerDiscreteScheduler" and scheduler["shift"] == 5.0
    assert "from diffusers import Kandinsky6TI2VAPipeline" in (out / "README.md").read_text()
    pipe = Kandinsky6TI2VAPipeline.from_pretrained(out)
    assert_same_tensors(pipe.transformer.state_dict(), trained)
    assert_renders(pipe)


def distilled_base(folder: Path, base: Path) -> Path:
    """--base of a distilled model saved without the optional audio models: the tiny pipeline with a pi-Flow
    transformer (10 velocity grids: heads 10 times as wide), audio_vae and vocoder null in model_index.json as
    save_pretrained writes a pipeline built without them."""
    shutil.copytree(base, folder, ignore=shutil.ignore_patterns("transformer", "audio_vae", "vocoder"))
    config = Kandinsky6Transformer3DModel.load_config(base / "transformer")
    torch.manual_seed(4)
    model = Kandinsky6Transformer3DModel.from_config({**config, "out_visual_dim": 10 * config["in_visual_dim"],
                                                      "out_audio_dim": 10 * config["in_audio_dim"]}).eval()
    model.save_pretrained(folder / "transformer")
    index = json.loads((base / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "audio_vae": [None, None], "vocoder": [None, None]}))
    return folder


def test_a_distilled_model_gets_piflow_and_a_base_without_audio_stays_without(finetune, tmp_path, cli):
    """A distilled (pi-Flow) model's pipeline samples with PiflowScheduler whatever --base's scheduler is (its
    variant's, n_grid 10); a --base whose model_index.json says null for the optional audio VAE and vocoder gives a
    pipeline without them, which Diffusers loads and renders video with."""
    base = distilled_base(tmp_path / "base", finetune[0])
    weights = Kandinsky6Transformer3DModel.from_pretrained(base / "transformer").state_dict()
    checkpoint = native_file(tmp_path / "native" / "kandinsky6_distill.safetensors", weights)
    result = cli(checkpoint, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    index = json.loads((out / "model_index.json").read_text())
    assert index["scheduler"] == ["diffusers", "PiflowScheduler"]
    assert index["audio_vae"] == index["vocoder"] == [None, None]
    assert not (out / "audio_vae").exists() and not (out / "vocoder").exists()
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert (scheduler["n_grid"], scheduler["shift"]) == (10, 5.0)
    assert files_below(out, "transformer", "scheduler", "model_index.json", "README.md") == \
        files_below(base, "transformer", "scheduler", "model_index.json")
    pipe = Kandinsky6TI2VAPipeline.from_pretrained(out)
    assert_same_tensors(pipe.transformer.state_dict(), weights)
    assert_renders(pipe, audio=False, guidance_scale=1.0)  # pi-Flow samples without guidance


def test_a_base_missing_a_component_it_names_is_refused(finetune, tmp_path, cli):
    """model_index.json names the audio VAE, but its folder is gone: one line naming the folder, nothing written."""
    base, run, _ = finetune
    broken = tmp_path / "base"
    shutil.copytree(base, broken, ignore=shutil.ignore_patterns("audio_vae"))
    assert_refused(cli, tmp_path, [run, tmp_path / "out", "--base", broken], f"--base {broken} has no audio_vae/",
                   inputs=[run])


def test_an_sr_finetune_exports_the_whole_sr_pipeline_that_loads_and_upscales(tmp_path, cli):
    """The SR model in the kandinsky-6-sr repository's native names (its ComfyUI node's layout) with an SR --base:
    the K-VAE, the latent upscaler bank, model_index.json and the distilled bundle's PiflowScheduler (shift 3.5) are
    --base's bytes, the transformer the given weights exactly, and Diffusers upscales a tiny video 2x with it. (The
    weights are a model of other seeded values, not a training step: the SR DiT's flex attention has no backward on
    CPU.)"""
    base = tiny_pipeline("sr")
    config = Kandinsky6SRTransformer3DModel.load_config(base / "transformer")
    torch.manual_seed(8)
    weights = {name: tensor + 0.01 * torch.randn_like(tensor) for name, tensor in
               Kandinsky6SRTransformer3DModel.from_pretrained(base / "transformer").state_dict().items()}
    checkpoint = native_file(tmp_path / "native" / "kandinsky6_sr_transformer.safetensors", weights,
                             rename=sr_native_name)
    result = cli(checkpoint, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    assert files_below(out, "transformer", "README.md") == files_below(base, "transformer")
    assert json.loads((out / "transformer" / "config.json").read_text())["tile_sizes"] == config["tile_sizes"]
    pipe = Kandinsky6SRPipeline.from_pretrained(out)
    assert_same_tensors(pipe.transformer.state_dict(), weights)
    video = torch.rand(1, 5, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 2 - 1
    frames = torch.from_numpy(pipe(video=video, resolution_scale=2, num_inference_steps=2, output_type="np",
                                   generator=torch.Generator().manual_seed(0)).frames)
    assert frames.shape == (1, 5, 32, 32, 3) and bool(torch.isfinite(frames).all()) and frames.std() > 0
