"""MiniMax-H3's Ref2VA LoRA adapters: the pipeline holds two transformers (transformer/ for FL2VA, transformer_ref/ for
Ref2VA), and a Diffusers-layout adapter names the one it adapts by its keys' prefix. SimpleTuner's Ref2VA run
(simpletuner/helpers/models/minimaxh3/, at bghira/SimpleTuner bc8e6ab7: its MiniMaxH3Ref2VAModularPipeline has
transformer_name "transformer_ref", and its save_lora_weights packs the layers and the adapter metadata, with
swiglu_gate_first, under that prefix) writes transformer_ref.transformer_blocks.0.attn.to_q.lora_A.weight and
lora_adapter_metadata keyed transformer_ref.<field>: what Diffusers' MiniMaxH3LoraLoaderMixin.save_lora_weights writes
for transformer_ref_lora_layers, which the tests use to write it.

Judged by Diffusers (the modular pipeline's load_lora_weights, which routes such a file into transformer_ref, then its
fuse_lora; load_lora_adapter with prefix "transformer_ref" on the Ref2VA transformer), PEFT's merge of the written PEFT
adapter, and W + (alpha / r) B A in PEFT's order (fp32, torch.equal); the forward of the model with the adapter loaded
against the fused model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_refused
from lora_helpers import assert_all_equal, merged, peft_fused, peft_patterns, random_modules
from minimax_h3_fixtures import diffusers_config, diffusers_forward, packed_inputs
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_minimax_h3_pipeline import modular_base

WEIGHTS = "diffusion_pytorch_model.safetensors"
MODULES = [f"transformer_blocks.{i}.{m}" for i in range(2)
           for m in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """A tiny MiniMaxH3ModularPipeline folder (its transformer/ and transformer_ref/ of different weights) and
    SimpleTuner's Ref2VA adapter for it (transformer_ref.-prefixed keys and metadata), and the same adapter as a
    transformer.-prefixed file (what every other trainer and Diffusers' converter write)."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    folder = tmp_path_factory.mktemp("minimax_h3_ref2va")
    base = modular_base(folder / "base")
    weights = load_file(base / "transformer_ref" / WEIGHTS)
    modules = random_modules({name: tensor.shape for name, tensor in weights.items()}, MODULES, 11,
                             ((4, 8.0), (2, 2.0)))
    layers = {f"{m}.lora_{part}.weight": t.clone() for m, (a, b, _, _) in modules.items()
              for part, t in (("A", a), ("B", b))}
    recorded = {**peft_patterns(modules), "swiglu_gate_first": False}  # SimpleTuner's Diffusers transformer
    MiniMaxH3LoraLoaderMixin.save_lora_weights(folder / "ref2va", transformer_ref_lora_layers=layers,
                                               transformer_ref_lora_adapter_metadata=recorded)
    MiniMaxH3LoraLoaderMixin.save_lora_weights(folder / "plain", transformer_lora_layers=layers,
                                               transformer_lora_adapter_metadata=recorded)
    truth = {m: (a, b, alpha / rank) for m, (a, b, rank, alpha) in modules.items()}
    return {"base": base, "truth": truth, "ref2va": folder / "ref2va" / "pytorch_lora_weights.safetensors",
            "plain": folder / "plain" / "pytorch_lora_weights.safetensors"}


def diffusers_loaded(run: dict, adapter: Path):
    """The Ref2VA transformer with the adapter loaded by Diffusers as its load_lora_weights routes a
    transformer_ref.-prefixed file (load_lora_adapter with that prefix, the file's metadata as its LoraConfig)."""
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(adapter, return_lora_metadata=True)
    assert all(name.startswith("transformer_ref.") for name in state)
    model = MiniMaxH3Transformer3DModel.from_pretrained(run["base"] / "transformer_ref").eval()
    model.load_lora_adapter(state, prefix="transformer_ref", metadata=metadata, adapter_name="trained")
    assert any("lora_A" in name for name, _ in model.named_parameters()), "Diffusers loaded no LoRA layers"
    return model


def test_a_ref2va_lora_fuses_into_the_pipelines_transformer_ref_as_diffusers_and_peft_do(run, cli, tmp_path):
    """No --model-type: the prefix says Ref2VA, so the adapter goes into transformer_ref/ and transformer/ stays the
    base's. Fused: W + scale B A exactly, what the modular pipeline's load_lora_weights and fuse_lora make of the
    written adapter and PEFT's merge of the written PEFT adapter too. The same adapter prefixed transformer. goes into
    transformer/."""
    from diffusers import MiniMaxH3Transformer3DModel, ModularPipeline

    result = cli(run["ref2va"], tmp_path / "fused", "--base", run["base"], "--lora", "fuse", "--dtype", "fp32",
                 "--component", "pipeline")
    assert result.exit_code == 0, result.stderr
    base = load_file(run["base"] / "transformer_ref" / WEIGHTS)
    ours = load_file(tmp_path / "fused" / "transformer_ref" / WEIGHTS)
    assert_all_equal(ours, merged(base, run["truth"]))
    assert (tmp_path / "fused" / "transformer" / WEIGHTS).read_bytes() == \
        (run["base"] / "transformer" / WEIGHTS).read_bytes()  # FL2VA's, the base's
    # Diffusers' own loader refuses SimpleTuner's file (its LoraConfig takes no swiglu_gate_first): it loads the
    # adapter cogexport writes for it, which records the LoraConfig alone. The modular pipeline's load_lora_weights
    # routes it by its prefix into transformer_ref alone.
    assert cli(run["ref2va"], tmp_path / "adapter").exit_code == 0
    pipeline = ModularPipeline.from_pretrained(run["base"])
    pipeline.load_components(names=["transformer", "transformer_ref"], dtype=torch.float32)
    pipeline.load_lora_weights(str(tmp_path / "adapter" / "pytorch_lora_weights.safetensors"), adapter_name="trained")
    assert not any("lora_A" in name for name, _ in pipeline.transformer.named_parameters())
    given = packed_inputs(seed=5)
    with_adapter = diffusers_forward(pipeline.transformer_ref.eval(), given)
    fused_model = MiniMaxH3Transformer3DModel.from_pretrained(tmp_path / "fused" / "transformer_ref").eval()
    assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-4)  # unfused LoRA adds B A x in another order
               for a, b in zip(diffusers_forward(fused_model, given), with_adapter))
    pipeline.fuse_lora(components=["transformer_ref"], lora_scale=1.0)
    pipeline.unload_lora_weights()
    assert_all_equal(ours, pipeline.transformer_ref.state_dict())
    assert cli(run["ref2va"], tmp_path / "peft", "--lora-format", "peft").exit_code == 0
    assert_all_equal(ours, peft_fused(MiniMaxH3Transformer3DModel, diffusers_config(), base, tmp_path / "peft"))
    # verify of the pipeline folder checks the transformer the file names
    checked = cli("verify", tmp_path / "fused", "--against", run["ref2va"], "--base", run["base"])
    assert checked.exit_code == 0 and "transformer_ref" in checked.stdout, checked.stdout + checked.stderr
    # the default prefix says nothing: without --model-type that file is FL2VA's, as Diffusers' loader routes it
    result = cli(run["plain"], tmp_path / "fl2va", "--base", run["base"], "--lora", "fuse", "--dtype", "fp32",
                 "--component", "pipeline")
    assert result.exit_code == 0, result.stderr
    assert_all_equal(load_file(tmp_path / "fl2va" / "transformer" / WEIGHTS),
                     merged(load_file(run["base"] / "transformer" / WEIGHTS), run["truth"]))
    assert (tmp_path / "fl2va" / "transformer_ref" / WEIGHTS).read_bytes() == \
        (run["base"] / "transformer_ref" / WEIGHTS).read_bytes()


@pytest.mark.parametrize("given", ["ref2va", "plain"])
def test_a_diffusers_adapter_for_ref2va_is_written_under_transformer_ref_and_loads_with_the_fused_output(
        given, run, cli, tmp_path):
    """SimpleTuner's file, read without --model-type, and a transformer.-prefixed file told --model-type ref2va: both
    written as the Ref2VA transformer's (keys and metadata under transformer_ref.), the same tensors, and Diffusers
    loads the written file into the Ref2VA transformer with the fused model's output."""
    told = ["--model-type", "ref2va"] if given == "plain" else []
    result = cli(run[given], tmp_path / "adapter", "--base", run["base"], *told)
    assert result.exit_code == 0, result.stderr
    written = tmp_path / "adapter" / "pytorch_lora_weights.safetensors"
    assert_all_equal(load_file(written), load_file(run["ref2va"]))
    with safe_open(written, "pt") as handle:
        recorded = json.loads(handle.metadata()["lora_adapter_metadata"])
    assert "transformer_ref.r" in recorded and all(key.startswith("transformer_ref.") for key in recorded)
    # fused without --component pipeline: the Ref2VA transformer alone, from --base's transformer_ref/
    fused = cli(run[given], tmp_path / "fused", "--base", run["base"], "--lora", "fuse", "--dtype", "fp32", *told)
    assert fused.exit_code == 0, fused.stderr
    expected = merged(load_file(run["base"] / "transformer_ref" / WEIGHTS), run["truth"])
    assert_all_equal(load_file(tmp_path / "fused" / WEIGHTS), expected)
    # --base the Ref2VA transformer folder itself: the same model
    alone = cli(run[given], tmp_path / "alone", "--base", run["base"] / "transformer_ref", "--lora", "fuse", "--dtype",
                "fp32", *told)
    assert alone.exit_code == 0, alone.stderr
    assert_all_equal(load_file(tmp_path / "alone" / WEIGHTS), expected)
    from diffusers import MiniMaxH3Transformer3DModel

    given_inputs = packed_inputs(seed=6)
    fused_model = MiniMaxH3Transformer3DModel.from_pretrained(tmp_path / "fused").eval()
    assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in
               zip(diffusers_forward(fused_model, given_inputs),
                   diffusers_forward(diffusers_loaded(run, written), given_inputs)))
    checked = cli("verify", tmp_path / "adapter", "--against", run[given], "--base", run["base"])
    assert checked.exit_code == 0, checked.stdout + checked.stderr


def test_a_ref2va_fuse_takes_its_config_from_transformer_ref_too(run, cli, tmp_path):
    """A pipeline whose two transformers differ in size (its transformer/ one block deep): the Ref2VA adapter is
    checked against, and fused into, transformer_ref/'s model, never planned on transformer/'s config; so is the
    adapter written alone."""
    import shutil

    from diffusers import MiniMaxH3Transformer3DModel

    base = Path(shutil.copytree(run["base"], tmp_path / "base", ignore=shutil.ignore_patterns("transformer")))
    MiniMaxH3Transformer3DModel.from_config({**diffusers_config(), "num_layers": 1}).save_pretrained(
        base / "transformer")
    result = cli(run["ref2va"], tmp_path / "fused", "--base", base, "--lora", "fuse", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_all_equal(load_file(tmp_path / "fused" / WEIGHTS),
                     merged(load_file(base / "transformer_ref" / WEIGHTS), run["truth"]))
    result = cli(run["ref2va"], tmp_path / "adapter", "--base", base)  # the adapter checked against it too
    assert result.exit_code == 0, result.stderr


def _rewritten(run: dict, path: Path, keys, recorded) -> Path:
    """SimpleTuner's Ref2VA file with its keys renamed by ``keys`` and its metadata by ``recorded``."""
    with safe_open(run["ref2va"], "pt") as handle:
        metadata, tensors = handle.metadata(), {key: handle.get_tensor(key) for key in handle.keys()}
    config = json.loads(metadata["lora_adapter_metadata"])
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({keys(key): tensor for key, tensor in tensors.items()}, path,
              metadata={**metadata, "lora_adapter_metadata": json.dumps(recorded(config))})
    return path


def _other_half(key: str) -> str:
    """Half the blocks' keys named for the other transformer: a file holding two components' adapters."""
    return key.replace("transformer_ref.", "transformer.", 1) if ".1." in key else key


def _as_fl2va(config: dict) -> dict:
    return {key.replace("transformer_ref.", "transformer."): value for key, value in config.items()}


FUSE = ["--lora", "fuse", "--base"]  # + the base pipeline
REFUSALS = {  # (keys, metadata, options, phrases of the error line)
    "model type": (str, dict, [*FUSE, "--model-type", "fl2va"],
                   ("transformer_ref", "--model-type fl2va", "--model-type ref2va")),
    "model name": (str, dict, ["--model-name", "MiniMax-H3-FL2VA"],
                   ("transformer_ref", "--model-name MiniMax-H3-FL2VA")),
    "mixed keys": (_other_half, dict, FUSE, ("2 pipeline components", "transformer.", "transformer_ref.")),
    "mixed metadata": (str, lambda config: {**config, **_as_fl2va(config)}, FUSE,
                       ("lora_adapter_metadata", "2 pipeline components")),
    "keys and metadata differ": (str, _as_fl2va, FUSE, ("transformer_ref", "lora_adapter_metadata", "rename")),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_ref2va_lora_that_contradicts_itself_or_the_model_type_is_refused(case, run, cli, tmp_path):
    """Which transformer an adapter is for is never guessed: a prefix naming another task than --model-type's (or
    --model-name's), keys or adapter configs of both transformers in one file, keys and metadata naming different
    ones: each refused in one line, nothing written."""
    keys, recorded, options, phrases = REFUSALS[case]
    lora = _rewritten(run, tmp_path / "given" / "lora.safetensors", keys, recorded)
    options = [value for option in options for value in ((option, run["base"]) if option == "--base" else (option,))]
    assert_refused(cli, tmp_path, [lora, tmp_path / "out", *options], *phrases, inputs=[lora, run["base"]])


def test_a_ref2va_fine_tune_into_a_pipeline_takes_its_config_from_transformer_ref(run, cli, tmp_path):
    """Not a LoRA: a Ref2VA transformer fine-tuned whole, exported with --model-type ref2va and a --base pipeline
    whose transformer/ is one block deep: the pipeline written, its transformer_ref/ planned on transformer_ref/'s
    config, where it used to be checked against transformer/'s and refused."""
    import shutil

    from diffusers import MiniMaxH3Transformer3DModel

    base = Path(shutil.copytree(run["base"], tmp_path / "base", ignore=shutil.ignore_patterns("transformer")))
    MiniMaxH3Transformer3DModel.from_config({**diffusers_config(), "num_layers": 1}).save_pretrained(
        base / "transformer")
    trained = base / "transformer_ref" / WEIGHTS
    result = cli(trained, tmp_path / "out", "--base", base, "--model-type", "ref2va", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_all_equal(load_file(tmp_path / "out" / "transformer_ref" / WEIGHTS), load_file(trained))
    written = json.loads((tmp_path / "out" / "transformer_ref" / "config.json").read_text())
    assert written["num_layers"] == json.loads((base / "transformer_ref" / "config.json").read_text())["num_layers"]
