"""Model cards true to the output: each card is parsed with huggingface_hub's ModelCard, and the snippet it gives is
run on the tiny output (a snippet that loads the wrong config or passes a deprecated argument fails here)."""

from __future__ import annotations

import warnings

import pytest
import torch
from cogvideox_fixtures import tiny_pipeline, write_sat_run
from huggingface_hub import ModelCard
from quantized_models import FAMILIES
from safetensors.torch import load_file
from test_gguf_diffusers import dequantized_state

from cogexport.exporter import export

FOLDER = "path/to/this/folder"  # what a card's snippet names the output by


def card_of(folder) -> ModelCard:
    card = ModelCard.load(folder / "README.md")
    assert str(card) == (folder / "README.md").read_text(encoding="utf-8")  # what ModelCard itself writes
    return card


def run_snippet(card: ModelCard, folder) -> dict:
    """The card's Python snippet run with the output's path in place of its placeholder: the names it defines.
    A FutureWarning (Diffusers' deprecations, torch_dtype= among them) fails it."""
    code = card.text.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert "torch_dtype" not in code and FOLDER in code
    names: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        exec(code.replace(FOLDER, str(folder)), names)
    return names


def test_a_transformer_export_has_a_card_whose_snippet_loads_it(tmp_path):
    base = tiny_pipeline("t2v")
    weights = load_file(base / "transformer" / "diffusion_pytorch_model.safetensors")
    write_sat_run(tmp_path / "run", {name: tensor + 1 for name, tensor in weights.items()}, iteration=40)
    export(tmp_path / "run", tmp_path / "out", base=base, component="transformer", base_model="someone/tiny")
    card = card_of(tmp_path / "out")
    assert card.data.base_model == "someone/tiny"
    assert card.data.to_dict()["base_model_relation"] == "finetune"  # a SAT run at iteration 40: trained
    assert "fine-tune" in card.text.splitlines()[1] or "fine-tune" in card.text
    loaded = run_snippet(card, tmp_path / "out")["transformer"]
    assert loaded.dtype == torch.bfloat16
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert all(torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16)) for name, tensor in written.items())


def test_a_conversion_of_plain_weights_is_not_carded_a_finetune(tmp_path):
    """A model folder (no training step, as a release converted) names its base model and no relation: the Hub
    allows adapter, merge, quantized and finetune, and a conversion is none of them."""
    base = tiny_pipeline("t2v")
    export(base / "transformer", tmp_path / "out", base_model="someone/tiny")
    card = card_of(tmp_path / "out")
    assert card.data.base_model == "someone/tiny"
    assert "base_model_relation" not in card.data.to_dict()
    assert "fine-tune" not in card.text.split("## Use")[0].replace("claims no fine-tune", "")
    assert run_snippet(card, tmp_path / "out")["transformer"].dtype == torch.bfloat16


def test_a_pipeline_card_loads_with_dtype(tmp_path):
    base = tiny_pipeline("t2v")
    weights = load_file(base / "transformer" / "diffusion_pytorch_model.safetensors")
    write_sat_run(tmp_path / "run", weights)
    export(tmp_path / "run", tmp_path / "out", base=base)
    pipe = run_snippet(card_of(tmp_path / "out"), tmp_path / "out")["pipe"]
    assert pipe.transformer.dtype == torch.bfloat16


@pytest.fixture(scope="module")
def custom_wan(tmp_path_factory):
    """A tiny Wan transformer of no published size, saved as Diffusers saves it."""
    family = FAMILIES["wan"]
    model = family.build()
    folder = tmp_path_factory.mktemp("wan")
    model.save_pretrained(folder / "model")
    return model, folder / "model"


def test_a_custom_size_gguf_is_named_and_carded_as_one(custom_wan, cli, tmp_path):
    """Not named after the published model whose layout it has, its card's snippet builds the model from the config
    written beside the file (the published model's Hub config has other shapes), and inspect agrees."""
    model, folder = custom_wan
    result = cli(folder, tmp_path / "out", "--to", "gguf", "--quant", "Q8_0")
    assert result.exit_code == 0, result.stderr
    (path,) = (tmp_path / "out").rglob("*.gguf")
    assert path.name == "Wan-custom-size-Q8_0.gguf"
    inspected = cli("inspect", path)
    assert "unpublished size" in inspected.stdout
    card = card_of(tmp_path / "out")
    assert card.data.base_model is None and "base_model_relation" not in card.data.to_dict()
    loaded = run_snippet(card, tmp_path / "out")["transformer"]
    weights = dequantized_state(loaded)
    assert {name: t.shape for name, t in weights.items()} == {name: t.shape for name, t in model.state_dict().items()}
    assert cli("verify", tmp_path / "out", "--against", folder).exit_code == 0


def test_a_quantized_file_of_plain_weights_is_a_quantized_copy(custom_wan, cli, tmp_path):
    """A GGUF of weights with no training recorded, its base model named: 'quantized', the relation that holds."""
    _, folder = custom_wan
    assert cli(folder, tmp_path / "out", "--to", "gguf", "--quant", "F16", "--base-model", "someone/tiny").exit_code == 0
    card = card_of(tmp_path / "out")
    assert card.data.base_model == "someone/tiny" and card.data.to_dict()["base_model_relation"] == "quantized"


def test_each_expert_of_a_custom_size_pair_loads_with_its_own_config(cli, tmp_path):
    from wan_fixtures import tiny_wan_pipeline

    pipeline = tiny_wan_pipeline("t2v-a14b")
    assert cli(pipeline, tmp_path / "out", "--to", "gguf", "--quant", "F16").exit_code == 0
    for expert in ("high_noise_model", "low_noise_model"):
        assert (tmp_path / "out" / expert / "config" / "config.json").is_file()
        assert [path.name for path in (tmp_path / "out" / expert).glob("*.gguf")] == ["Wan-custom-size-F16.gguf"]
    names = run_snippet(card_of(tmp_path / "out"), tmp_path / "out")
    for component in ("transformer", "transformer_2"):
        weights = dequantized_state(names[component])
        truth = load_file(pipeline / component / "diffusion_pytorch_model.safetensors")
        assert {name: t.shape for name, t in weights.items()} == {name: t.shape for name, t in truth.items()}


@pytest.mark.parametrize("variant", ["t2v", "t2v-a14b"])
def test_an_original_layout_has_a_card_whose_snippet_reads_its_files(variant, tmp_path):
    """--to original writes the release's own files, which no Diffusers class reads as they are: the card names no
    Diffusers library, and its snippet reads every tensor of the files (each expert's of a two-expert release)."""
    from wan_fixtures import tiny_wan_pipeline

    from cogexport.exporter import export_original

    export_original(tiny_wan_pipeline(variant), tmp_path / "out", progress=False)
    card = card_of(tmp_path / "out")
    assert card.data.library_name is None and "relation" not in str(card.data.to_dict())
    tensors = run_snippet(card, tmp_path / "out")["tensors"]
    files = sorted((tmp_path / "out").rglob("*.safetensors"))
    read = {path.parent.name: tensors[path.parent.name] for path in files} if len(files) > 1 else {"out": tensors}
    for path in files:
        written = load_file(path)
        assert read[path.parent.name].keys() == written.keys()
        assert all(torch.equal(read[path.parent.name][name], tensor) for name, tensor in written.items())
