"""LTX-2: the release single file both ways, every component (transformer, video and audio VAEs, text connectors,
vocoder), judged by Diffusers' own single-file converters and by the LTX-2 repository's own file and reference outputs
(../shared/fixtures/ltx2); the round trip byte for byte; pipelines that load and render frames and audio; variants from
shapes; verify's second opinions; bad input; the fp32 allowlist; the tables kept apart from every other family's."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import assert_refused, assert_same_tensors, component_weights
from fixtures import SCRIPTS
from ltx2_fixtures import (PREFIXES, connectors_of, judged, release, release_tensors, split, tiny_pipeline,
                           vocoder_of)
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cogexport.exporter import export, export_original
from cogexport.keymap.plan import plan_translation
from cogexport.keymap.table import load_table
from cogexport.lazy import LazyTensor
from cogexport.models.family import family_named
from cogexport.models.recognize import read_facts
from cogexport.precision import PrecisionPolicy

sys.path.insert(0, str(SCRIPTS))
from make_tiny_ltx2 import render  # noqa: E402

FAMILY = family_named("ltx2")
WEIGHTS = "diffusion_pytorch_model.safetensors"
COMPONENTS = ("transformer", "vae", "audio_vae", "connectors", "vocoder")
STATISTICS = ("channel", "mean-of-stds", "mean-of-stds_over_std-of-means")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """The shared release exported as a whole fp32 pipeline (--base: the tiny pipeline of its sizes), made once."""
    out = tmp_path_factory.mktemp("ltx2") / "pipeline"
    export(release(), out, base=tiny_pipeline("release"), dtype="fp32", progress=False)
    return out


def expected(component: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A component of the release as the judges make it: Diffusers' converters (transformer, VAEs) and the names
    Diffusers' conversion script lists (connectors, vocoder)."""
    if component == "connectors":
        return connectors_of(tensors)
    if component == "vocoder":
        return vocoder_of(tensors)
    return judged(component, tensors)


# -- release -> Diffusers, judged -------------------------------------------------------------------------------------
def test_every_component_of_the_release_equals_what_diffusers_makes_of_it(pipeline):
    tensors = release_tensors()
    ground_truth = load_file(release().parent.parent / "base" / "transformer" / "ground_truth.safetensors")
    assert_same_tensors(component_weights(pipeline, "transformer"), ground_truth)
    for component in COMPONENTS:
        assert_same_tensors(component_weights(pipeline, component), expected(component, tensors))
    # the statistics AutoencoderKLLTX2Video has no place for, kept as they were beside it
    kept = load_file(pipeline / "vae" / "per_channel_statistics.safetensors")
    assert_same_tensors(kept, {f"per_channel_statistics.{s}": tensors[f"vae.per_channel_statistics.{s}"]
                               for s in STATISTICS})
    assert load_file(pipeline / "audio_vae" / "per_channel_statistics.safetensors") == {}  # the release had none
    index = json.loads((pipeline / "model_index.json").read_text())
    assert (index["connectors"], index["vocoder"]) == (["ltx2", "LTX2TextConnectors"], ["ltx2", "LTX2Vocoder"])


def test_the_transformer_gives_the_original_models_outputs(pipeline):
    """The reference outputs ltx_core's own model computed on fixed inputs: the exported transformer gives exactly
    what the Diffusers model with the judge's weights (Diffusers' converter, the fixture's ground truth) gives, and
    the recorded outputs to float32 rounding (one thread: a multi-threaded matmul may sum in another order). The
    fixture's README saw them equal to the bit on the machine that made it; another CPU's kernels may round the
    last bits elsewhere, the same for the judge's weights (1e-05 at most, seen on 2026-11-27)."""
    from diffusers import LTX2VideoTransformer3DModel

    io = load_file(release().parent.parent / "reference_io.safetensors")
    model = LTX2VideoTransformer3DModel.from_pretrained(pipeline / "transformer").eval()
    judge = LTX2VideoTransformer3DModel.from_pretrained(pipeline / "transformer").eval()
    judge.load_state_dict(load_file(release().parent.parent / "base" / "transformer" / "ground_truth.safetensors"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for prefix in ("", "per_token."):
            inputs = dict(
                hidden_states=io["video_latent"], audio_hidden_states=io["audio_latent"],
                encoder_hidden_states=io["video_context"], audio_encoder_hidden_states=io["audio_context"],
                timestep=io.get(f"{prefix}video_timesteps", io["video_timesteps"]) * 1000,
                audio_timestep=io["audio_timesteps"] * 1000, sigma=io["sigma"],
                encoder_attention_mask=io["context_mask"], audio_encoder_attention_mask=io["context_mask"],
                video_coords=io["video_positions"], audio_coords=io["audio_positions"], fps=float(io["fps"]),
                return_dict=False)
            with torch.no_grad():
                (video, audio), (judged_video, judged_audio) = model(**inputs), judge(**inputs)
            assert torch.equal(video, judged_video) and torch.equal(audio, judged_audio), prefix
            assert torch.allclose(video, io[f"{prefix}original_video_output"], atol=5e-5, rtol=0), prefix
            assert torch.allclose(audio, io[f"{prefix}original_audio_output"], atol=5e-5, rtol=0), prefix
    finally:
        torch.set_num_threads(threads)


# -- Diffusers -> release: the round trip ---------------------------------------------------------------------------
def test_round_trip_rewrites_the_release_byte_for_byte(pipeline, tmp_path):
    """Every tensor, name, dtype and the config metadata as the LTX-2 repository wrote them: the same file."""
    result = export_original(pipeline, tmp_path / "back", dtype="fp32", progress=False)
    assert result.component == "original transformer and VAE and audio VAE and connectors and vocoder"
    assert (tmp_path / "back" / "ltx-2.safetensors").read_bytes() == release().read_bytes()


def test_a_bf16_round_trip_is_the_release_cast_alike(tmp_path):
    """Default dtype both ways: every tensor is the release's, cast by the family's policy (bf16; the VAEs, the vocoder
    and the query / key norms kept fp32); the statistics kept beside the VAE come back as they were."""
    export(release(), tmp_path / "pipeline", base=tiny_pipeline("release"), progress=False)
    export_original(tmp_path / "pipeline", tmp_path / "back", progress=False)
    written, original = load_file(tmp_path / "back" / "ltx-2.safetensors"), release_tensors()
    assert set(written) == set(original)
    for name, tensor in original.items():
        fp32 = name.startswith(("vae.", "audio_vae.", "vocoder.")) or name.endswith(("q_norm.weight", "k_norm.weight"))
        assert written[name].dtype == (torch.float32 if fp32 else torch.bfloat16), name
        assert torch.equal(written[name], tensor.to(written[name].dtype)), name


def test_every_component_alone_both_ways(pipeline, tmp_path):
    tensors = release_tensors()
    for component in COMPONENTS:
        out = tmp_path / component
        export(release(), out, component=component, base=tiny_pipeline("release"), dtype="fp32", progress=False)
        assert_same_tensors(load_file(out / WEIGHTS), component_weights(pipeline, component))
        if component == "transformer":
            continue
        back = tmp_path / f"{component}-back"
        export_original(out, back, component=component, dtype="fp32", progress=False)
        prefixes = PREFIXES.get(component) or ("model.diffusion_model.video_embeddings_connector.",
                                               "model.diffusion_model.audio_embeddings_connector.",
                                               "text_embedding_projection.")
        assert_same_tensors(load_file(back / f"{component}.safetensors"),
                            {n: t for n, t in tensors.items() if n.startswith(prefixes)})


def test_transformer_alone_takes_its_config_from_the_release_metadata(tmp_path, cli):
    """No --base: the custom size comes from the config JSON the release keeps in its header."""
    result = cli(release(), tmp_path / "out", "--component", "transformer", "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    ours = json.loads((tmp_path / "out" / "config.json").read_text())
    theirs = json.loads((release().parent.parent / "base" / "transformer" / "config.json").read_text())
    assert {k: v for k, v in ours.items() if k != "_diffusers_version"} == \
        {k: v for k, v in theirs.items() if k != "_diffusers_version"}


# -- pipelines that render -------------------------------------------------------------------------------------------
def test_a_release_written_from_a_pipeline_exports_back_and_renders_the_same(tmp_path):
    """Diffusers pipeline -> release file -> Diffusers pipeline: LTX2Pipeline loads it and renders the very frames and
    audio samples the first pipeline renders."""
    base = tiny_pipeline("render")
    result = export_original(base, tmp_path / "release", dtype="fp32", progress=False)
    assert any("per_channel_statistics.mean-of-stds" in note for note in result.notes)  # the VAE never had them
    export(tmp_path / "release" / "ltx-2.safetensors", tmp_path / "out", base=base, dtype="fp32", progress=False)
    for component in COMPONENTS:
        assert_same_tensors(component_weights(tmp_path / "out", component), component_weights(base, component))
    frames, audio = render(tmp_path / "out")
    expected_frames, expected_audio = render(base)
    assert frames.shape == (1, 5, 3, 32, 32) and audio.shape[:2] == (1, 2) and audio.shape[2] > 0
    assert torch.equal(frames, expected_frames) and torch.equal(audio, expected_audio)


def test_an_image_to_video_base_makes_the_image_to_video_pipeline(tmp_path, cli):
    result = cli(release(), tmp_path / "out", "--base", tiny_pipeline("release", "i2v"))
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "out" / "model_index.json").read_text())["_class_name"] == \
        "LTX2ImageToVideoPipeline"
    assert "LTX-2-19B-dev-I2V layout" in result.stdout
    result = cli(release(), tmp_path / "out2", "--base", tiny_pipeline("release"), "--model-type", "i2v")
    assert result.exit_code == 2 and "--model-type i2v was given" in result.stderr


# -- verify: Diffusers' second opinion -------------------------------------------------------------------------------
def test_verify_asks_diffusers_converters_for_every_model_they_convert(pipeline):
    from cogexport.verify import verify

    reports = {report.folder.rsplit("/", 1)[1]: report for report in verify(pipeline, release())}
    assert set(reports) == set(COMPONENTS) and all(report.ok for report in reports.values())
    judges = {"transformer": "convert_ltx2_transformer_to_diffusers", "vae": "convert_ltx2_vae_to_diffusers",
              "audio_vae": "convert_ltx2_audio_vae_to_diffusers"}
    for component, judge in judges.items():
        assert reports[component].judge == judge and reports[component].judged == reports[component].tensors
    for component in ("connectors", "vocoder"):
        assert reports[component].judge is None and "no converter" in reports[component].judge_note
        assert reports[component].loads_with_diffusers


def test_the_judge_is_not_asked_for_a_later_version(tmp_path):
    """Diffusers' converter renames by LTX-2.0's fixed list: on a file with 2.3's prompt modulation its answer would
    be wrong, so verify does not ask it (and says why)."""
    from cogexport.verify import VerifyReport
    from cogexport.verify_models import _ask_judge

    tensors = release_tensors()
    source = {name: LazyTensor(t.shape, t.dtype, t.clone) for name, t in tensors.items()}
    source["model.diffusion_model.prompt_adaln_single.linear.weight"] = LazyTensor(torch.Size((2, 2)), torch.float32,
                                                                                    lambda: torch.zeros(2, 2))
    report = VerifyReport("x", "LTX2VideoTransformer3DModel")
    _ask_judge(load_table("ltx2/original_transformer"), source, {}, report, 10**9)
    assert report.judge is None and "prompt_adaln_single.linear.weight" in report.judge_note


# -- full-size releases: variants from shapes (meta device) ----------------------------------------------------------
def _meta_release(variant_name: str) -> dict[str, torch.Tensor]:
    """A full-size release's names and shapes (meta tensors), from the variant's own configs, every model's table
    run backwards."""
    from cogexport.models.target import build_target

    variant = FAMILY.variant_named(variant_name)
    names: dict[str, torch.Tensor] = {}
    for component in ("transformer", "vae", "audio_vae", "connectors"):
        spec = FAMILY.components[component]
        target = build_target(spec.class_name, FAMILY.component_config(component, variant))
        lazy = {n: LazyTensor(s, torch.float32, lambda: None) for n, s in target.schema.items()}
        back = plan_translation(load_table(spec.original.table).inverted(), lazy, None, target.counts).tensors
        names.update({spec.original.prefix + n: torch.empty(t.shape, device="meta") for n, t in back.items()})
    return names


@pytest.mark.parametrize("variant", ["LTX-2-19B-dev", "LTX-2.3-22B-dev", "LTX-2.5-22B-dev"])
def test_full_size_releases_are_told_apart(variant):
    from diffusers.loaders.single_file_utils import infer_diffusers_model_type

    release_names = _meta_release(variant)
    recognised = read_facts(FAMILY, load_table("ltx2/original_transformer"),
                            {n: t.shape for n, t in release_names.items()})
    assert recognised.variant.name == variant
    assert recognised.facts["hidden"] == 4096 and recognised.facts["layers"] == 48
    # Diffusers' own detection takes an LTX-2 release for LTX-Video (its LTX-Video keys are checked first), so its
    # from_single_file needs the config given; cogexport tells the two apart by the audio stream
    assert infer_diffusers_model_type(release_names).startswith("ltx-video")
    assert FAMILY.task(recognised.variant.task).pipeline == "LTX2Pipeline"
    i2v = FAMILY.published_variant(recognised.facts, task="i2v")
    assert i2v.name == f"{variant}-I2V" and FAMILY.task(i2v.task).pipeline == "LTX2ImageToVideoPipeline"


# -- bad input: one line, exit 2, nothing written --------------------------------------------------------------------
def test_bad_input_is_one_line(tmp_path, cli):
    from ltx_video_fixtures import tiny_pipeline as tiny_ltx_video

    tensors = release_tensors()
    base = tiny_pipeline("release")
    given = tmp_path / "in"
    given.mkdir()
    assert_refused(cli, tmp_path, [release(), tmp_path / "out", "--base", tiny_ltx_video("2b", "0.9.5")],
                   "holds a LTX-2 transformer, not a LTX-Video one")
    assert_refused(cli, tmp_path, ["--model-type", "condition", release(), tmp_path / "out", "--base", base],
                   "--model-type condition is not a LTX-2 task")
    with safe_open(release(), "pt") as handle:
        metadata = handle.metadata()
    save_file(tensors, given / "corrupt.safetensors", metadata={"config": metadata["config"][:-5]})
    assert_refused(cli, tmp_path, [given / "corrupt.safetensors", tmp_path / "out", "--component", "transformer"],
                   "metadata 'config' is not valid JSON", inputs=[given])
    bare = {n: t for n, t in tensors.items() if n != "vae.decoder.conv_out.conv.weight"}
    save_file(bare, given / "lacking.safetensors", metadata=metadata)
    assert_refused(cli, tmp_path, [given / "lacking.safetensors", tmp_path / "out", "--base", base],
                   "lacks 1 tensor(s) the VAE --base describes", "vae/config.json) needs: decoder.conv_out.conv.weight",
                   inputs=[given])
    save_file(split(tensors, "model.diffusion_model."), given / "transformer.safetensors")
    assert_refused(cli, tmp_path, [given / "transformer.safetensors", tmp_path / "out"],
                   "not a published LTX-2 size; pass --base", inputs=[given])


def test_a_foreign_key_beside_the_vae_is_refused(pipeline, tmp_path, cli):
    """The file of kept statistics may hold only the statistics the VAE table keeps: anything else is refused."""
    import shutil

    copy = tmp_path / "pipeline"
    shutil.copytree(pipeline, copy)
    kept = load_file(copy / "vae" / "per_channel_statistics.safetensors")
    save_file({**kept, "decoder.conv_in.conv.weight": torch.zeros(1)}, copy / "vae" / "per_channel_statistics.safetensors")
    assert_refused(cli, tmp_path, [copy, tmp_path / "out", "--to", "original"],
                   "per_channel_statistics.safetensors holds decoder.conv_in.conv.weight, which is none of the "
                   "tensors kept beside the model", inputs=[copy])


# -- precision --------------------------------------------------------------------------------------------------------
def test_fp32_allowlist_is_exactly_the_normalisation_weights():
    from diffusers import LTX2VideoTransformer3DModel

    with torch.device("meta"):
        model = LTX2VideoTransformer3DModel(num_layers=2)
    norms = {f"{module_name}.{name}".lstrip(".") for module_name, module in model.named_modules()
             if "norm" in type(module).__name__.lower() for name, _ in module.named_parameters(recurse=False)}
    assert norms and all(name.endswith(("norm_q.weight", "norm_k.weight")) for name in norms)
    policy = PrecisionPolicy.build("bf16", FAMILY.transformer.keep_fp32, [])
    kept = {name for name, t in model.state_dict().items() if policy.target_dtype(name, t.dtype) == torch.float32}
    assert kept == norms
    assert not getattr(LTX2VideoTransformer3DModel, "_keep_in_fp32_modules", None)


# -- the tables apart from every other family's ----------------------------------------------------------------------
def test_the_tables_never_take_another_familys_model():
    """No LTX-2 table recognises another family's published model (in Diffusers or original names), and no other
    family's table recognises LTX-2's: except that LTX-Video 0.9.5's Diffusers VAE has the very names of LTX-2's (the
    family is then told by the folder's config.json, --base or the transformer beside it). LTX-2's own tables, which a
    family whose pipeline has LTX-2's VAE lists (SanaVideo's 720p model), are LTX-2's and take its VAE by design."""
    from cogexport.models.family import families
    from cogexport.models.recognize import component_tables
    from cogexport.models.target import build_target

    release_names = sorted(_meta_release("LTX-2-19B-dev"))
    for family in families():
        for component in ("transformer", "vae"):
            if family.key == "ltx2" or component not in family.components:
                continue
            spec = family.components[component]
            names = sorted(build_target(spec.class_name, family.component_config(component, family.variants[0])).schema)
            for ours in COMPONENTS:  # no table of any LTX-2 model
                for _, table_name in component_tables(ours, FAMILY):
                    table = load_table(table_name)
                    assert not table.recognises(table.select(names)[0]), (table_name, family.name)
            for _, table_name in component_tables(component, family):
                table = load_table(table_name)
                if table_name.startswith(f"{FAMILY.key}/"):
                    continue
                assert not table.recognises(table.select(release_names)[0]), (table_name, "LTX-2 release")


# -- LTX-2.3's layers: their release names, as DiffSynth-Studio's port of the LTX-2 code has them --------------------
def _names(model: torch.nn.Module, prefix: str = "") -> dict[str, LazyTensor]:
    return {prefix + name: LazyTensor(t.shape, torch.float32, lambda: None) for name, t in model.state_dict().items()}


def test_the_2_3_transformers_release_names_translate_into_diffusers_2_3_model():
    """Gated attention, the prompt modulation (prompt_adaln_single, prompt_scale_shift_table): DiffSynth-Studio's
    LTXModel built with 2.3's flags has them under the release's names; the table makes every tensor of Diffusers'
    LTX2VideoTransformer3DModel with 2.3's flags of them, each the right shape, and back."""
    from diffsynth_models import diffsynth_module
    from diffusers import LTX2VideoTransformer3DModel

    sizes = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, num_layers=2,
                 cross_attention_dim=16, caption_channels=24, audio_num_attention_heads=2, audio_attention_head_dim=4,
                 audio_in_channels=4, audio_out_channels=4, audio_cross_attention_dim=8)
    with torch.device("meta"):
        theirs = diffsynth_module("ltx2_dit").LTXModel(**sizes, apply_gated_attention=True, cross_attention_adaln=True)
        ours = LTX2VideoTransformer3DModel(**sizes, gated_attn=True, audio_gated_attn=True, cross_attn_mod=True,
                                           audio_cross_attn_mod=True, rope_type="split")
    release_names = _names(theirs, "model.diffusion_model.")
    schema = {name: t.shape for name, t in ours.state_dict().items()}
    table = load_table("ltx2/original_transformer")
    assert any("prompt_adaln_single" in n for n in release_names) and any("to_gate_logits" in n for n in release_names)
    assert plan_translation(table, release_names, schema, {}).tensors.keys() == schema.keys()
    back = plan_translation(table.inverted(), _names(ours), None, {}).tensors
    assert {f"model.diffusion_model.{name}" for name in back} == set(release_names)
    facts = read_facts(FAMILY, table, {n: t.shape for n, t in release_names.items()}).facts
    assert facts["version"] == "2.3"


def test_the_2_3_connectors_release_names_translate_into_diffusers_2_3_connectors():
    """Per-stream projections of the text encoder's layers and gated attention: DiffSynth-Studio's
    LTX2TextEncoderPostModules (its own converter's prefixes: text_embedding_projection. <- feature_extractor_linear.,
    model.diffusion_model.video_embeddings_connector. <- embeddings_connector.) translate into LTX2TextConnectors with
    2.3's settings."""
    from diffsynth_models import diffsynth_module
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    with torch.device("meta"):
        theirs = diffsynth_module("ltx2_text_encoder").LTX2TextEncoderPostModules(
            separated_audio_video=True, embedding_dim_gemma=24, num_layers_gemma=3, video_attention_heads=2,
            video_attention_head_dim=8, audio_attention_heads=2, audio_attention_head_dim=4, num_connector_layers=1,
            apply_gated_attention=True)
        ours = LTX2TextConnectors(caption_channels=24, text_proj_in_factor=3, video_connector_num_attention_heads=2,
                                  video_connector_attention_head_dim=8, video_connector_num_layers=1,
                                  audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=4,
                                  audio_connector_num_layers=1, video_gated_attn=True, audio_gated_attn=True,
                                  per_modality_projections=True, video_hidden_dim=16, audio_hidden_dim=8,
                                  proj_bias=True, rope_type="split")
    prefixes = {"feature_extractor_linear.": "text_embedding_projection.",
                "embeddings_connector.": "model.diffusion_model.video_embeddings_connector.",
                "audio_embeddings_connector.": "model.diffusion_model.audio_embeddings_connector."}
    release_names = {}
    for name, tensor in _names(theirs).items():
        prefix = next(p for p in prefixes if name.startswith(p))
        release_names[prefixes[prefix] + name[len(prefix):]] = tensor
    schema = {name: t.shape for name, t in ours.state_dict().items()}
    assert plan_translation(load_table("ltx2/original_connectors"), release_names, schema, {}).tensors.keys() == \
        schema.keys()


@pytest.mark.parametrize("version, variant", [("ltx-2", "LTX-2-19B-dev"), ("ltx-2.3", "LTX-2.3-22B-dev")])
def test_the_full_size_vae_layouts_are_the_ltx2_codes_own(version, variant):
    """DiffSynth-Studio's port of the LTX-2 video VAE, built at full size with each release's own block lists (2.0:
    a three-level decoder; 2.3: four levels, a temporal and a spatial one among them): the table run backwards on
    the variant's Diffusers VAE gives every one of its encoder's and decoder's names, each the same shape (it keeps the
    latent statistics inside each coder; the release, once, beside them)."""
    from diffsynth_models import diffsynth_module

    from cogexport.models.target import build_target

    module = diffsynth_module("ltx2_video_vae")
    with torch.device("meta"):
        coders = {"decoder": module.LTX2VideoDecoder(decoder_version=version),
                  "encoder": module.LTX2VideoEncoder(encoder_version=version)}
    theirs = {f"{coder}.{name}": t.shape for coder, model in coders.items() for name, t in model.state_dict().items()
              if not name.startswith("per_channel_statistics.")}
    target = build_target("AutoencoderKLLTX2Video", FAMILY.vae_config(FAMILY.variant_named(variant)))
    lazy = {name: LazyTensor(shape, torch.float32, lambda: None) for name, shape in target.schema.items()}
    ours = {name: t.shape for name, t in plan_translation(load_table("ltx2/original_vae").inverted(), lazy, None,
                                                           target.counts).tensors.items()
            if not name.startswith("per_channel_statistics.")}
    assert ours == theirs
