"""LTX-Video: the single-file release both ways, every shape class and VAE version, judged by Diffusers' own single-file
converters; pipeline folders that load and render; full-size variant detection; fine-tunes under real DeepSpeed; bad
input; the fp32 allowlist; and the tables of every family kept apart."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import assert_refused, assert_same_tensors, component_weights
from fixtures import SCRIPTS
from ltx_video_fixtures import SHAPE_CLASSES, judge_transformer, judge_vae, tiny_pipeline
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cogexport.keymap.plan import plan_translation
from cogexport.keymap.table import load_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import family_named
from cogexport.models.recognize import read_facts
from cogexport.precision import PrecisionPolicy

sys.path.insert(0, str(SCRIPTS))
from make_tiny_ltx_video import render  # noqa: E402

FAMILY = family_named("ltx_video")
WEIGHTS = "diffusion_pytorch_model.safetensors"


def save_pretrained_of(folder, component: str, tensors: dict, out) -> None:
    """Diffusers' own writer, given the same tensors in the same dtypes."""
    import diffusers

    config = json.loads((folder / component / "config.json").read_text())
    model = getattr(diffusers, config["_class_name"]).from_config(config)
    model.load_state_dict(tensors, assign=True)
    model.save_pretrained(out)


@pytest.fixture(scope="module")
def single_files(tmp_path_factory):
    """The single file cogexport writes back (--to original, fp32) from each tiny pipeline, made once per module."""
    from cogexport.exporter import export_original

    made = {}

    def single_file(layout: str, version: str):
        if (layout, version) not in made:
            out = tmp_path_factory.mktemp(f"original-{layout}-{version}")
            export_original(tiny_pipeline(layout, version), out / "release", dtype="fp32", progress=False)
            made[layout, version] = out / "release" / "ltx-video.safetensors"
        return made[layout, version]

    return single_file


# -- the way back, judged by Diffusers ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout, version", SHAPE_CLASSES)
def test_written_single_file_is_read_by_diffusers_back_to_the_same_tensors(layout, version, single_files):
    base = tiny_pipeline(layout, version)
    path = single_files(layout, version)
    written = load_file(path)
    assert {key.split(".")[0] for key in written} == {"model", "vae"}  # model.diffusion_model.* and vae.*
    assert_same_tensors(judge_transformer(written), component_weights(base, "transformer"))
    assert_same_tensors(judge_vae(written), component_weights(base, "vae"))
    with safe_open(path, "pt") as handle:
        transformer = json.loads(handle.metadata()["config"])["transformer"]
    config = json.loads((base / "transformer" / "config.json").read_text())
    assert transformer["_class_name"] == "Transformer3DModel"
    assert {k: transformer[k] for k in ("num_layers", "num_attention_heads", "attention_head_dim",
                                        "cross_attention_dim", "caption_channels", "in_channels")} == \
        {k: config[k] for k in ("num_layers", "num_attention_heads", "attention_head_dim", "cross_attention_dim",
                                "caption_channels", "in_channels")}


# -- forward: exports equal the Diffusers weights and save_pretrained's bytes; pipelines render ----------------------
@pytest.mark.parametrize("layout, version", SHAPE_CLASSES)
def test_pipeline_from_the_single_file_equals_diffusers_and_renders(layout, version, single_files, tmp_path, cli):
    base = tiny_pipeline(layout, version)
    result = cli(single_files(layout, version), tmp_path / "out", "--base", base)
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out"
    policy = {"transformer": PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, []),
              "vae": PrecisionPolicy.build("bf16", FAMILY.vae.keep_fp32, [])}
    for component in ("transformer", "vae"):  # the VAE comes from the same single file, not from --base
        truth = component_weights(base, component)
        cast = {name: t.to(policy[component].target_dtype(name, t.dtype)) for name, t in truth.items()}
        assert_same_tensors(component_weights(out, component), cast)
        save_pretrained_of(base, component, cast, tmp_path / f"theirs-{component}")
        for path in (tmp_path / f"theirs-{component}").iterdir():
            assert (out / component / path.name).read_bytes() == path.read_bytes(), f"{component}/{path.name}"
        assert (out / component / path.name).stat().st_ino != path.stat().st_ino
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == ("LTXConditionPipeline" if layout == "13b" else "LTXPipeline")
    scheduler = json.loads((out / "scheduler" / "scheduler_config.json").read_text())
    assert scheduler["use_dynamic_shifting"] is (version in ("0.9.0", "0.9.1"))  # the version's own scheduler
    assert scheduler == json.loads((base / "scheduler" / "scheduler_config.json").read_text())
    frames = render(out)
    assert len(frames) == 9 and frames[0].size == (64, 64)


def test_transformer_alone_takes_its_config_from_the_file_metadata(single_files, tmp_path, cli):
    """No --base: the custom size comes from the config a single file carries."""
    base = tiny_pipeline("2b", "0.9.1")
    result = cli(single_files("2b", "0.9.1"), tmp_path / "out", "--component", "transformer", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    assert_same_tensors(load_file(tmp_path / "out" / WEIGHTS), component_weights(base, "transformer"))
    assert "custom-size LTX-Video (LTX-Video-0.9.5 layout) transformer" in result.stdout


def test_two_versions_in_one_process_stay_apart(single_files, tmp_path):
    """Diffusers' conversion script (scripts/convert_ltx_to_diffusers.py) updates one global VAE rename table per
    version, so converting a 0.9.0 and a 0.9.1 VAE in one process mixes their block maps. cogexport keeps one table
    per version: both VAEs export exactly, one after the other, in this process."""
    from cogexport.exporter import export

    for version in ("0.9.1", "0.9.0", "0.9.1"):
        base = tiny_pipeline("2b", version)
        out = tmp_path / f"vae-{version}-{len(list(tmp_path.iterdir()))}"
        export(single_files("2b", version), out, component="vae", base=base, dtype="fp32", progress=False)
        assert_same_tensors(load_file(out / WEIGHTS), component_weights(base, "vae"))


# -- full-size releases: variant, config and VAE version from shapes alone (meta device) ----------------------------
def _meta_release(variant_name: str) -> tuple[dict, dict]:
    """A full-size single file's names and shapes (meta tensors), from the variant's own configs."""
    from diffusers import AutoencoderKLLTXVideo, LTXVideoTransformer3DModel

    variant = FAMILY.variant_named(variant_name)
    with torch.device("meta"):
        transformer = LTXVideoTransformer3DModel.from_config(FAMILY.transformer_config(variant))
        vae = AutoencoderKLLTXVideo.from_config(FAMILY.vae_config(variant))
    release = {}
    vae_table = "original_vae_" + variant.shapes["vae_version"].replace(".", "")
    for model, table, prefix in ((transformer, "original_transformer", "model.diffusion_model."), (vae, vae_table, "vae.")):
        lazy = {n: LazyTensor(t.shape, t.dtype, lambda: None) for n, t in model.state_dict().items()}
        names = plan_translation(load_table(f"ltx_video/{table}").inverted(), lazy, None, {}).tensors
        release.update({prefix + name: torch.empty(t.shape, device="meta") for name, t in names.items()})
    return release, {n: t.shape for n, t in transformer.state_dict().items()}


@pytest.mark.parametrize("variant, diffusers_type", [
    ("LTX-Video-0.9.0", "ltx-video"), ("LTX-Video-0.9.1", "ltx-video-0.9.1"), ("LTX-Video-0.9.5", "ltx-video-0.9.5"),
    ("LTX-Video-0.9.7-dev", "ltx-video-0.9.7"),
])
def test_full_size_releases_are_told_apart_as_diffusers_tells_them(variant, diffusers_type):
    from diffusers.loaders.single_file_utils import infer_diffusers_model_type

    release, schema = _meta_release(variant)
    assert infer_diffusers_model_type(release) == diffusers_type  # the judge's own detection, on the same names
    recognised = read_facts(FAMILY, load_table("ltx_video/original_transformer"), {n: t.shape for n, t in release.items()})
    assert recognised.variant.name == variant
    assert FAMILY.task(recognised.variant.task).pipeline == \
        ("LTXConditionPipeline" if variant == "LTX-Video-0.9.7-dev" else "LTXPipeline")


def test_the_13b_0_9_8_gets_the_13b_config():
    """Diffusers' conversion script uses the 2B transformer config for every version but 0.9.7 (so for the 13B 0.9.8
    too) and has no 0.9.8 VAE branch; cogexport's 0.9.8 13B has the 13B config and the 0.9.5-and-later VAE."""
    release, schema = _meta_release("LTX-Video-0.9.8-13B")
    config = FAMILY.transformer_config(FAMILY.variant_named("LTX-Video-0.9.8-13B"))
    assert (config["num_layers"], config["attention_head_dim"], config["cross_attention_dim"]) == (48, 128, 4096)
    assert FAMILY.vae_config(FAMILY.variant_named("LTX-Video-0.9.8-13B")) == \
        FAMILY.vae_config(FAMILY.variant_named("LTX-Video-0.9.7-dev"))
    recognised = read_facts(FAMILY, load_table("ltx_video/original_transformer"), {n: t.shape for n, t in release.items()})
    assert (recognised.facts["hidden"], recognised.facts["layers"], recognised.facts["vae_version"]) == (4096, 48, "0.9.5")


# -- a Diffusers-named fine-tune under real DeepSpeed ---------------------------------------------------------------
def test_deepspeed_finetune_exports_the_fp32_masters(tmp_path, cli):
    from ltx_video_fixtures import finetune

    run = finetune()
    result = cli(run.checkpoint, tmp_path / "out", "--base", run.base, "--component", "transformer", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / WEIGHTS)
    assert set(written) == set(run.truth["order"])
    assert run.truth["trainable"] and not run.truth["frozen"]
    for name in run.truth["trainable"]:
        assert torch.equal(written[name], run.tensors[name]), name
    base = component_weights(run.base, "transformer")
    assert any(not torch.equal(written[name], base[name]) for name in base), "training changed the weights"


# -- bad input: one line, exit 2, nothing written --------------------------------------------------------------------
def test_bad_input_is_one_line(single_files, tmp_path, cli):
    from cogvideox_fixtures import tiny_pipeline as tiny_cogvideox

    release = tmp_path / "release.safetensors"
    release.write_bytes(single_files("2b", "0.9.5").read_bytes())
    base = tiny_pipeline("2b", "0.9.5")
    assert_refused(cli, tmp_path, ["--model-type", "i2v", release, tmp_path / "out", "--base", base],
                   "--model-type i2v is not a LTX-Video task")
    assert_refused(cli, tmp_path, ["--model-type", "condition", release, tmp_path / "out", "--base", base],
                   "--model-type condition was given")
    assert_refused(cli, tmp_path, [release, tmp_path / "out", "--base", tiny_cogvideox("t2v")],
                   "holds a LTX-Video transformer, not a CogVideoX one")
    bare = tmp_path / "transformer.safetensors"
    save_file(component_weights(base, "transformer"), bare)
    assert_refused(cli, tmp_path, [bare, tmp_path / "out"], "not a published LTX-Video size; pass --base")


# -- precision --------------------------------------------------------------------------------------------------------
def normalisation_parameters(model: torch.nn.Module) -> set[str]:
    """Every parameter of a normalisation layer of the Diffusers class (found by class, not by name)."""
    kinds = ("norm",)
    return {f"{module_name}.{name}".lstrip(".") for module_name, module in model.named_modules()
            if any(kind in type(module).__name__.lower() for kind in kinds)
            for name, _ in module.named_parameters(recurse=False)}


def test_fp32_allowlist_is_exactly_the_normalisation_weights():
    from diffusers import LTXVideoTransformer3DModel

    with torch.device("meta"):
        model = LTXVideoTransformer3DModel(num_layers=2)
    expected = normalisation_parameters(model)
    assert expected and all(name.endswith(("norm_q.weight", "norm_k.weight")) for name in expected)
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    kept = {name for name, t in model.state_dict().items() if policy.target_dtype(name, t.dtype) == torch.float32}
    assert kept == expected
    assert not getattr(LTXVideoTransformer3DModel, "_keep_in_fp32_modules", None)


# -- every family's tables apart --------------------------------------------------------------------------------------
def _family_key_sets() -> dict[str, list[set[str]]]:
    """Names of each family's layouts, from full-size models on the meta device and their original tables inverted."""
    keys: dict[str, list[set[str]]] = {}
    for family in ("cogvideox", "wan", "ltx_video", "mochi"):
        spec = family_named(family)
        for component in ("transformer", "vae"):
            model_spec = getattr(spec, component)
            config = getattr(spec, f"{component}_config")(spec.variants[0])
            import diffusers

            with torch.device("meta"):
                model = getattr(diffusers, model_spec.class_name).from_config(config)
            lazy = {n: LazyTensor(t.shape, t.dtype, lambda: None) for n, t in model.state_dict().items()}
            keys.setdefault(family, []).append(set(lazy))
            counts = {"num_up_blocks": len(config.get("up_block_types", ()))} if "up_block_types" in config else {}
            for name in model_spec.tables:
                table = load_table(name)
                try:
                    inverted = plan_translation(table.inverted(), lazy, None, counts, strict=True).tensors
                except Exception:
                    continue  # a table of another version or layout of the same family
                if set(inverted) != set(lazy):
                    keys[family].append(set(inverted))
    return keys


def test_tables_never_match_another_familys_keys():
    from cogexport.models.recognize import component_tables

    key_sets = _family_key_sets()
    assert all(len(sets) >= 3 for sets in key_sets.values())  # Diffusers and original names of each
    for family, sets in key_sets.items():
        for component in ("transformer", "vae"):
            for _, name in component_tables(component):
                table = load_table(name)
                for keys in sets:
                    matches = table.recognises(table.select(sorted(keys))[0])
                    # a table several families list (Wan's, which its variants list too) is its owner's layout
                    if name.split("/", 1)[0] != family:
                        assert not matches, f"{name} recognises {family} keys"
        mine = [load_table(n) for _, n in component_tables("transformer", family_named(family))]
        assert any(t.recognises(t.select(sorted(s))[0]) for t in mine for s in sets)


def test_the_summary_says_the_vae_beside_the_transformer_apart(tmp_path):
    """The release file keeps the VAE beside the transformer; the summary gives each its own dtypes (the VAE kept whole
    in fp32 is one phrase, not each of its tensors listed as an exception to the transformer's bf16)."""
    from cogexport.exporter import export_original

    result = export_original(tiny_pipeline(*SHAPE_CLASSES[0]), tmp_path / "release", progress=False)
    assert result.precision.startswith("transformer: bf16, except ") and result.precision.endswith("; vae: fp32")
    assert "decoder" not in result.precision and "encoder" not in result.precision
