"""The Kandinsky 6 super-resolution transformer both ways. The published -Diffusers bundles hold Diffusers' names; the
native layout is the kandinsky-6-sr repository's ComfyUI DiT, whose names the tests write from that repository's
published rename list (kandinsky6_fixtures.sr_native_name). The judge of a native file's export is Diffusers' own
loader (from_pretrained of save_pretrained's folder of the same weights): the same tensors, bytes and forward output;
the way back is judged by the native file itself, byte for byte."""

from __future__ import annotations

import contextlib
import json
import warnings

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from diffusers import Kandinsky6SRTransformer3DModel
from kandinsky6_fixtures import config_base, native_file, sr_native_name, tiny_sr_transformer
from safetensors.torch import load_file

from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.lazy import LazyTensor
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables, preferred_tables
from cogexport.models.target import build_target

FAMILY = family_named("kandinsky6_sr")
NATIVE_FILE = "kandinsky6_sr_transformer.safetensors"
WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """(the tiny model, its native file, a --base folder with its config, the fp32 export of the native file)."""
    from cogexport.exporter import export

    root = tmp_path_factory.mktemp("kandinsky6-sr")
    model = tiny_sr_transformer(seed=4)
    path = native_file(root / "native" / NATIVE_FILE, model.state_dict(), rename=sr_native_name)
    base = config_base(root / "base", model)
    export(path, root / "fp32", base=base, dtype="fp32")
    return model, path, base, root / "fp32"


def forward_inputs() -> dict[str, torch.Tensor]:
    """One latent frame of 8x8 tokens (NABLA's smallest grid): the noisy latent, the anchor latent and its mask."""
    generator = torch.Generator().manual_seed(1)
    return {"hidden_states": torch.randn(1, 1, 8, 8, 9, generator=generator), "timestep": torch.tensor([500.0])}


@contextlib.contextmanager
def eager_flex_attention():
    """Flex attention uncompiled: PyTorch warns (once) that it runs eagerly, materialising the whole attention matrix,
    which is fine at 64 tokens."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def test_native_file_exports_as_diffusers_own_loader_reads_the_model(native, tmp_path):
    model, _, _, ours = native
    assert_same_tensors(load_file(ours / WEIGHTS), model.state_dict())
    model.save_pretrained(tmp_path / "theirs")
    for name in (WEIGHTS, "config.json"):
        assert (ours / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name
    with torch.no_grad(), eager_flex_attention():
        expected = Kandinsky6SRTransformer3DModel.from_pretrained(tmp_path / "theirs").eval()(**forward_inputs())
        got = Kandinsky6SRTransformer3DModel.from_pretrained(ours).eval()(**forward_inputs())
    assert torch.equal(got.sample, expected.sample) and expected.sample.std() > 0


def test_to_original_round_trips_byte_for_byte(native, tmp_path, cli):
    _, path, base, ours = native
    result = cli(ours, tmp_path / "original", "--to", "original", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md", NATIVE_FILE]
    assert (tmp_path / "original" / NATIVE_FILE).read_bytes() == path.read_bytes()
    result = cli(tmp_path / "original", tmp_path / "again", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    for name in (WEIGHTS, "config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (ours / name).read_bytes(), name


def test_a_dcp_save_of_a_native_fine_tune_exports_its_weights(native, tmp_path, cli):
    """A fine-tune under the native names (a trainer on the repository's DiT): one AdamW step of the Diffusers model's
    output head on its output (the rest frozen: PyTorch's flex attention has no backward on CPU), saved by dcp.save
    as each rank writes its shard (one process here). The export is the trained weights exactly, in the family's
    bf16 policy."""
    import torch.distributed.checkpoint as dcp

    _, _, base, ours = native
    model = Kandinsky6SRTransformer3DModel.from_pretrained(ours).train().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.out_layer.requires_grad_(True).parameters(), lr=1e-2)
    with eager_flex_attention():
        model(**forward_inputs()).sample.square().mean().backward()
    optimizer.step()
    trained = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": {sr_native_name(n): t for n, t in trained.items()}, "step": 1},
                 checkpoint_id=str(tmp_path / "run" / "step-1"))
    result = cli(tmp_path / "run" / "step-1", tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    from cogexport.precision import PrecisionPolicy

    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    written = load_file(tmp_path / "out" / WEIGHTS)
    assert_same_tensors(written, {n: t.to(policy.target_dtype(n, t.dtype)) for n, t in trained.items()})
    assert not torch.equal(trained["out_layer.out_layer.weight"], load_file(ours / WEIGHTS)["out_layer.out_layer.weight"])
    assert written["pooled_bias"].dtype == torch.float32 and written[
        "visual_transformer_blocks.1.visual_modulation.out_layer.weight"].dtype == torch.float32
    assert written["visual_transformer_blocks.1.self_attention.to_query.weight"].dtype == torch.bfloat16


def test_bad_kandinsky6_sr_input(native, tmp_path, cli):
    model, path, base, _ = native
    assert_refused(cli, tmp_path, [path, tmp_path / "out"], "model_dim 16", "--base", inputs=[path])
    truncated = {sr_native_name(n): t for n, t in model.state_dict().items() if "blocks.1.feed_forward.out" not in
                 sr_native_name(n)}
    broken = native_file(tmp_path / "broken" / NATIVE_FILE, truncated, rename=lambda n: n)
    assert_refused(cli, tmp_path, [broken, tmp_path / "out", "--base", base],
                   "visual_transformer_blocks.1.feed_forward.net.2.weight", inputs=[broken])


def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


@pytest.mark.parametrize("name", ["Kandinsky-6.0-VSR-distilled2steps-5s", "Kandinsky-6.0-VSR-5s"])
def test_published_variants_are_read_off_the_native_shapes(name):
    config = FAMILY.transformer_config(FAMILY.variant_named(name))
    shapes = build_target(FAMILY.transformer.class_name, config).schema
    tensors = {sr_native_name(n): LazyTensor(shape, torch.bfloat16, _never_read) for n, shape in shapes.items()}
    transformer = plan_transformer(tensors, ExportOptions(), "meta")
    assert transformer.variant.name == name and transformer.published and len(transformer.tensors) == len(shapes)
    built = dict(transformer.target.config)
    assert json.loads(json.dumps({k: built[k] for k in config})) == json.loads(json.dumps(config))


def test_tables_never_match_another_familys_keys():
    """Of every table, ours alone are taken for our names (both layouts), and no table of another family fits them
    (a family's names against ours: that family's own test of this name, where it has one)."""
    shapes = build_target(FAMILY.transformer.class_name, FAMILY.transformer_config(FAMILY.variants[0])).schema
    ours = {"kandinsky6_sr/original_transformer": [sr_native_name(n) for n in shapes],
            "kandinsky6_sr/diffusers_transformer": list(shapes)}
    for name, keys in ours.items():
        assert [t.name for _, t in preferred_tables(keys, component_tables("transformer"))] == [name]
    for other in families():
        if other.key != FAMILY.key:
            for keys in ours.values():
                assert fitting_tables(keys, component_tables("transformer", other)) == [], other.name
