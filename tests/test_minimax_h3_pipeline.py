"""MiniMax-H3's modular pipeline folder: a fine-tuned transformer (a release partition DiffSynth-Studio's
MiniMaxH3DiT wrote) exported with --base into a tiny local MiniMaxH3ModularPipeline folder (modular_model_index.json
and the identical model_index.json, transformer/, transformer_ref/, vae/, audio_vae/, scheduler/, audio_scheduler/, the
text encoder's folders), loaded by Diffusers' ModularPipeline and rendered (its denoise and decode blocks, from prompt
embeddings: a tiny Qwen3-VL is not built here); and the way back from the pipeline folder, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from minimax_h3_fixtures import diffsynth_model, diffusers_config, release_dtypes, release_partition
from minimax_h3_vae_fixtures import AUDIO_VAE, VIDEO_VAE
from safetensors.torch import load_file

WEIGHTS = "diffusion_pytorch_model.safetensors"
# the tiny audio VAE the transformer's 8 audio channels need, at the release's hop (800 samples a latent) and a
# sampling rate that makes one latent a second
PIPELINE_AUDIO_VAE = {**AUDIO_VAE, "latent_channels": 8, "latents_mean": [0.0] * 8, "latents_std": [1.0] * 8,
                      "encoder_rates": [2, 4, 4, 5, 5], "decoder_rates": [5, 5, 2, 2, 2, 2, 2], "decoder_dim": 128,
                      "decoder_kernel_sizes": [9, 9, 4, 4, 4, 4, 4], "sampling_rate": 800}
COMPONENTS = {"text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
              "tokenizer": ["transformers", "Qwen2TokenizerFast"], "processor": ["transformers", "Qwen3VLProcessor"],
              "vae": ["diffusers", "AutoencoderKLMiniMaxH3"], "audio_vae": ["diffusers", "AutoencoderKLMiniMaxH3Audio"],
              "transformer": ["diffusers", "MiniMaxH3Transformer3DModel"],
              "transformer_ref": ["diffusers", "MiniMaxH3Transformer3DModel"],
              "scheduler": ["diffusers", "MiniMaxH3Scheduler"], "audio_scheduler": ["diffusers", "MiniMaxH3Scheduler"]}


def modular_base(folder: Path) -> Path:
    """A MiniMaxH3ModularPipeline folder as the Hub repository holds it, at a tiny size: each index entry
    [library, class, loading spec] pointing at the Hub, as Diffusers' conversion script writes them."""
    from diffusers import (AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Scheduler,
                           MiniMaxH3Transformer3DModel)

    torch.manual_seed(0)
    for name in ("transformer", "transformer_ref"):
        MiniMaxH3Transformer3DModel.from_config(diffusers_config()).save_pretrained(folder / name)
    AutoencoderKLMiniMaxH3(**VIDEO_VAE).save_pretrained(folder / "vae")
    AutoencoderKLMiniMaxH3Audio(**PIPELINE_AUDIO_VAE).save_pretrained(folder / "audio_vae")
    MiniMaxH3Scheduler(shift=12.0).save_pretrained(folder / "scheduler")
    MiniMaxH3Scheduler(shift=3.0).save_pretrained(folder / "audio_scheduler")
    for name in ("text_encoder", "tokenizer", "processor"):  # stand-ins: the render below never loads them
        (folder / name).mkdir()
        (folder / name / "config.json").write_text("{}")
    index = {"_class_name": "MiniMaxH3ModularPipeline", "_diffusers_version": "0.42.1",
             "_blocks_class_name": "MiniMaxH3Blocks"}
    index.update({name: [library, cls, {"type_hint": [library, cls], "pretrained_model_name_or_path":
                                        "MiniMaxAI/MiniMax-H3", "subfolder": name, "variant": None, "revision": None}]
                  for name, (library, cls) in COMPONENTS.items()})
    for name in ("modular_model_index.json", "model_index.json"):
        (folder / name).write_text(json.dumps(index, indent=2))
    return folder


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """The release partition (its own mixed precision), exported into the tiny base pipeline (bf16, the release's
    fp32 modules kept)."""
    from cogexport.exporter import export

    folder = tmp_path_factory.mktemp("minimax_h3_pipeline")
    release = release_partition(folder / "FL2VA" / "transformer", release_dtypes(diffsynth_model(seed=9).state_dict()))
    export(release, folder / "out", base=modular_base(folder / "base"))
    return {"release": release, "base": folder / "base", "out": folder / "out"}


def test_the_pipeline_folder_keeps_the_bases_index_and_components_and_holds_the_export(exported):
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    out, base = exported["out"], exported["base"]
    for name in ("modular_model_index.json", "model_index.json"):
        assert (out / name).read_bytes() == (base / name).read_bytes(), name
    for name in ("vae", "audio_vae", "transformer_ref", "scheduler", "audio_scheduler", "text_encoder"):
        assert sorted(p.name for p in (out / name).iterdir()) == sorted(p.name for p in (base / name).iterdir()), name
    release = {}
    for shard in exported["release"].glob("model-*.safetensors"):
        release.update(load_file(shard))
    expected = convert_minimax_h3_transformer_checkpoint_to_diffusers(release, config=diffusers_config(),
                                                                      qkv_layout="interleaved")
    ours = load_file(out / "transformer" / WEIGHTS)
    assert set(ours) == set(expected) and all(torch.equal(ours[n], expected[n]) for n in expected)


def test_diffusers_modular_pipeline_loads_the_folder_and_renders(exported):
    from diffusers import ModularPipeline
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3 import modular_blocks_minimax_h3 as blocks

    pipeline = ModularPipeline.from_pretrained(exported["out"])
    assert type(pipeline).__name__ == "MiniMaxH3ModularPipeline"
    # the t2va workflow's denoise and decode blocks, on the folder's own components (prompt embeddings given)
    steps = SequentialPipelineBlocks.from_blocks_dict({"denoise": blocks.MiniMaxH3CoreDenoiseStep(),
                                                       "decode": blocks.MiniMaxH3DecodeStep()})
    render = steps.init_pipeline(exported["out"])
    render.load_components(names=["transformer", "vae", "audio_vae", "scheduler", "audio_scheduler"],
                           torch_dtype=torch.float32)
    loaded = {n: t for n, t in render.transformer.state_dict().items()}
    ours = load_file(exported["out"] / "transformer" / WEIGHTS)
    assert all(torch.equal(loaded[n], ours[n].float()) for n in ours)  # the exported transformer, from the folder
    state = render(prompt_embeds=torch.randn(1, 3, 24, generator=torch.Generator().manual_seed(2)),
                   text_token_tags=torch.ones(3, dtype=torch.long), height=16, width=16, num_frames=120,
                   num_inference_steps=2, generator=torch.Generator().manual_seed(3), output_type="pt")
    video, audio = state.values["videos"], state.values["audio"]
    assert torch.as_tensor(video).isfinite().all() and torch.as_tensor(audio).isfinite().all()
    assert torch.as_tensor(video).numel() > 0 and torch.as_tensor(audio).numel() > 0


def test_the_way_back_from_the_pipeline_folder_is_the_release_partition_byte_for_byte(exported, cli, tmp_path):
    # --model-type fl2va: its transformer/ alone (without it, the whole release folder: test_minimax_h3_release_root)
    result = cli(exported["out"], tmp_path / "back", "--to", "original", "--model-type", "fl2va",
                 "--max-shard-size", "20kB")
    assert result.exit_code == 0, result.stderr
    shards = sorted(p.name for p in exported["release"].glob("model-*.safetensors"))
    assert sorted(p.name for p in (tmp_path / "back").glob("model-*.safetensors")) == shards
    for name in shards:
        assert (tmp_path / "back" / name).read_bytes() == (exported["release"] / name).read_bytes(), name
    index = "model.safetensors.index.json"  # the same shard map (huggingface_hub's JSON spacing is its own)
    assert json.loads((tmp_path / "back" / index).read_text())["weight_map"] == \
        json.loads((exported["release"] / index).read_text())["weight_map"]
    assert json.loads((tmp_path / "back" / "config.json").read_text()) == \
        json.loads((exported["release"] / "config.json").read_text())
    # Diffusers' own conversion writes modular_model_index.json alone: the folder is read as the pipeline all the same
    import shutil

    shutil.copytree(exported["out"], tmp_path / "modular_only", symlinks=True)
    (tmp_path / "modular_only" / "model_index.json").unlink()
    result = cli(tmp_path / "modular_only", tmp_path / "back2", "--to", "original", "--model-type", "fl2va",
                 "--max-shard-size", "20kB")
    assert result.exit_code == 0, result.stderr
    assert all((tmp_path / "back2" / name).read_bytes() == (exported["release"] / name).read_bytes() for name in shards)


def test_a_ref2va_transformer_goes_to_transformer_ref(exported, cli, tmp_path):
    """--model-type ref2va: the pipeline's transformer_ref/ (MiniMaxH3Ref2VABlocks' partition); transformer/ stays the
    base's."""
    result = cli(exported["release"], tmp_path / "out", "--base", exported["base"], "--model-type", "ref2va")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "out" / "transformer_ref" / WEIGHTS).read_bytes() == \
        (exported["out"] / "transformer" / WEIGHTS).read_bytes()
    assert (tmp_path / "out" / "transformer" / WEIGHTS).read_bytes() == \
        (exported["base"] / "transformer" / WEIGHTS).read_bytes()


def test_a_base_whose_index_names_another_class_for_the_folder_is_refused(exported, cli, tmp_path):
    """The index is kept as it is, so it must name the exported class where the export goes: else one line, exit 2,
    nothing written."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(exported["base"], base)
    for name in ("modular_model_index.json", "model_index.json"):
        index = json.loads((base / name).read_text())
        index["transformer"][1] = index["transformer"][2]["type_hint"][1] = "WanTransformer3DModel"
        (base / name).write_text(json.dumps(index))
    result = cli(exported["release"], tmp_path / "out", "--base", base)
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert result.stderr.count("\n") == 1 and "WanTransformer3DModel" in result.stderr, result.stderr


def test_the_way_back_of_a_ref2va_pipeline_is_its_transformer_ref(exported, cli, tmp_path):
    """--to original --model-type ref2va of a pipeline folder writes the partition its transformer_ref/ holds (the
    Ref2VA transformer), byte for byte, not its transformer/ (here the base's other model)."""
    result = cli(exported["release"], tmp_path / "out", "--base", exported["base"], "--model-type", "ref2va")
    assert result.exit_code == 0, result.stderr
    result = cli(tmp_path / "out", tmp_path / "back", "--to", "original", "--model-type", "ref2va",
                 "--max-shard-size", "20kB")
    assert result.exit_code == 0, result.stderr
    shards = sorted(p.name for p in exported["release"].glob("model-*.safetensors"))
    assert sorted(p.name for p in (tmp_path / "back").glob("model-*.safetensors")) == shards
    for name in shards:
        assert (tmp_path / "back" / name).read_bytes() == (exported["release"] / name).read_bytes(), name
