"""Wan-Animate-2 both ways, judged by what cogexport does not make: the model is DiffSynth-Studio's own
WanAnimate2Transformer (the release's module tree), its state dict saved as the release file is; Diffusers' own
single-file converter (convert_wan_animate_2_transformer_to_diffusers) says what the Diffusers weights must be, and
Diffusers' WanAnimate2Transformer3DModel, loaded from the export, must compute what DiffSynth's model computes. The way
back is judged by the release file itself (byte for byte), LoRA fusing by PEFT merging the adapter into DiffSynth's
model, as DiffSynth-Studio's trainer wraps it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from diffsynth_models import diffsynth_module
from diffusers import WanAnimate2Transformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_animate_2_transformer_to_diffusers
from fixtures import SCRIPTS
from safetensors.torch import load_file, save_file

from cogexport.keymap.plan import translate_shapes
from cogexport.keymap.table import load_table
from cogexport.models.family import families, family_named
from cogexport.models.recognize import component_tables, fitting_tables, preferred_tables, read_facts
from cogexport.models.target import build_target

sys.path.insert(0, str(SCRIPTS))
from tiny_models import randomize_  # noqa: E402

FAMILY = family_named("wan_animate2")
RELEASE_FILE = "wan_animate_2_bf16.safetensors"
WEIGHTS = "diffusion_pytorch_model.safetensors"
# two blocks, 2 heads of 8; text_len short, so the padded text stays small. The CLIP projection is 1280 wide in both
# classes (a constant of their code), the largest tensor here.
SIZES = {"dim": 16, "ffn_dim": 32, "freq_dim": 8, "text_dim": 12, "num_heads": 2, "num_layers": 2, "in_dim": 36,
         "out_dim": 16, "text_len": 8}
# DiffSynth-Studio's Wan LoRA targets (its --lora_target_modules default for Wan DiTs) and the image keys
LORA_TARGETS = ["q", "k", "v", "o", "k_img", "v_img", "ffn.0", "ffn.2"]


def diffsynth_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return randomize_(diffsynth_module("wan_animate_2_dit").WanAnimate2Transformer(**SIZES), seed).eval()


def release_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}


def save_release(folder: Path, weights: dict[str, torch.Tensor]) -> Path:
    """wan_animate_2/wan_animate_2_bf16.safetensors as safetensors' save_file writes a PyTorch state dict."""
    path = folder / "wan_animate_2" / RELEASE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, path, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(DiffSynth's model, its release file, a --base folder holding the tiny config, the fp32 export)."""
    root = tmp_path_factory.mktemp("wan-animate2")
    model = diffsynth_model()
    path = save_release(root / "release", release_state_dict(model))
    WanAnimate2Transformer3DModel.from_config(SIZES).save_config(root / "base")
    from cogexport.exporter import export

    export(path, root / "fp32", base=root / "base", dtype="fp32")
    return model, path, root / "base", root / "fp32"


def converted(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return convert_wan_animate_2_transformer_to_diffusers(dict(weights))


def test_release_exports_to_what_diffusers_converter_makes(release, tmp_path, cli):
    """The release file (and the same names under ComfyUI's model.diffusion_model.) to Diffusers: exactly the
    converter's tensors, and the files save_pretrained writes of a model holding them, byte for byte."""
    model, path, base, ours = release
    expected = converted(release_state_dict(model))
    assert_same_tensors(load_file(ours / WEIGHTS), expected)
    reference = WanAnimate2Transformer3DModel.from_config(SIZES)
    reference.load_state_dict(expected, strict=True)
    reference.save_pretrained(tmp_path / "theirs")
    for name in (WEIGHTS, "config.json"):
        assert (ours / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name
    prefixed = save_release(tmp_path / "comfy", {f"model.diffusion_model.{n}": t for n, t in
                                                  release_state_dict(model).items()})
    result = cli(prefixed, tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "out" / WEIGHTS).read_bytes() == (ours / WEIGHTS).read_bytes()
    result = cli("verify", ours, "--against", path)  # verify asks the table's judge, the same converter
    assert result.exit_code == 0 and "convert_wan_animate_2_transformer_to_diffusers makes the same 87" in \
        result.stdout, result.stdout + result.stderr


def test_bf16_export_keeps_what_diffusers_keeps_in_fp32(release, tmp_path):
    """The default dtype: what WanAnimate2Transformer3DModel.from_pretrained(torch_dtype=bf16) then save_pretrained
    writes (its _keep_in_fp32_modules in fp32), byte for byte."""
    from cogexport.exporter import export

    _, path, base, ours = release
    export(path, tmp_path / "bf16", base=base)
    WanAnimate2Transformer3DModel.from_pretrained(ours, torch_dtype=torch.bfloat16).save_pretrained(tmp_path / "ref")
    assert (tmp_path / "bf16" / WEIGHTS).read_bytes() == (tmp_path / "ref" / WEIGHTS).read_bytes()
    kept = {n for n, t in load_file(tmp_path / "bf16" / WEIGHTS).items() if t.dtype == torch.float32}
    assert "blocks.1.modulation" in kept and "head.modulation" in kept and "blocks.0.self_attn.to_q.weight" not in kept


def forward_inputs(seed: int = 1) -> dict[str, torch.Tensor]:
    """A reference clip of 2 latent frames of 4x6 (16 latent and 20 condition channels), 5 text tokens, the 257
    CLIP tokens DiffSynth's cross-attention takes off the front of its context."""
    generator = torch.Generator().manual_seed(seed)

    def noise(*shape):
        return torch.randn(shape, generator=generator)

    return {"latents": noise(16, 2, 4, 6), "condition": noise(20, 2, 4, 6), "text": noise(5, SIZES["text_dim"]),
            "clip": noise(1, 257, 1280), "t": torch.tensor([500.0])}


def diffsynth_reference_pass(model, inputs) -> tuple[list, list, torch.Tensor]:
    """DiffSynth's own reference pass (forward_ref): every layer's cached keys and values, and the last block's
    output, taken with a hook (forward_ref returns nothing: its product is the cache)."""
    layers = SIZES["num_layers"]
    keys, values, last = [None] * layers, [None] * layers, {}
    model.blocks[-1].register_forward_hook(lambda module, args, output: last.update(x=output))
    grid = torch.tensor([[2, 2, 3]])
    model.forward_ref([inputs["latents"]], grid, keys, values, inputs["clip"], [inputs["condition"]],
                      [inputs["text"]], 12, inputs["t"])
    return keys, values, last["x"]


def diffusers_reference_pass(model, inputs) -> tuple[list, list, torch.Tensor]:
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    cache, last = WanAnimate2KVCache(SIZES["num_layers"]), {}
    model.blocks[-1].register_forward_hook(lambda module, args, output: last.update(x=output))
    model(hidden_states=[inputs["latents"]], timestep=inputs["t"], encoder_hidden_states=[inputs["text"]],
          condition_latents=[inputs["condition"]], kv_cache=cache, kv_cache_mode="extract", seq_len=12,
          encoder_hidden_states_image=inputs["clip"], offset_grid_sizes=torch.tensor([[2, 2, 3]]))
    return [c.key for c in cache.layer_caches], [c.value for c in cache.layer_caches], last["x"]


def test_diffusers_model_from_the_export_computes_what_diffsynths_does(release):
    """The reference pass (the in-context keys and values every layer caches, and the hidden states after the last
    block) of Diffusers' model loaded from the export against DiffSynth's model on the release weights, and both heads
    on the same input. Equal within 1e-5 (fp32): the two compute the time embedding differently (DiffSynth's sinusoid
    in float64, Diffusers' Timesteps in float32) and normalise with different RMSNorm code, so the last bits differ;
    a wrongly mapped tensor moves the outputs by ~1e-1. The generation pass (flex attention over a compiled block
    mask) uses the same weights through the same modules and is not run here."""
    model, _, _, ours = release
    theirs = WanAnimate2Transformer3DModel.from_pretrained(ours).eval()
    inputs = forward_inputs()
    with torch.no_grad():
        expected, got = diffsynth_reference_pass(model, inputs), diffusers_reference_pass(theirs, inputs)
        for a, b in zip([*expected[0], *expected[1], expected[2]], [*got[0], *got[1], got[2]]):
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5), (a - b).abs().max()
        x, e = torch.randn(1, 12, SIZES["dim"]), torch.randn(1, SIZES["dim"])
        assert torch.allclose(model.head(x, e), theirs.head(x, e), atol=1e-6)


def test_to_original_round_trips_byte_for_byte(release, tmp_path, cli):
    """Diffusers -> --to original is the release file as safetensors writes it, byte for byte; exported again, the
    Diffusers folder's files byte for byte."""
    _, path, base, ours = release
    result = cli(ours, tmp_path / "original", "--to", "original", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "original").iterdir()) == ["README.md", RELEASE_FILE]
    assert (tmp_path / "original" / RELEASE_FILE).read_bytes() == path.read_bytes()
    result = cli(tmp_path / "original", tmp_path / "again", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    for name in (WEIGHTS, "config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (ours / name).read_bytes(), name


def test_a_dcp_save_of_a_diffusers_fine_tune_exports_its_weights(release, tmp_path, cli):
    """A Diffusers-based fine-tune: the model loaded from the export, one AdamW step on the reference pass's output,
    saved as a plain training loop saves (dcp.save of model, optimizer and step; one process here, whose file is
    what each rank writes of its shard). The export is the trained weights exactly, the optimizer's state left out."""
    import torch.distributed.checkpoint as dcp
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    _, _, base, ours = release
    model = WanAnimate2Transformer3DModel.from_pretrained(ours).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs = forward_inputs(seed=7)
    sample = model(hidden_states=[inputs["latents"]], timestep=inputs["t"], encoder_hidden_states=[inputs["text"]],
                   condition_latents=[inputs["condition"]], kv_cache=WanAnimate2KVCache(SIZES["num_layers"]),
                   kv_cache_mode="extract", seq_len=12, encoder_hidden_states_image=inputs["clip"],
                   offset_grid_sizes=torch.tensor([[2, 2, 3]])).sample[0]
    sample.square().mean().backward()
    optimizer.step()
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, optimizer), "step": 1},
                 checkpoint_id=str(tmp_path / "run" / "step-1"))
    result = cli(tmp_path / "run" / "step-1", tmp_path / "out", "--base", base, "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    trained = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    assert not torch.equal(trained["blocks.0.self_attn.to_q.weight"], load_file(ours / WEIGHTS)[
        "blocks.0.self_attn.to_q.weight"])
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), trained)


def meta_release_shapes() -> dict[str, torch.Size]:
    """The published model's tensors, by DiffSynth's class at its defaults (what its model_configs.py loads the
    release file with), on the meta device."""
    with torch.device("meta"):
        model = diffsynth_module("wan_animate_2_dit").WanAnimate2Transformer()
    return {name: tensor.shape for name, tensor in model.state_dict().items()}


def test_the_published_size_is_recognised_with_its_config():
    shapes = meta_release_shapes()
    table = load_table("wan_animate2/original_transformer")
    assert [t.name for _, t in preferred_tables(list(shapes), component_tables("transformer"))] == [table.name]
    recognised = read_facts(FAMILY, table, shapes)
    assert recognised.variant.name == "Wan2.2-Animate-2-14B" and recognised.task == "animate"
    target = build_target(FAMILY.transformer.class_name, FAMILY.transformer_config(recognised.variant))
    judged = converted({name: torch.empty(shape, device="meta") for name, shape in shapes.items()})
    assert target.schema == {name: tensor.shape for name, tensor in judged.items()}


def test_tables_never_match_another_familys_keys():
    """No table of ours fits another family's names; of every table, ours alone are taken for our names. (Wan's
    original table fits the release's names as far as its globs go; ours, Wan's layout with the blocks wrapped,
    specialises it and wins.)"""
    shapes = meta_release_shapes()
    config = FAMILY.transformer_config(FAMILY.variants[0])
    ours = {"wan_animate2/original_transformer": list(shapes),
            "wan_animate2/diffusers_transformer": list(build_target(FAMILY.transformer.class_name, config).schema)}
    for name, keys in ours.items():
        assert [t.name for _, t in preferred_tables(keys, component_tables("transformer"))] == [name]
    for other in families():
        if other.key == FAMILY.key:
            continue
        target = build_target(other.transformer.class_name, other.transformer_config(other.variants[0]))
        for table in other.transformer.tables:
            keys = list(translate_shapes(load_table(table).inverted(), target.schema, target.counts))
            assert fitting_tables(keys, component_tables("transformer", FAMILY)) == [], (other.name, table)


def test_a_wan_animate_base_names_what_the_input_is(release, tmp_path, cli):
    """Given a Wan Animate (or Wan) --base, the input is said to be a Wan-Animate-2 transformer, not "a Wan
    transformer": one line, exit 2, nothing written."""
    _, path, _, _ = release
    from wan_variants_fixtures import tiny_config

    for name, class_name in (("Wan Animate", "WanAnimateTransformer3DModel"), ("Wan", "WanTransformer3DModel")):
        import diffusers

        base = tmp_path / f"base-{class_name}"
        config = tiny_config("animate") if name == "Wan Animate" else {}
        with torch.device("meta"):  # only its config.json is written
            getattr(diffusers, class_name).from_config(config).save_config(base)
        assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", base],
                       "holds a Wan-Animate-2 transformer", f"not a {name} one", "Wan-Animate-2 --base",
                       inputs=[path])


def test_a_pipeline_base_is_refused_with_the_folder_to_give(release, tmp_path, cli):
    """Diffusers runs Wan-Animate-2 through a modular pipeline only: no pipeline folder is written. A --base pipeline
    folder is one line naming its transformer folder, which exports."""
    _, path, base, _ = release
    pipeline = tmp_path / "pipeline"
    (pipeline / "transformer").mkdir(parents=True)
    (pipeline / "transformer" / "config.json").write_bytes((base / "config.json").read_bytes())
    (pipeline / "model_index.json").write_text(json.dumps({"_class_name": "WanAnimate2ModularPipeline",
                                                           "transformer": ["diffusers", "WanAnimate2Transformer3DModel"]}))
    assert_refused(cli, tmp_path, [path, tmp_path / "out", "--base", pipeline], "writes no Wan-Animate-2 pipeline",
                   str(pipeline / "transformer"), inputs=[path])
    assert cli(path, tmp_path / "model", "--base", pipeline / "transformer").exit_code == 0


def test_gguf_file_holds_the_release_names(release, tmp_path, cli):
    """Wan's quantization facts, read from Wan's quantized.toml (same_as), on the release's wrapped names: the GGUF
    file (Diffusers' loader reads it; its own architecture, which ComfyUI-GGUF refuses by name) holds every tensor of
    the release, the modulation tables in F32 (the fp8 layers inside the wrapper: test_quantized_families.py)."""
    import gguf

    _, path, _, ours = release
    names = set(load_file(path))
    assert cli(ours, tmp_path / "gguf", "--to", "gguf", "--quant", "Q8_0").exit_code == 0
    reader = gguf.GGUFReader(next((tmp_path / "gguf").glob("*.gguf")))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "wan_animate2"
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert set(types) == names and types["blocks.0.block.modulation"] == "F32"


# -- LoRA ----------------------------------------------------------------------------------------------------------
def diffsynth_lora(seed: int = 4):
    """DiffSynth-Studio's trainer: PEFT's inject_adapter_in_model on its DiT (lora_alpha = rank, its default), the
    adapter's tensors saved as they are named (lora_A.default). Returns the file's tensors and the weights PEFT's own
    merge makes of the model (the truth, in the release's names)."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import LoraLayer

    wrapped = inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=LORA_TARGETS),
                                      diffsynth_model())  # the fixture's weights (the same seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # lora_B starts at zero, as if untrained: noise in both factors
        for name, tensor in wrapped.named_parameters():
            if ".lora_" in name:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.1)
    lora = {n: t.detach().clone() for n, t in wrapped.state_dict().items() if ".lora_" in n}
    for module in wrapped.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    merged = {n.replace(".base_layer", ""): t.detach().clone() for n, t in wrapped.state_dict().items()
              if ".lora_" not in n}
    return lora, merged


def test_diffsynth_lora_fuses_exactly_and_is_written_for_comfyui(release, tmp_path, cli):
    model, _, _, ours = release
    lora, merged = diffsynth_lora()
    assert_same_tensors({n: t for n, t in merged.items() if '.block.ffn.' not in n and '_attn.' not in n},
                        {n: t for n, t in release_state_dict(model).items() if '.block.ffn.' not in n and '_attn.' not in n})
    assert "blocks.0.block.cross_attn.k_img.lora_A.default.weight" in lora
    save_file(lora, tmp_path / "epoch-0.safetensors")
    result = cli(tmp_path / "epoch-0.safetensors", tmp_path / "fused", "--base", ours, "--lora", "fuse",
                 "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "fused" / WEIGHTS), converted(merged))

    result = cli(tmp_path / "epoch-0.safetensors", tmp_path / "comfy", "--base", ours, "--lora-format", "comfyui")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "comfy" / "lora.safetensors")
    # ComfyUI matches diffusion_model.<the model's own key> against the checkpoint it loaded (the release's names),
    # and adds alpha / rank x up @ down to the weight
    base = release_state_dict(model)
    fused = dict(base)
    for name in [n for n in written if n.endswith(".lora_down.weight")]:
        module = name[len("diffusion_model."):-len(".lora_down.weight")]
        down, up = written[name], written[f"diffusion_model.{module}.lora_up.weight"]
        # no .alpha: ComfyUI applies the product at scale 1 (DiffSynth's strength, alpha = rank)
        alpha = written.get(f"diffusion_model.{module}.alpha", torch.tensor(float(down.shape[0]))).item()
        fused[f"{module}.weight"] = base[f"{module}.weight"] + (up @ down) * (alpha / down.shape[0])
    assert len([n for n in written if n.endswith(".lora_down.weight")]) == 2 * 12  # per block: self_attn q k v o, cross_attn q k v o k_img v_img, ffn.0 ffn.2
    for name, tensor in merged.items():
        assert torch.equal(fused[name], tensor), name


def test_diffsynth_lora_written_for_diffusers_and_peft_is_what_their_loaders_fuse(release, tmp_path, cli):
    """The same adapter as Diffusers' LoRA file (read by the modular pipeline's WanLoraLoaderMixin and the model's
    load_lora_adapter, fused at scale 1) and as a PEFT adapter folder (PEFT's own merge): both give PEFT's merge of
    the DiffSynth-wrapped model."""
    from diffusers import WanAnimate2ModularPipeline
    from lora_helpers import diffusers_fused, peft_fused

    _, _, _, ours = release
    lora, merged = diffsynth_lora()
    save_file(lora, tmp_path / "epoch-0.safetensors")
    base = load_file(ours / WEIGHTS)
    truth = converted(merged)
    for target in ("diffusers", "peft"):
        result = cli(tmp_path / "epoch-0.safetensors", tmp_path / target, "--base", ours, "--lora-format", target)
        assert result.exit_code == 0, result.stderr
        if target == "diffusers":
            fused = diffusers_fused(WanAnimate2ModularPipeline, WanAnimate2Transformer3DModel, SIZES, base,
                                    tmp_path / target / "pytorch_lora_weights.safetensors")
        else:
            fused = peft_fused(WanAnimate2Transformer3DModel, SIZES, base, tmp_path / target)
        for name, tensor in truth.items():
            assert torch.equal(fused[name], tensor), (target, name)
