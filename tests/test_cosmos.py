"""NVIDIA Cosmos Predict 2 / 2.5: NVIDIA's net.-named files (convert_distcp_to_pt.py's model.pt with net and net_ema,
model_ema_fp32.pt, model_ema_bf16.pt) into Diffusers' CosmosTransformer3DModel, judged by Diffusers' own single-file
converter and by an independent writer of the layout (scripts/make_tiny_cosmos.py); the buffers Diffusers has no place
for kept beside and given back by --to original; the published variants from full-size shapes; bad input."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from cosmos_fixtures import imaginaire_run, truth
from fixtures import SCRIPTS
from safetensors.torch import load_file

from cogexport.exporter import ExportOptions
from cogexport.exporter.parts import plan_transformer
from cogexport.keymap.plan import translate_shapes
from cogexport.keymap.table import load_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables
from cogexport.models.target import build_target
from cogexport.precision import PrecisionPolicy

sys.path.insert(0, str(SCRIPTS))
from make_tiny_cosmos import (build_transformer, original_name, release_buffers,  # noqa: E402
                              release_state_dict, write_release_files)

FAMILY = family_named("cosmos")
WEIGHTS = "diffusion_pytorch_model.safetensors"
BUFFERS = "original_buffers.safetensors"


def judge(checkpoint: dict) -> dict:
    """Diffusers' single-file conversion of NVIDIA's layout (a rename with no size hard-coded)."""
    from diffusers.loaders.single_file_utils import convert_cosmos_transformer_checkpoint_to_diffusers

    return convert_cosmos_transformer_checkpoint_to_diffusers(dict(checkpoint))


def load_release(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.fixture(scope="module", params=["2", "2.5"])
def run(request, tmp_path_factory):
    """convert_distcp_to_pt.py's three files of a tiny run (net: seed 0, net_ema: seed 1) and the EMA model saved by
    Diffusers (the --base config and the truth)."""
    folder = tmp_path_factory.mktemp(f"cosmos-{request.param}")
    trained, ema = build_transformer(request.param, seed=0), build_transformer(request.param, seed=1)
    ema.save_pretrained(folder / "ema")
    files = write_release_files(folder / "release", trained, ema)
    return {"folder": folder, "base": folder / "ema", "trained": trained.state_dict(), "ema": ema.state_dict(),
            **files}


def test_independent_writer_agrees_with_diffusers_converter(run):
    """The ground truth's names: Diffusers' converter reads the independently written file back to the model."""
    assert_same_tensors(judge(load_release(run["model_ema_fp32.pt"])), run["ema"])


def test_fp32_release_exports_to_diffusers_conversion_and_keeps_the_buffers(run, tmp_path, cli):
    release = load_release(run["model_ema_fp32.pt"])
    result = cli(run["model_ema_fp32.pt"], tmp_path / "out", "--base", run["base"], "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), judge(release))
    # Diffusers' own save of the same model, file for file (config included)
    for path in run["base"].iterdir():
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes(), path.name
    # every tensor the converter drops is kept, as it was, beside the model
    kept = {f"net.{name}": tensor for name, tensor in load_file(tmp_path / "out" / BUFFERS).items()}
    assert_same_tensors(kept, {name: t for name, t in release.items() if name.removeprefix("net.") in
                               release_buffers(json.loads((run["base"] / "config.json").read_text()))})
    assert "Transformer Engine's serialised attention-operator state" in result.stdout


def test_bf16_release_round_trips_through_diffusers(run, tmp_path, cli):
    """model_ema_bf16.pt -> Diffusers (bf16) -> --to original: every tensor of the release back under its name, in
    its dtype, to the bit (the counters in int64, Transformer Engine's bytes in uint8)."""
    assert cli(run["model_ema_bf16.pt"], tmp_path / "diffusers", "--base", run["base"]).exit_code == 0
    result = cli("--to", "original", tmp_path / "diffusers", tmp_path / "back")
    assert result.exit_code == 0, result.stderr
    written = load_release(tmp_path / "back" / "model.pt")
    assert_same_tensors(written, load_release(run["model_ema_bf16.pt"]))
    assert_same_tensors(judge(written), load_file(tmp_path / "diffusers" / WEIGHTS))
    # verify both ways, Diffusers' converter as second opinion; the buffers written back count as read
    pairs = ((tmp_path / "diffusers", run["model_ema_bf16.pt"]), (tmp_path / "back", tmp_path / "diffusers"))
    for output, source in pairs:
        verified = cli("verify", output, "--against", source)
        assert verified.exit_code == 0 and "convert_cosmos_transformer_checkpoint_to_diffusers makes the same" in \
            verified.stdout, verified.stdout + verified.stderr


def test_to_original_without_the_kept_buffers_computes_the_rope_tables_and_says_what_it_cannot_write(run, tmp_path,
                                                                                                    cli):
    """From a plain Diffusers folder: the RoPE tables from the config, as NVIDIA's network makes them; the training
    counters and Transformer Engine's state named as not written."""
    result = cli("--to", "original", run["base"], tmp_path / "back", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert "has no original_buffers.safetensors" in result.stderr and "accum_iteration" in result.stderr
    assert "pos_embedder.seq, pos_embedder.dim_spatial_range, pos_embedder.dim_temporal_range are computed" \
        in result.stderr
    written = load_release(tmp_path / "back" / "model.pt")
    assert not [name for name in written if "accum_" in name or "_extra_state" in name]
    release = load_release(run["model_ema_fp32.pt"])
    assert_same_tensors({name: t for name, t in written.items() if "pos_embedder" in name},
                        {name: t for name, t in release.items() if "pos_embedder" in name})
    assert_same_tensors(judge(written), run["ema"])


@pytest.mark.parametrize("how, weights", [([], "trained"), (["--role", "net"], "trained"), (["--ema"], "ema"),
                                          (["--role", "net_ema"], "ema")])
def test_model_pt_takes_net_or_the_set_asked_for(run, tmp_path, cli, how, weights):
    """model.pt keeps both sets: net (the trained weights) unless the EMA is asked for, and a note says so when
    nothing asked."""
    result = cli(run["model.pt"], tmp_path / "out", "--base", run["base"], "--dtype", "fp32", *how)
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), run[weights])
    assert ("read net.*; --ema reads the EMA" in result.stderr) == (not how)


def test_a_set_model_pt_does_not_hold_is_refused(run, tmp_path, cli):
    assert_refused(cli, tmp_path, [run["model.pt"], tmp_path / "out", "--base", run["base"], "--role", "student"],
                   "holds no 'student' weights; it holds two sets of weights, net.* (the trained weights) and "
                   "net_ema.* (their EMA)", inputs=[run["model.pt"]])


def test_a_release_without_base_is_not_a_published_size(run, tmp_path, cli):
    assert_refused(cli, tmp_path, [run["model_ema_bf16.pt"], tmp_path / "out"], "pass --base",
                   inputs=[run["model_ema_bf16.pt"]])


# -- the published variants, from full-size shapes (meta tensors: nothing allocated) ------------------------------
def _never_read() -> torch.Tensor:
    raise AssertionError("planning must not read tensor data")


@pytest.mark.parametrize("variant", [v.name for v in FAMILY.variants])
def test_published_variant_is_read_off_the_release_shapes(variant):
    published = next(v for v in FAMILY.variants if v.name == variant)
    config = FAMILY.transformer_config(published)
    from diffusers import CosmosTransformer3DModel

    with torch.device("meta"):
        model = CosmosTransformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    shapes = {f"net.{original_name(name)}": t.shape for name, t in model.state_dict().items()}
    shapes.update({f"net.{name}": t.shape for name, t in release_buffers(dict(model.config)).items()})
    checkpoint = {name: LazyTensor(shape, torch.bfloat16, _never_read) for name, shape in shapes.items()}
    transformer = plan_transformer(checkpoint, ExportOptions(), "meta")
    assert transformer.variant.name == variant and transformer.published
    assert transformer.target.config["extra_pos_embed_type"] is None
    assert len(transformer.tensors) == len(model.state_dict())


def test_predict_2_5_takes_its_own_scheduler():
    variant = next(v for v in FAMILY.variants if v.name == "Cosmos-Predict2.5-2B")
    assert FAMILY.scheduler_class_for(variant) == "UniPCMultistepScheduler"
    assert FAMILY.scheduler_for(variant)["use_flow_sigmas"] is True
    predict2 = next(v for v in FAMILY.variants if v.task == "v2w")
    assert FAMILY.scheduler_class_for(predict2) == "FlowMatchEulerDiscreteScheduler"


def test_fp32_allowlist_is_the_classs_own():
    from diffusers import CosmosTransformer3DModel

    assert FAMILY.transformer.keep_fp32 == tuple(CosmosTransformer3DModel._keep_in_fp32_modules)
    with torch.device("meta"):
        model = CosmosTransformer3DModel(num_layers=1)  # the class's default: with the learnable embedding
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    kept = {name for name, t in model.state_dict().items() if policy.target_dtype(name, t.dtype) == torch.float32}
    assert kept == {name for name in model.state_dict() if name.startswith("learnable_pos_embed.")}


def _keys_of(family) -> dict[str, list[str]]:
    """Names in each of a family's own transformer layouts (its tables run backwards from its first variant)."""
    spec = family.transformer
    target = build_target(spec.class_name, family.transformer_config(family.variants[0]))
    return {name: [*translate_shapes(load_table(name).inverted(), target.schema, target.counts)]
            for name in spec.tables if name.startswith(f"{family.key}/")}


def test_tables_never_match_another_familys_keys():
    ours = _keys_of(FAMILY)
    for other in families():
        if other.key == FAMILY.key:
            continue
        for name, keys in _keys_of(other).items():
            assert fitting_tables(keys, component_tables("transformer", FAMILY)) == [], name
        for name, keys in ours.items():
            assert fitting_tables(keys, component_tables("transformer", other)) == [], (name, other.name)
    for name, keys in ours.items():
        assert {table.name for _, table in fitting_tables(keys, component_tables("transformer"))} == {name}


# -- imaginaire's run: 2 ranks under FSDP2, two iterations of model/, optim/, scheduler/, trainer/ ----------------
def _in_fp32(tensors: dict) -> dict:
    return {name: t.float() if t.is_floating_point() else t for name, t in tensors.items()}


@pytest.mark.parametrize("how, weight_set", [(["--ema"], "net_ema"), ([], "net")])
def test_imaginaire_run_exports_the_newest_iteration(tmp_path, cli, how, weight_set):
    """The run folder: the iteration latest_checkpoint.txt names, net or the EMA asked for, exactly Diffusers'
    conversion of the weights gathered in training (net was trained in bf16: exact to its bf16 values)."""
    run = imaginaire_run()
    result = cli(run / "run", tmp_path / "out", "--base", run / "base", "--dtype", "fp32", *how)
    assert result.exit_code == 0, result.stderr
    assert "read iter_000000002, the iteration latest_checkpoint.txt names" in result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), _in_fp32(judge(truth(2, weight_set))))
    # the training counters (net's counted two iterations, the EMA's never moved) and the rest, kept beside
    kept = {f"net.{name}": t for name, t in load_file(tmp_path / "out" / BUFFERS).items()}
    assert_same_tensors(kept, {name: t for name, t in truth(2, weight_set).items() if name in kept})
    assert len(kept) == 9 and kept["net.accum_iteration"] - truth(2, "net_ema")["net.accum_iteration"] == \
        (2 if weight_set == "net" else 0)


def test_imaginaire_reference_path_agrees(tmp_path, cli):
    """NVIDIA's own path (convert_distcp_to_pt.py: torch DCP's dcp_to_torch_save, net_ema renamed to net) then
    Diffusers' converter gives what cogexport exports from the iteration's model/ folder."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    model = imaginaire_run() / "run" / "checkpoints" / "iter_000000002" / "model"
    dcp_to_torch_save(model, tmp_path / "model.pt")
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    ema = {"net." + name.removeprefix("net_ema."): t for name, t in saved.items() if name.startswith("net_ema.")}
    assert_same_tensors(ema, truth(2, "net_ema"))  # DCP's own reader and the training process agree
    result = cli(model, tmp_path / "out", "--base", imaginaire_run() / "base", "--dtype", "fp32", "--ema")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), judge(ema))


def test_imaginaire_tag_names_an_older_iteration(tmp_path, cli):
    run = imaginaire_run()
    iteration = run / "run" / "checkpoints" / "iter_000000001"
    for source, tag in ((run / "run", ["--tag", "iter_000000001"]), (iteration, [])):
        out = tmp_path / f"out-{len(tag)}"
        result = cli(source, out, "--base", run / "base", "--dtype", "fp32", "--ema", *tag)
        assert result.exit_code == 0, result.stderr
        assert_same_tensors(load_file(out / WEIGHTS), judge(truth(1, "net_ema")))
    assert not torch.equal(truth(1, "net_ema")["net.x_embedder.proj.1.weight"],
                           truth(2, "net_ema")["net.x_embedder.proj.1.weight"])


def test_imaginaire_training_state_is_refused(tmp_path, cli):
    run = imaginaire_run()
    iteration = run / "run" / "checkpoints" / "iter_000000002"
    for state in ("optim", "scheduler", "trainer"):
        assert_refused(cli, tmp_path, [iteration / state, tmp_path / "out", "--base", run / "base", "--ema"],
                       f"is the {state} state of imaginaire's iter_000000002, never model weights",
                       inputs=[iteration / state])


def test_imaginaire_run_without_ema_reads_its_net_and_refuses_ema(tmp_path, cli):
    """EMA disabled: model/ keeps net.* alone (saved here by dcp.save in one process), read without asking."""
    import torch.distributed.checkpoint as dcp

    model = build_transformer("2", seed=3)
    model.save_pretrained(tmp_path / "base")
    weights = release_state_dict(model)
    checkpoints = tmp_path / "job" / "checkpoints"
    dcp.save(weights, checkpoint_id=str(checkpoints / "iter_000000005" / "model"))
    (checkpoints / "latest_checkpoint.txt").write_text("iter_000000005\n")
    result = cli(tmp_path / "job", tmp_path / "exported", "--base", tmp_path / "base", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "exported" / WEIGHTS), model.state_dict())
    assert_refused(cli, tmp_path, [tmp_path / "job", tmp_path / "out", "--base", tmp_path / "base", "--ema"],
                   "holds no 'ema' weights (no net_ema.*: the run kept no EMA)", inputs=[tmp_path / "job"])
