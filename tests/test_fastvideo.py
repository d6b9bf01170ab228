"""FastVideo runs as an input (issue 42, item 2) and the rule that optimizer, scheduler, RNG and trainer state are
never written as model weights (item 5), for every reader.

The run: scripts/make_fastvideo_checkpoint.py trains a tiny Wan in FastVideo's module names on two gloo ranks under
FSDP2 with AdamW (a student and a critic), keeps an EMA role and the EMA callback's per-rank shards, and saves every
step as FastVideo's CheckpointManager does; each role's weights are taken inside training. Consolidate and export
must give exactly those (fp32, torch.equal), and never an optimizer's state."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from fastvideo_fixtures import fastvideo_run, optimizer_of, save_in_one_process, small_role, write_fastvideo_step
from safetensors.torch import load_file, save_file

from cogexport import open_checkpoint
from cogexport.errors import CogExportError

OPTIMIZER_LEAVES = ("exp_avg", "exp_avg_sq", ".step")


def consolidated(cli, out, *args) -> dict[str, torch.Tensor]:
    """``cogexport consolidate ARGS OUT``'s weights."""
    result = cli("consolidate", *args, out)
    assert result.exit_code == 0, result.stderr
    return load_file(out / "model.safetensors")


def exported(cli, out, run, *args) -> dict[str, torch.Tensor]:
    """``cogexport ARGS OUT`` in fp32 with the run's config as --base: the transformer's weights."""
    result = cli(*args, out, "--base", run.base(out.with_name(out.name + "-base")), "--dtype", "fp32")
    assert result.exit_code == 0, result.stderr
    return load_file(out / "diffusion_pytorch_model.safetensors")


# -- the run: every role exactly, never an optimizer's state ---------------------------------------------------
def test_consolidate_writes_exactly_the_students_weights_and_no_optimizer_state(cli, tmp_path):
    run = fastvideo_run()
    written = consolidated(cli, tmp_path / "out", run.run)
    assert_same_tensors(written, run.fastvideo_weights("student"))  # FastVideo's own names, as saved
    assert not any(leaf in name for name in written for leaf in OPTIMIZER_LEAVES)


def test_export_gives_the_students_weights_in_diffusers_names_and_diffusers_loads_them(cli, tmp_path):
    from diffusers import WanTransformer3DModel

    run = fastvideo_run()
    written = exported(cli, tmp_path / "out", run, run.run)
    assert_same_tensors(written, run.diffusers_weights("student"))
    model = WanTransformer3DModel.from_pretrained(tmp_path / "out")
    assert_same_tensors(model.state_dict(), run.diffusers_weights("student"))


@pytest.mark.parametrize("how", [("--ema",), ("--role", "ema")])
def test_ema_reads_the_ema_role(how, cli, tmp_path):
    run = fastvideo_run()
    assert_same_tensors(exported(cli, tmp_path / "out", run, run.run, *how), run.diffusers_weights("ema"))


def test_role_reads_another_role_and_consolidate_and_verify_take_it_too(cli, tmp_path):
    run = fastvideo_run()
    assert_same_tensors(exported(cli, tmp_path / "export", run, run.run, "--role", "critic"),
                        run.diffusers_weights("critic"))
    assert_same_tensors(consolidated(cli, tmp_path / "out", run.run, "--role", "ema"), run.fastvideo_weights("ema"))
    checked = cli("verify", tmp_path / "export", "--against", run.run, "--role", "critic", "--no-load")
    assert checked.exit_code == 0 and checked.stdout.startswith("ok:"), checked.stdout + checked.stderr
    assert cli("verify", tmp_path / "export", "--against", run.run, "--no-load").exit_code == 1  # not the student


def test_the_callbacks_ema_in_per_rank_pieces_is_refused_with_the_reason(cli, tmp_path):
    run = fastvideo_run()
    line = assert_refused(cli, tmp_path, [run.finetune, tmp_path / "out", "--base", run.base(tmp_path / "base"),
                                          "--ema"], "cannot be rebuilt", "local shard", "world size 2",
                          inputs=[run.finetune])
    assert "callbacks.ema.student_ema" in line
    assert_refused(cli, tmp_path, ["consolidate", run.finetune, tmp_path / "out", "--role", "ema"],
                   "cannot be rebuilt", inputs=[run.finetune])


def test_the_callbacks_ema_is_read_when_it_is_whole_at_world_size_one(cli, tmp_path):
    run = fastvideo_run(world_size=1)
    assert_same_tensors(exported(cli, tmp_path / "out", run, run.finetune, "--ema"),
                        run.diffusers_weights("callback_ema"))


def test_the_dcp_folder_of_a_step_and_a_run_folder_read_as_fastvideo():
    run = fastvideo_run()
    with open_checkpoint(run.run / "checkpoint-2" / "dcp") as step, open_checkpoint(run.run) as newest:
        assert step.info.format == newest.info.format == "fastvideo"
        assert list(step) == list(newest) == list(run.names.values())
        assert "took the newest step checkpoint-2" in newest.info.notes[0]


def test_inspect_names_the_roles_the_one_read_and_what_else_the_save_holds(cli):
    run = fastvideo_run()
    result = cli("inspect", run.run, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["format"], report["world_size"], report["step"]) == ("fastvideo", 2, 2)
    assert report["roles"] == ["student (trainable)", "critic (trainable)", "ema"]
    assert report["role"] == "the student role (roles.student.transformer)" and report["usable"]
    held = "; ".join(report["contents"])
    for phrase in ("optimizer states exp_avg, exp_avg_sq, step of the student role", "of the critic role",
                   "callbacks.ema.student_ema", "local shard", "schedulers.student", "dataloader",
                   "rng_state_rank0.pt"):
        assert phrase in held, held
    assert "FastVideo Wan transformer" in json.dumps(report["models"])
    text = cli("inspect", run.run, "--role", "critic", "--quick").stdout
    assert "the critic role (roles.critic.transformer)" in text and "method DMD2Method" in text


def test_a_role_the_save_has_not_and_ema_beside_another_role_are_refused(cli, tmp_path):
    run = fastvideo_run()
    assert_refused(cli, tmp_path, ["consolidate", run.run, tmp_path / "out", "--role", "teacher"],
                   "no 'teacher' role", "student (trainable), critic (trainable), ema", inputs=[run.run])
    assert_refused(cli, tmp_path, [run.run, tmp_path / "out", "--ema", "--role", "critic"], "give one of them")


# -- bad input: one line, nothing written --------------------------------------------------------------------
@pytest.mark.parametrize("damage, phrase", [("{not json", "is not JSON"), ('{"step": 7}', "says step 7"),
                                            ('{"step": "2"}', "names no step"),
                                            ('{"step": 2, "config": [1]}', "config is not a mapping")])
def test_damaged_metadata_json_is_refused_and_inspect_lists_it(damage, phrase, cli, tmp_path):
    step = tmp_path / "copy" / "checkpoint-2"
    shutil.copytree(fastvideo_run().run / "checkpoint-2", step)
    (step / "metadata.json").write_text(damage)
    assert_refused(cli, tmp_path, ["consolidate", step, tmp_path / "out"], "metadata.json", phrase)
    result = cli("inspect", step, "--json", "--quick")
    assert result.exit_code == 1 and phrase in json.loads(result.stdout)["problems"][0]


def test_a_missing_rank_is_refused(cli, tmp_path):
    step = tmp_path / "copy" / "checkpoint-2"
    shutil.copytree(fastvideo_run().run / "checkpoint-2", step)
    (step / "dcp" / "__1_0.distcp").unlink()
    assert_refused(cli, tmp_path, ["consolidate", step, tmp_path / "out"], "rank 1's file __1_0.distcp is missing")


def test_without_its_metadata_json_the_dcp_reader_refuses_the_roles_rather_than_merge_them(cli, tmp_path):
    step = tmp_path / "copy" / "checkpoint-2"
    shutil.copytree(fastvideo_run().run / "checkpoint-2", step)
    (step / "metadata.json").unlink()
    assert_refused(cli, tmp_path, ["consolidate", step, tmp_path / "out"], "several sets of weights",
                   "roles.critic.transformer, roles.ema.transformer, roles.student.transformer")


def test_a_key_set_it_cannot_place_is_refused_by_name(tmp_path):
    role = small_role(0)
    step = write_fastvideo_step(tmp_path, {"roles.student.transformer": role, "mystery": {"w": torch.ones(3)}})
    with pytest.raises(CogExportError, match="the key set 'mystery'"):
        open_checkpoint(step)


def test_optimizer_state_filed_among_a_roles_weights_is_refused(tmp_path):
    role = small_role(0)
    misfiled = {**role, "blocks.0.to_q.weight.exp_avg": torch.zeros(4, 4)}
    step = write_fastvideo_step(tmp_path / "a", {"roles.student.transformer": misfiled,
                                                 "optimizers.student": optimizer_of(role)})
    with pytest.raises(CogExportError, match="which its optimizer .* trains no parameter of"):
        open_checkpoint(step)
    flattened = {**role, "state.blocks.0.to_q.weight.exp_avg": torch.zeros(4, 4)}
    step = write_fastvideo_step(tmp_path / "b", {"roles.student.transformer": flattened})
    with pytest.raises(CogExportError, match="is optimizer state filed among the student role's weights"):
        open_checkpoint(step)


def test_a_trainable_roles_weights_must_have_its_optimizer_states_shapes(tmp_path):
    role = small_role(0)
    piece = {**role, "blocks.0.to_q.weight": role["blocks.0.to_q.weight"][:2]}  # one rank's rows, as an EMA shard
    step = write_fastvideo_step(tmp_path, {"roles.student.transformer": piece,
                                           "optimizers.student": optimizer_of(role)})
    with pytest.raises(CogExportError, match=r"is \[2, 4\] but its optimizer state is \[4, 4\]"):
        open_checkpoint(step)


def test_the_default_role_is_the_student_else_the_only_trainable_one(tmp_path):
    critic, generator = small_role(1), small_role(2)
    only = write_fastvideo_step(tmp_path / "one", {"roles.critic.transformer": critic,
                                                   "optimizers.critic": optimizer_of(critic),
                                                   "roles.ema.transformer": small_role(3)})
    with open_checkpoint(only) as checkpoint:
        assert_same_tensors({name: t.load() for name, t in checkpoint.items()}, critic)
    several = write_fastvideo_step(tmp_path / "two", {
        "roles.critic.transformer": critic, "optimizers.critic": optimizer_of(critic),
        "roles.generator.transformer": generator, "optimizers.generator": optimizer_of(generator)})
    with pytest.raises(CogExportError, match="critic .trainable., generator .trainable. and none is the student"):
        open_checkpoint(several)
    with open_checkpoint(several, entry="generator") as checkpoint:
        assert_same_tensors({name: t.load() for name, t in checkpoint.items()}, generator)


def test_a_methods_own_ema_is_read_when_whole(tmp_path):
    """DiffusionNFT keeps its EMA in diffusion_nft.ema: {"shadow": local shards, "update_count"}."""
    role, shadow = small_role(0), small_role(5)
    step = write_fastvideo_step(tmp_path, {"roles.student.transformer": role, "optimizers.student": optimizer_of(role),
                                           "diffusion_nft.ema": {"shadow": shadow, "update_count": torch.tensor(3)}})
    with open_checkpoint(step, entry="ema") as checkpoint:
        assert_same_tensors({name: t.load() for name, t in checkpoint.items()}, shadow)
        assert checkpoint.info.facts.role == "the EMA kept by the run (diffusion_nft.ema.shadow)"


def test_an_ema_callback_that_has_not_started_is_refused(tmp_path):
    role = small_role(0)
    step = write_fastvideo_step(tmp_path, {"roles.student.transformer": role, "optimizers.student": optimizer_of(role),
                                           "callbacks": {"ema": {"student_ema": small_role(4), "ema_started": False}}})
    with pytest.raises(CogExportError, match="had not started"):
        open_checkpoint(step, entry="ema")


# -- the key map -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape_class", ["t2v", "i2v", "flf2v"])
def test_the_fastvideo_table_runs_both_ways_on_every_wan_shape(shape_class):
    """FastVideo's names as the fixture script writes them by hand (its own mapping, from FastVideo's facts), through
    cogexport's table to Diffusers and back, the image branch included."""
    import sys

    from fixtures import SCRIPTS
    from wan_fixtures import build_tiny_transformer

    from cogexport.keymap.plan import plan_translation
    from cogexport.keymap.table import load_table
    from cogexport.lazy import LazyTensor

    sys.path.insert(0, str(SCRIPTS))
    from make_fastvideo_checkpoint import rename

    diffusers = build_tiny_transformer(shape_class).state_dict()
    fastvideo = {rename(name, to_fastvideo=True): tensor for name, tensor in diffusers.items()}
    table = load_table("wan/fastvideo_transformer")
    assert table.recognises(fastvideo) and not load_table("wan/diffusers_transformer").recognises(fastvideo)

    def run(table, source, target):
        lazy = {name: LazyTensor(t.shape, t.dtype, lambda t=t: t) for name, t in source.items()}
        plan = plan_translation(table, lazy, {name: t.shape for name, t in target.items()}, {})
        return {name: tensor.load() for name, tensor in plan.tensors.items()}

    assert_same_tensors(run(table, fastvideo, diffusers), diffusers)
    assert_same_tensors(run(table.inverted(), diffusers, fastvideo), fastvideo)


# -- rule 5 in the other readers -------------------------------------------------------------------------------
def test_the_dcp_reader_never_reads_optimizer_state_beside_top_level_weights(tmp_path, cli):
    weights = {"proj.weight": torch.randn(3, 2), "proj.bias": torch.randn(3)}
    optimizer = {"state": {name: {"exp_avg": torch.ones_like(t), "step": torch.tensor(2.0)}
                           for name, t in weights.items()}, "param_groups": [{"lr": 0.1}]}
    # "adam": a group no trainer's name gives away; its path (state ... exp_avg) does
    save_in_one_process({**weights, "adam": optimizer, "callbacks": {"ema": {"proj.weight": torch.zeros(3, 2)}}},
                        tmp_path / "save")
    assert_same_tensors(consolidated(cli, tmp_path / "out", tmp_path / "save"), weights)


def test_a_torch_save_file_never_yields_optimizer_or_trainer_state(tmp_path, cli):
    weights = {"proj.weight": torch.randn(3, 2)}
    flat = {**weights, "step": torch.tensor(5), "optimizer.state.proj.weight.exp_avg": torch.ones(3, 2)}
    torch.save(flat, tmp_path / "flat.pt")
    result = cli("consolidate", tmp_path / "flat.pt", tmp_path / "flat")
    assert result.exit_code == 0 and "left out 2 tensors of training state" in result.stderr, result.stderr
    assert_same_tensors(load_file(tmp_path / "flat" / "model.safetensors"), weights)
    torch.save({"model": weights, "optimizer": {"state.proj.weight.exp_avg": torch.ones(3, 2)}}, tmp_path / "both.pt")
    assert_same_tensors(consolidated(cli, tmp_path / "both", tmp_path / "both.pt"), weights)
    assert_refused(cli, tmp_path, ["consolidate", tmp_path / "both.pt", tmp_path / "out", "--role", "optimizer"],
                   "--role 'optimizer'", "never model weights")


def test_a_safetensors_file_never_yields_optimizer_state(tmp_path, cli):
    weights = {"proj.weight": torch.randn(3, 2)}
    save_file({**weights, "optimizer.state.proj.weight.exp_avg_sq": torch.ones(3, 2)}, tmp_path / "model.safetensors")
    result = cli("consolidate", tmp_path / "model.safetensors", tmp_path / "first")
    assert result.exit_code == 0 and "left out 1 tensor of training state" in result.stderr, result.stderr
    assert_same_tensors(load_file(tmp_path / "first" / "model.safetensors"), weights)
    save_file({"lr_scheduler.last_lr": torch.ones(1)}, tmp_path / "state.safetensors")
    assert_refused(cli, tmp_path, ["consolidate", tmp_path / "state.safetensors", tmp_path / "out"],
                   "holds training state only")


def test_a_deepspeed_role_naming_training_state_is_refused(tmp_path, cli):
    from fixtures import DeepSpeedVariant, deepspeed_checkpoint

    run = deepspeed_checkpoint(DeepSpeedVariant(0, "fp32", 1))  # its model-states file keeps 'optimizer'
    for role in ("optimizer", "lr_scheduler"):
        assert_refused(cli, tmp_path, ["consolidate", run.checkpoint, tmp_path / "out", "--role", role],
                       f"--role '{role}'", "never model weights", inputs=[run.checkpoint])
    assert_same_tensors(consolidated(cli, tmp_path / "module", run.checkpoint, "--role", "module"),
                        run.expected_state_dict())
