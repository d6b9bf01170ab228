"""Kandinsky 6 (TI2VA) both ways. The published -Diffusers folders hold Diffusers' own names; the native layout is
ComfyUI's (and the release's before its keys were renamed), whose names the tests write from ComfyUI's published
rename list (kandinsky6_fixtures.native_name), independent of cogexport's tables. Diffusers has no converter for the
family, so the judge of a native file's export is Diffusers' own loader: the model from_pretrained reads from
save_pretrained of the same weights, which the export must equal tensor for tensor, byte for byte and in its
forward output (video and audio). The way back is judged by the native file itself, byte for byte."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from diffusers import Kandinsky6Transformer3DModel
from kandinsky6_fixtures import config_base, native_file, native_name, tiny_transformer
from safetensors.torch import load_file

from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.lazy import LazyTensor
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables, preferred_tables
from cogexport.models.target import build_target
from cogexport.precision import PrecisionPolicy

FAMILY = family_named("kandinsky6")
NATIVE_FILE = "kandinsky6_transformer.safetensors"
WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """(the tiny model, its native file, a --base folder with its config, the fp32 export of the native file)."""
    from cogexport.exporter import export

    root = tmp_path_factory.mktemp("kandinsky6")
    model = tiny_transformer(seed=3)
    path = native_file(root / "native" / NATIVE_FILE, model.state_dict())
    base = config_base(root / "base", model)
    export(path, root / "fp32", base=base, dtype="fp32")
    return model, path, base, root / "fp32"


def forward_inputs(seed: int = 1) -> dict[str, torch.Tensor]:
    """2 latent frames of 4x4 (the noisy latents, a condition and its mask), 6 audio frames, 5 text tokens."""
    generator = torch.Generator().manual_seed(seed)
    return {"hidden_states": torch.randn(1, 2, 4, 4, 9, generator=generator),
            "audio_hidden_states": torch.randn(1, 6, 6, generator=generator),
            "encoder_hidden_states": torch.randn(1, 5, 8, generator=generator),
            "pooled_projections": torch.randn(1, 6, generator=generator), "timestep": torch.tensor([500.0]),
            "visual_token_type_ids": torch.tensor([[0, 1]])}


def test_native_file_exports_as_diffusers_own_loader_reads_the_model(native, tmp_path):
    """The native file to Diffusers: the model's own tensors exactly, the files save_pretrained writes of it byte for
    byte, and the model from_pretrained reads from our folder computes what the one it reads from save_pretrained's
    computes (video and audio), bit for bit."""
    model, _, _, ours = native
    assert_same_tensors(load_file(ours / WEIGHTS), model.state_dict())
    model.save_pretrained(tmp_path / "theirs")
    for name in (WEIGHTS, "config.json"):
        assert (ours / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name
    inputs = forward_inputs()
    with torch.no_grad():
        expected = Kandinsky6Transformer3DModel.from_pretrained(tmp_path / "theirs").eval()(**inputs)
        got = Kandinsky6Transformer3DModel.from_pretrained(ours).eval()(**inputs)
    assert torch.equal(got.sample, expected.sample) and torch.equal(got.audio_sample, expected.audio_sample)
    assert expected.sample.std() > 0 and expected.audio_sample.std() > 0


def test_published_names_export_as_they_are(native, tmp_path, cli):
    """A -Diffusers folder's transformer file (and the same names under ComfyUI's model.diffusion_model.) exports to
    the same bytes as the native file."""
    model, _, base, ours = native
    for prefix in ("", "model.diffusion_model."):
        path = native_file(tmp_path / prefix / "in" / WEIGHTS, model.state_dict(), rename=lambda n: prefix + n)
        result = cli(path, tmp_path / prefix / "out", "--base", base, "--dtype", "fp32")
        assert result.exit_code == 0, result.stderr
        assert (tmp_path / prefix / "out" / WEIGHTS).read_bytes() == (ours / WEIGHTS).read_bytes()


def test_to_original_round_trips_byte_for_byte(native, tmp_path, cli):
    """Diffusers -> --to original is the native file as safetensors writes it, byte for byte; exported again, the
    Diffusers folder's files byte for byte."""
    _, path, base, ours = native
    result = cli(ours, tmp_path / "original", "--to", "original", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md", NATIVE_FILE]
    assert (tmp_path / "original" / NATIVE_FILE).read_bytes() == path.read_bytes()
    result = cli(tmp_path / "original", tmp_path / "again", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    for name in (WEIGHTS, "config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (ours / name).read_bytes(), name


def test_bf16_export_keeps_the_time_embeddings_modulations_and_norms_fp32(native, tmp_path):
    """The default dtype: the time embeddings, every modulation and the norms in fp32 (what the class's comment on
    _keep_in_fp32_modules means; Diffusers' own bf16 load keeps a subset of them), everything else bf16."""
    from cogexport.exporter import export

    model, path, base, _ = native
    export(path, tmp_path / "bf16", base=base)
    written = load_file(tmp_path / "bf16" / WEIGHTS)
    kept = {name for name, tensor in written.items() if tensor.dtype == torch.float32}
    expected = {name for name in written if any(part in name for part in (
        "time_embeddings.", "modulation.", "query_norm.", "key_norm.", "text_embeddings.norm.",
        "audio_embeddings.norm."))}
    assert kept == expected and len(kept) > 40
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    for name, tensor in model.state_dict().items():
        assert torch.equal(written[name], tensor.to(policy.target_dtype(name, tensor.dtype))), name
    loaded = Kandinsky6Transformer3DModel.from_pretrained(tmp_path / "bf16", torch_dtype=torch.bfloat16)
    theirs = {name for name, tensor in loaded.state_dict().items() if tensor.dtype == torch.float32}
    assert theirs and theirs <= kept


@pytest.mark.parametrize("naming", ["diffusers", "native"])
def test_a_dcp_save_of_a_fine_tune_exports_its_weights(native, tmp_path, cli, naming):
    """A fine-tune: the model loaded from the export, one AdamW step on its video and audio output, saved as a plain
    training loop saves (dcp.save of model, optimizer and step; one process here, whose file is what each rank writes
    of its shard), under Diffusers' names or the native ones (a trainer on ComfyUI's model). The export is the trained
    weights exactly, the optimizer's state left out."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    _, _, base, ours = native
    model = Kandinsky6Transformer3DModel.from_pretrained(ours).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    output = model(**forward_inputs(seed=7))
    (output.sample.square().mean() + output.audio_sample.square().mean()).backward()
    optimizer.step()
    trained = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    saved = trained if naming == "diffusers" else {native_name(name): t for name, t in trained.items()}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": saved, "optimizer": get_optimizer_state_dict(model, optimizer), "step": 1},
                 checkpoint_id=str(tmp_path / "run" / "step-1"))
    result = cli(tmp_path / "run" / "step-1", tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    first = "visual_transformer_blocks.0.va_cross_attention.to_key.weight"
    assert not torch.equal(trained[first], load_file(ours / WEIGHTS)[first])
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), trained)


# -- bad input -------------------------------------------------------------------------------------------------------
def test_bad_kandinsky6_input(native, tmp_path, cli):
    model, path, base, _ = native
    assert_refused(cli, tmp_path, [path, tmp_path / "out"], "model_dim 16", "not a published Kandinsky 6 size",
                   "--base", inputs=[path])
    plain = config_base(tmp_path / "plain", tiny_transformer(visual_cond=False))
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", plain], "takes condition channels",
                   "visual_cond False", inputs=[path])
    # a --base pipeline folder holding only the transformer: the pipeline export's other components are named
    # (tests/test_kandinsky6_pipeline.py exports whole pipelines)
    pipeline = tmp_path / "pipeline"
    config_base(pipeline / "transformer", model)
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "Kandinsky6TI2VAPipeline",
                                                           "transformer": ["diffusers", "Kandinsky6Transformer3DModel"]}))
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", pipeline], f"--base {pipeline} has no "
                   "text_encoder/ folder", "full Diffusers pipeline folder", inputs=[path])
    truncated = {native_name(n): t for n, t in model.state_dict().items()}
    del truncated["visual_blocks.1.audioT.cross_attention.to_key.weight"]
    broken = native_file(tmp_path / "broken" / NATIVE_FILE, truncated, rename=lambda n: n)
    assert_refused(cli, tmp_path, [broken, tmp_path / "out", "--base", base],
                   "visual_transformer_blocks.1.audio_dec_block.cross_attention.to_key.weight", inputs=[broken])


# -- variants at full size (meta tensors: nothing is allocated) ------------------------------------------------------
def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


def published_shapes(variant: str) -> dict[str, torch.Size]:
    config = FAMILY.transformer_config(FAMILY.variant_named(variant))
    return dict(build_target(FAMILY.transformer.class_name, config).schema)


@pytest.mark.parametrize("shapes_of, options, name, parameters", [
    ("Kandinsky-6.0-Lite-5s", {}, "Kandinsky-6.0-Lite-5s", 3_176_632_424),   # the model card's count
    ("Kandinsky-6.0-Lite-5s", {"model_name": "Kandinsky-6.0-Lite-pretrain-5s"}, "Kandinsky-6.0-Lite-pretrain-5s",
     3_176_632_424),
    ("Kandinsky-6.0-Pro-distill-5s", {}, "Kandinsky-6.0-Pro-distill-5s", None),
])
def test_published_variants_are_read_off_the_native_shapes(shapes_of, options, name, parameters):
    """The published sizes in the native names: each is recognised as its variant with its published config."""
    shapes = published_shapes(shapes_of)
    if parameters:
        assert sum(torch.Size(shape).numel() for shape in shapes.values()) == parameters
    tensors = {native_name(n): LazyTensor(shape, torch.bfloat16, _never_read) for n, shape in shapes.items()}
    transformer = plan_transformer(tensors, ExportOptions(**options), "meta")
    assert transformer.variant.name == name and transformer.published and transformer.label == name
    assert len(transformer.tensors) == len(shapes)
    built = dict(transformer.target.config)
    published = FAMILY.transformer_config(FAMILY.variant_named(name))
    assert json.loads(json.dumps({k: built[k] for k in published})) == json.loads(json.dumps(published))


def test_tables_never_match_another_familys_keys():
    """Of every table, ours alone are taken for our names (both layouts), and no table of another family fits them.
    The other direction, a family's names against our tables, is that family's own test of this name where it has
    one (Kandinsky 5, HunyuanVideo, LTX, Cosmos, ...); our signatures (a fused block's video_dec_block, the native
    videoT, the SR model's pooled_bias) are names no other model has."""
    shapes = published_shapes("Kandinsky-6.0-Lite-5s")
    ours = {"kandinsky6/original_transformer": [native_name(n) for n in shapes],
            "kandinsky6/diffusers_transformer": list(shapes)}
    for name, keys in ours.items():
        assert [t.name for _, t in preferred_tables(keys, component_tables("transformer"))] == [name]
    for other in families():
        if other.key != FAMILY.key:
            for keys in ours.values():
                assert fitting_tables(keys, component_tables("transformer", other)) == [], other.name
