"""CogVideoX LoRA runs (SAT's LoraMixin, PEFT inside DeepSpeed or DDP checkpoints, Diffusers, PEFT and finetrainers
files) export to adapters that Diffusers itself (or, for --lora-format peft, PEFT) loads and fuses at scale 1.0 to
exactly W + (alpha/r) B A, and to fused models equal to the same; alpha comes from the run when it is recorded,
else a documented default."""

from __future__ import annotations

import json

import pytest
import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, finetune, write_sat_run
from conftest import assert_refusal
from diffusers import CogVideoXPipeline, CogVideoXTransformer3DModel
from lora_helpers import adapter_metadata, assert_all_equal, diffusers_fused, peft_fused
from lora_helpers import merged as merged_modules
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cogexport.exporter import export


def diffusers_fuse(folder, config, weights) -> dict[str, torch.Tensor]:
    """What Diffusers makes of an adapter folder: load it into the base transformer and fuse at scale 1.0."""
    return diffusers_fused(CogVideoXPipeline, CogVideoXTransformer3DModel, config, weights, folder)


def merged(weights, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], alpha: float, rank: int):
    """W + (alpha / r) B A with one alpha and rank for every module."""
    return merged_modules(weights, {module: (down, up, alpha / rank) for module, (down, up) in pairs.items()})


@pytest.mark.parametrize("variant, layers", [("2b", 1), ("5b", 3), ("1.5-5b-i2v", 2)])
def test_sat_lora_adapter_fuses_in_diffusers_to_the_trained_weights(variant, layers, tmp_path, cli):
    original = build_tiny_transformer(variant, num_layers=layers, seed=layers)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=4, dtype=torch.float32)
    base = config_folder(tmp_path / "base", original)
    result = cli(run.run_dir, tmp_path / "adapter", "--base", base, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["component"] == "lora adapter"
    assert (report["lora"]["rank"], report["lora"]["alpha"], report["lora"]["layers"]) == (4, 1.0, layers)
    with safe_open(tmp_path / "adapter" / "pytorch_lora_weights.safetensors", "pt") as handle:
        assert json.loads(handle.metadata()["lora_adapter_metadata"]) == {
            "transformer.r": 4, "transformer.lora_alpha": 1.0,
            "transformer.target_modules": ["to_k", "to_out.0", "to_q", "to_v"]}
        assert len(list(handle.keys())) == 8 * layers
    expected = run.expected_merged()  # the independent writer's W + (1/r) B A
    assert_all_equal(diffusers_fuse(tmp_path / "adapter", original.config, run.expected), expected)

    export(run.run_dir, tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), expected)


def test_sat_lora_alpha_from_the_runs_saved_config_or_the_command_line(tmp_path):
    original = build_tiny_transformer("2b", num_layers=2)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=8, dtype=torch.float32)
    base = config_folder(tmp_path / "base", original)
    (run.run_dir / "model_config.json").write_text(json.dumps({"model_class": "Lora", "lora_alpha": 16}))
    recorded = export(run.run_dir, tmp_path / "a", base=base)
    assert recorded.lora["alpha"] == 16 and "model_config.json" in recorded.lora["alpha_source"] and not recorded.notes
    given = export(run.run_dir, tmp_path / "b", base=base, lora_alpha=4.0)
    assert given.lora["alpha"] == 4.0 and given.lora["scale"] == 0.5
    fused = export(run.run_dir, tmp_path / "c", base=base, lora="fuse", dtype="fp32", lora_alpha=4.0)
    assert fused.component == "transformer"
    assert_all_equal(load_file(tmp_path / "c" / "diffusion_pytorch_model.safetensors"),
                     merged(run.expected, run.lora_pairs, 4.0, 8))


def test_peft_lora_trained_under_deepspeed(tmp_path, cli):
    run = finetune("t2v", 2, 2, lora_rank=4)
    rank, alpha = run.truth["settings"]["lora_rank"], run.truth["settings"]["lora_alpha"]
    result = cli(run.checkpoint, tmp_path / "adapter", "--base", run.base, "--lora-alpha", alpha, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["lora"]["rank"] == rank

    written = load_file(tmp_path / "adapter" / "pytorch_lora_weights.safetensors")
    for name in run.truth["trainable"]:  # ...to_q.lora_A.default.weight: fp32 masters, bit for bit
        assert torch.equal(written["transformer." + name.replace(".default", "")], run.tensors[name]), name
    base = {name.replace(".base_layer", ""): run.tensors[name] for name in run.truth["frozen"]}
    pairs = {name[: -len(".lora_A.default.weight")]: (run.tensors[name], run.tensors[name.replace("lora_A", "lora_B")])
             for name in run.truth["trainable"] if ".lora_A." in name}
    expected = merged(base, pairs, alpha, rank)
    config = CogVideoXTransformer3DModel.load_config(run.base / "transformer")
    assert_all_equal(diffusers_fuse(tmp_path / "adapter", config, base), expected)

    export(run.checkpoint, tmp_path / "fused", lora="fuse", lora_alpha=alpha, base=run.base,
           component="transformer", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), expected)


def test_a_lora_file_without_alpha_gets_the_documented_default_and_a_warning(tmp_path, cli):
    run = finetune("t2v", 2, 2, lora_rank=4)
    lora_file = run.root / "pytorch_lora_weights.safetensors"  # what finetune/ writes at the end: no alpha
    result = cli(lora_file, tmp_path / "adapter", "--base", run.base)
    assert result.exit_code == 0, result.stderr
    assert "does not record its LoRA alpha; using 64" in result.stderr and "--lora-alpha" in result.stderr
    with safe_open(tmp_path / "adapter" / "pytorch_lora_weights.safetensors", "pt") as handle:
        assert json.loads(handle.metadata()["lora_adapter_metadata"])["transformer.lora_alpha"] == 64.0

    # Fused into a whole pipeline: the base weights come from --base.
    fused = cli(lora_file, tmp_path / "pipeline", "--base", run.base, "--lora", "fuse", "--component", "pipeline",
                "--dtype", "fp32")
    assert fused.exit_code == 0, fused.stderr
    base = load_file(run.base / "transformer" / "diffusion_pytorch_model.safetensors")
    adapter = load_file(lora_file)
    pairs = {name[len("transformer."): -len(".lora_A.weight")]: (adapter[name], adapter[name.replace("lora_A", "lora_B")])
             for name in adapter if ".lora_A." in name}
    assert_all_equal(load_file(tmp_path / "pipeline" / "transformer" / "diffusion_pytorch_model.safetensors"),
                     merged(base, pairs, 64.0, 4))
    assert (tmp_path / "pipeline" / "model_index.json").exists()


def test_inspect_reports_the_adapter(cli, tmp_path):
    run = finetune("t2v", 2, 2, lora_rank=4)
    tiny = run.root / "pytorch_lora_weights.safetensors"
    # By names alone this adapter (attn1's to_q, to_k, to_v, to_out.0) could be LTX-Video's or Cosmos's as well; at
    # the tiny test width no published model's layer sizes tell which, and inspect says so. At CogVideoX-2B's width
    # (1920) they do.
    problem = json.loads(cli("inspect", tiny, "--json").stdout)["models"]["lora"]["problem"]
    assert "CogVideoX, Cosmos, LTX-2, LTX-Video and SanaVideo" in problem and "pass --base" in problem
    generator = torch.Generator().manual_seed(0)
    save_file({name: torch.randn((4, 1920) if ".lora_A." in name else (1920, 4), generator=generator)
               for name in load_file(tiny)}, tmp_path / "pytorch_lora_weights.safetensors")
    report = json.loads(cli("inspect", tmp_path / "pytorch_lora_weights.safetensors", "--json").stdout)
    assert report["models"]["lora"] == {
        "family": "CogVideoX", "type": "LoRA", "kinds": {"LoRA": 8}, "whole_factors": 0,
        "format": "diffusers", "format_title": "Diffusers", "layout": "cogvideox/diffusers_lora",
        "description": "Diffusers LoRA weights (pytorch_lora_weights.safetensors)",
        "rank": 4, "ranks": [4], "alpha": None, "assumed_alpha": 64.0, "alpha_recorded": False, "scale": 16.0,
        "alpha_source": "CogVideo finetune/'s default lora_alpha", "per_module_alphas": False, "use_rslora": False,
        "target_modules": ["to_k", "to_out.0", "to_q", "to_v"], "modules": 8, "layers": 2, "deltas": {},
        "base_weights": False}
    text = cli("inspect", run.checkpoint).stdout
    assert "rank 4, alpha not recorded" in text and "64, would be assumed" in text and "8 modules in 2 layers" in text


def test_bad_lora_input(cli, tmp_path):
    original = build_tiny_transformer("2b", num_layers=2)
    full = write_sat_run(tmp_path / "full", original.state_dict())
    base = config_folder(tmp_path / "base", original)
    assert_refusal(cli(full.run_dir, tmp_path / "o1", "--base", base, "--lora", "adapter"), "holds no LoRA adapter")

    run = finetune("t2v", 2, 2, lora_rank=4)
    lora_file = run.root / "pytorch_lora_weights.safetensors"
    assert_refusal(cli(lora_file, tmp_path / "o2", "--lora", "fuse", "--base", base), "needs the base weights")
    other = config_folder(tmp_path / "other", build_tiny_transformer("5b", num_layers=2))
    assert_refusal(cli(lora_file, tmp_path / "o3", "--base", other), "does not fit the base model")
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3"))


class PeftRun:
    """A tiny CogVideoX transformer with adapters injected by PEFT itself; the truth is PEFT's own merge."""

    def __init__(self, folder, variant="2b", layers=2, seed=0, **lora_config):
        import copy

        from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

        base = build_tiny_transformer(variant, num_layers=layers, seed=seed)
        self.base_folder = folder / "base"
        base.save_pretrained(self.base_folder)
        self.config = dict(lora_config)
        wrapped = inject_adapter_in_model(LoraConfig(**lora_config), copy.deepcopy(base), adapter_name="default")
        generator = torch.Generator().manual_seed(seed + 7)
        with torch.no_grad():
            for name, parameter in wrapped.named_parameters():
                if ".lora_" in name:  # a trained adapter: B is not zero
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
        self.wrapped = {name: tensor.clone() for name, tensor in wrapped.state_dict().items()}  # ...base_layer...
        self.adapter = get_peft_model_state_dict(wrapped, adapter_name="default")  # ...to_q.lora_A.weight
        for module in wrapped.modules():
            if hasattr(module, "lora_A") and hasattr(module, "merge"):
                module.merge(adapter_names=["default"])
        self.merged = {name.replace(".base_layer", ""): tensor.clone() for name, tensor in wrapped.state_dict().items()
                       if ".lora_" not in name}

    def saved(self, folder, file_name, tensors, prefix=""):
        """``tensors`` with ``prefix`` in folder/file_name, and PEFT's adapter_config.json beside them."""
        folder.mkdir(parents=True, exist_ok=True)
        save_file({prefix + name: tensor.contiguous() for name, tensor in tensors.items()}, folder / file_name)
        (folder / "adapter_config.json").write_text(json.dumps(self.config))
        return folder / file_name

    def diffusers_file(self, folder, metadata=None):
        CogVideoXPipeline.save_lora_weights(folder, transformer_lora_layers=self.adapter,
                                            transformer_lora_adapter_metadata=metadata)
        return folder / "pytorch_lora_weights.safetensors"


def via_pipeline(adapter_folder, base_folder):
    """The base transformer with the adapter loaded the way users do (pipe.load_lora_weights), fused at 1.0."""
    transformer = CogVideoXTransformer3DModel.from_pretrained(base_folder)
    pipe = CogVideoXPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=transformer, scheduler=None)
    pipe.load_lora_weights(adapter_folder, adapter_name="trained")
    pipe.fuse_lora(lora_scale=1.0)
    pipe.unload_lora_weights()
    return pipe.transformer.state_dict()


@pytest.mark.parametrize("settings", [
    {"alpha_pattern": {"to_k": 2}},
    {"use_rslora": True},
    {"rank_pattern": {"to_out.0": 2}, "alpha_pattern": {"to_out.0": 16}},
], ids=["alpha-pattern", "rslora", "rank-and-alpha-patterns"])
def test_every_recorded_lora_setting_reaches_diffusers(settings, tmp_path):
    config = {"r": 4, "lora_alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"], **settings}
    run = PeftRun(tmp_path, **config)
    source = run.diffusers_file(tmp_path / "source", metadata=config)
    export(source, tmp_path / "adapter", base=run.base_folder)
    assert_all_equal(via_pipeline(tmp_path / "adapter", run.base_folder), run.merged)
    export(source, tmp_path / "fused", base=run.base_folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), run.merged)


def test_peft_checkpoint_with_its_adapter_config(tmp_path):
    # A DDP run's model.safetensors (module. prefix) with PEFT's adapter_config.json beside it; adapters on the
    # blocks' linear layers and on linear layers outside the blocks.
    config = {"r": 4, "lora_alpha": 8, "use_rslora": True, "target_modules": ["to_q", "ff.net.2", "proj_out",
                                                                               "time_embedding.linear_1"]}
    run = PeftRun(tmp_path, **config)
    checkpoint = run.saved(tmp_path / "checkpoint", "model.safetensors", run.wrapped, prefix="module.")
    result = export(checkpoint, tmp_path / "adapter", base=run.base_folder)
    assert result.lora["scale"] == 4.0 and not result.notes  # 8 / sqrt(4), recorded: no warning
    assert_all_equal(via_pipeline(tmp_path / "adapter", run.base_folder), run.merged)
    export(checkpoint, tmp_path / "fused", lora="fuse", dtype="fp32", base=run.base_folder)
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), run.merged)


def test_peft_adapter_folder_without_a_base(tmp_path):
    # PEFT's own save_pretrained layout: adapter_model.safetensors (base_model.model. names) + adapter_config.json
    config = {"r": 4, "lora_alpha": 2, "target_modules": ["to_v", "norm1.linear"]}
    run = PeftRun(tmp_path, **config)
    adapter = run.saved(tmp_path / "peft-adapter", "adapter_model.safetensors", run.adapter, prefix="base_model.model.")
    result = export(adapter, tmp_path / "adapter")
    assert result.lora["alpha"] == 2 and result.lora["layers"] == 2
    assert_all_equal(via_pipeline(tmp_path / "adapter", run.base_folder), run.merged)


def test_sat_lora_run_with_unwrapped_layers(tmp_path):
    # LoraMixin's layer_range: layer 1 of 3 keeps its plain query_key_value and dense weights
    original = build_tiny_transformer("5b", num_layers=3, seed=4)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=4, lora_layers=[0, 2], dtype=torch.float32)
    base = config_folder(tmp_path / "base", original)
    result = export(run.run_dir, tmp_path / "adapter", base=base)
    assert result.lora["layers"] == 2 and result.lora["modules"] == 8
    with safe_open(tmp_path / "adapter" / "pytorch_lora_weights.safetensors", "pt") as handle:
        targets = json.loads(handle.metadata()["lora_adapter_metadata"])["transformer.target_modules"]
    assert targets == sorted(f"transformer_blocks.{i}.attn1.{t}" for i in (0, 2) for t in ("to_q", "to_k", "to_v",
                                                                                         "to_out.0")), "not layer 1"
    assert_all_equal(diffusers_fuse(tmp_path / "adapter", original.config, run.expected), run.expected_merged())
    export(run.run_dir, tmp_path / "fused", base=base, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), run.expected_merged())


def test_fuse_takes_the_plain_weights_of_a_base_that_also_holds_a_variant(tmp_path):
    config = {"r": 4, "lora_alpha": 4, "target_modules": ["to_q"]}
    run = PeftRun(tmp_path, **config)
    CogVideoXTransformer3DModel.from_pretrained(run.base_folder).half().save_pretrained(run.base_folder, variant="fp16")
    source = run.diffusers_file(tmp_path / "source", metadata=config)
    export(source, tmp_path / "fused", base=run.base_folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "fused" / "diffusion_pytorch_model.safetensors"), run.merged)


@pytest.mark.filterwarnings("ignore:.*LoRA tensor\\(s\\) have invalid shape")  # PEFT's view of lora_B.bias
def test_dora_goes_to_peft_only_and_lora_biases_reach_diffusers(tmp_path, cli):
    run = PeftRun(tmp_path / "dora", r=4, lora_alpha=4, target_modules=["to_q"], use_dora=True)
    checkpoint = run.saved(tmp_path / "dora" / "checkpoint", "model.safetensors", run.wrapped, prefix="module.")
    assert_refusal(cli(checkpoint, tmp_path / "dora-out", "--base", run.base_folder), "cannot hold DoRA magnitudes",
                   "--lora-format peft")
    assert_refusal(cli(checkpoint, tmp_path / "dora-fused", "--base", run.base_folder, "--lora", "fuse"), "DoRA")
    assert not (tmp_path / "dora-out").exists() and not (tmp_path / "dora-fused").exists()

    # PEFT's lora_bias: lora_B.bias, added to the layer's bias times the scale; Diffusers carries it
    run = PeftRun(tmp_path / "bias", r=4, lora_alpha=8, target_modules=["to_q", "to_v"], lora_bias=True)
    checkpoint = run.saved(tmp_path / "bias" / "checkpoint", "model.safetensors", run.wrapped, prefix="module.")
    export(checkpoint, tmp_path / "bias-out", base=run.base_folder)
    assert_all_equal(via_pipeline(tmp_path / "bias-out", run.base_folder), run.merged)
    export(checkpoint, tmp_path / "bias-fused", base=run.base_folder, lora="fuse", dtype="fp32")
    assert_all_equal(load_file(tmp_path / "bias-fused" / "diffusion_pytorch_model.safetensors"), run.merged)


def test_bad_lora_options(cli, tmp_path):
    config = {"r": 4, "lora_alpha": 4, "target_modules": ["to_q"]}
    run = PeftRun(tmp_path, **config)
    source = run.diffusers_file(tmp_path / "source", metadata=config)
    assert_refusal(cli(source, tmp_path / "o1", "--base", run.base_folder, "--lora", "adapter", "--component", "vae"),
                   "--lora adapter writes an adapter file")
    for alpha in ("nan", "0", "-4"):
        assert_refusal(cli(source, tmp_path / "o2", "--base", run.base_folder, "--lora-alpha", alpha), "--lora-alpha")
    renamed = {f"transformer.encoder.{n.split('.', 1)[1]}": t for n, t in load_file(source).items()}
    save_file(renamed, tmp_path / "foreign.safetensors")
    assert_refusal(cli(tmp_path / "foreign.safetensors", tmp_path / "o3"),
                   "encoder.transformer_blocks.0.attn1.to_q names no layer of a CogVideoX transformer")
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3"))


def test_a_recorded_config_that_cannot_be_read(cli, tmp_path):
    config = {"r": 4, "lora_alpha": 4, "target_modules": ["to_q"]}
    run = PeftRun(tmp_path, **config)
    checkpoint = run.saved(tmp_path / "checkpoint", "model.safetensors", run.wrapped, prefix="module.")
    (checkpoint.parent / "adapter_config.json").write_text("{not json")
    assert_refusal(cli(checkpoint, tmp_path / "o1", "--base", run.base_folder), "adapter_config.json",
                   "not a valid PEFT adapter config")
    (checkpoint.parent / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": "a lot"}))
    assert_refusal(cli(checkpoint, tmp_path / "o2", "--base", run.base_folder), "lora_alpha", "not a positive number")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


# -- every CogVideoX layout, written as Diffusers and PEFT files -------------------------------------------------
PATTERNS = {"r": 4, "lora_alpha": 8, "target_modules": ["to_q", "to_k", "to_v", "to_out.0", "proj_out"],
            "rank_pattern": {"to_v": 2}, "alpha_pattern": {"to_k": 2, "proj_out": 16}}


def finetrainers_file(run: PeftRun, path):
    """finetrainers' layout: Diffusers names, its LoraConfig in the lora_config metadata (one rank and alpha)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({f"transformer.{name}": tensor.contiguous() for name, tensor in run.adapter.items()}, path,
              metadata={"lora_config": json.dumps({k: run.config[k] for k in ("r", "lora_alpha", "target_modules")})})
    return path


def judged(folder, lora_format: str, base_folder):
    """An adapter folder as its own loader applies it: PEFT's merge for peft, Diffusers' loader for diffusers."""
    if lora_format == "peft":
        config = CogVideoXTransformer3DModel.load_config(base_folder)
        return peft_fused(CogVideoXTransformer3DModel, config, load_file(base_folder / "diffusion_pytorch_model.safetensors"),
                          folder)
    return via_pipeline(folder, base_folder)


@pytest.mark.parametrize("layout", ["diffusers", "peft", "peft-checkpoint", "finetrainers"])
def test_cogvideox_layouts_written_as_diffusers_and_peft(layout, tmp_path, cli):
    config = PATTERNS if layout != "finetrainers" else {"r": 4, "lora_alpha": 8, "target_modules": ["to_q", "to_v"]}
    run = PeftRun(tmp_path, seed=2, **config)
    source = {"diffusers": lambda: run.diffusers_file(tmp_path / "in", metadata=config),
              "peft": lambda: run.saved(tmp_path / "in", "adapter_model.safetensors", run.adapter, "base_model.model."),
              "peft-checkpoint": lambda: run.saved(tmp_path / "in", "model.safetensors", run.wrapped, "module."),
              "finetrainers": lambda: finetrainers_file(run, tmp_path / "in" / "pytorch_lora_weights.safetensors")}[layout]()
    for target in ("diffusers", "peft"):
        result = export(source, tmp_path / target, base=run.base_folder, lora_format=target)
        assert not result.notes, result.notes  # every layout here records its alpha
        assert_all_equal(judged(tmp_path / target, target, run.base_folder), run.merged)
    peft_config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert (peft_config["peft_type"], peft_config["r"], peft_config["lora_alpha"]) == ("LORA", 4, 8.0)
    for target in ("comfyui", "musubi"):  # no CogVideoX loader reads original-names LoRAs
        refused = cli(source, tmp_path / target, "--base", run.base_folder, "--lora-format", target)
        assert_refusal(refused, "for CogVideoX LoRAs", "write one of diffusers, peft")
        assert not (tmp_path / target).exists()


def test_sat_lora_run_written_as_a_peft_adapter(tmp_path):
    original = build_tiny_transformer("5b", num_layers=2, seed=8)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=4, dtype=torch.float32)
    base = tmp_path / "base"
    original.save_pretrained(base)
    export(run.run_dir, tmp_path / "peft", base=base, lora_format="peft")
    assert_all_equal(judged(tmp_path / "peft", "peft", base), run.expected_merged())


def test_cogvideox_round_trips_are_exact(tmp_path):
    run = PeftRun(tmp_path, seed=3, **PATTERNS)
    source = run.diffusers_file(tmp_path / "in", metadata=PATTERNS)
    export(source, tmp_path / "peft", base=run.base_folder, lora_format="peft")
    export(tmp_path / "peft", tmp_path / "diffusers", base=run.base_folder)
    export(tmp_path / "diffusers", tmp_path / "peft-again", base=run.base_folder, lora_format="peft")
    again = load_file(tmp_path / "diffusers" / "pytorch_lora_weights.safetensors")
    assert_all_equal(again, load_file(source))
    assert adapter_metadata(tmp_path / "diffusers" / "pytorch_lora_weights.safetensors") == {
        f"transformer.{key}": value for key, value in {**PATTERNS, "lora_alpha": 8.0, "alpha_pattern": {
            f"transformer_blocks.{i}.attn1.to_k": 2.0 for i in range(2)} | {"proj_out": 16.0},
            "rank_pattern": {f"transformer_blocks.{i}.attn1.to_v": 2 for i in range(2)},
            "target_modules": ["proj_out", "to_k", "to_out.0", "to_q", "to_v"]}.items()}
    assert_all_equal(load_file(tmp_path / "peft-again" / "adapter_model.safetensors"),
                     load_file(tmp_path / "peft" / "adapter_model.safetensors"))
    assert (tmp_path / "peft-again" / "adapter_config.json").read_text() == \
        (tmp_path / "peft" / "adapter_config.json").read_text()


def test_an_adapter_of_an_unpublished_size_needs_no_base(tmp_path, cli):
    """An adapter needs only its modules' names and shapes: the run's own weights give both."""
    original = build_tiny_transformer("2b", num_layers=2, seed=5)
    run = write_sat_run(tmp_path / "run", original.state_dict(), lora_rank=4, dtype=torch.float32)
    without = cli(run.run_dir, tmp_path / "without")
    assert without.exit_code == 0, without.stderr
    assert cli(run.run_dir, tmp_path / "with", "--base", config_folder(tmp_path / "base", original)).exit_code == 0
    assert_all_equal(load_file(tmp_path / "without" / "pytorch_lora_weights.safetensors"),
                     load_file(tmp_path / "with" / "pytorch_lora_weights.safetensors"))
