"""The Hugging Face Trainer's checkpoint-N/ under DeepSpeed, as transformers.Trainer leaves it (real runs on CPU ranks,
scripts/make_trainer_checkpoint.py): read by run folder, by checkpoint and by --tag in either spelling, always as the
fp32 masters of DeepSpeed's save, bit for bit, with a note naming what was read and what was set aside (the Trainer's
16-bit copy, ZeRO-3's empty placeholders); bad input refused in one line, nothing written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_refused, assert_same_tensors
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import load_file, save_file
from trainer_fixtures import RUNS, ZERO2, ZERO3, ZERO3_DIFFUSERS_PLACEHOLDERS, ZERO3_NO_GATHER, TrainerRun, \
    trainer_checkpoint

from cogexport import open_checkpoint
from cogexport.errors import CogExportError

READ = "read DeepSpeed's fp32 masters (ZeRO-{stage} partitions) of global_step{step}, the weights of the Hugging " \
       "Face Trainer's checkpoint-{step} (trainer_state.json: global step {step})"
LOWER_PRECISION = "model.safetensors beside it holds the same tensors (names and shapes): a lower-precision copy " \
                  "(bf16), not read; point at it to read it instead"
PLACEHOLDERS = "diffusion_pytorch_model.safetensors beside it holds the same names with ZeRO-3's empty placeholders " \
               "for 22 of its 64 tensors (shape [0]: saved without stage3_gather_16bit_weights_on_model_save): no " \
               "weights, not read"
# what each run leaves beside DeepSpeed's save, and the note that sets it aside (None: nothing there)
SET_ASIDE = {ZERO2: LOWER_PRECISION, ZERO3: LOWER_PRECISION, ZERO3_NO_GATHER: None,
             ZERO3_DIFFUSERS_PLACEHOLDERS: PLACEHOLDERS}
# how the user names the last step: the folder given, and --tag
WAYS = {"checkpoint": ("checkpoint-2", None), "run folder": ("run", None), "run, --tag global_step2": ("run",
        "global_step2"), "run, --tag checkpoint-2": ("run", "checkpoint-2"), "checkpoint, --tag global_step2": (
        "checkpoint-2", "global_step2"), "checkpoint, --tag checkpoint-2": ("checkpoint-2", "checkpoint-2")}


def given(run: TrainerRun, way: str) -> tuple[Path, list[str]]:
    fixture = trainer_checkpoint(run)
    folder, tag = WAYS[way]
    return (fixture.run if folder == "run" else fixture.step(2)), (["--tag", tag] if tag else [])


def consolidated(cli, source: Path, out: Path, *args) -> tuple[dict[str, torch.Tensor], str]:
    result = cli("consolidate", source, out, *args)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]  # the weights, and nothing else
    return load_file(out / "model.safetensors"), result.stderr


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.id)
def test_every_way_of_naming_the_step_reads_its_fp32_masters(run, way, tmp_path, cli):
    source, tag = given(run, way)
    written, stderr = consolidated(cli, source, tmp_path / "out", *tag)
    assert_same_tensors(written, trainer_checkpoint(run).masters())  # no optimizer state: exactly the module's keys
    assert READ.format(stage=run.stage, step=2) in stderr
    assert (SET_ASIDE[run] in stderr) if SET_ASIDE[run] else "beside it" not in stderr


@pytest.mark.parametrize("tag", ["global_step1", "checkpoint-1"])
def test_an_earlier_step_by_either_name(tag, tmp_path, cli):
    fixture = trainer_checkpoint(ZERO3_DIFFUSERS_PLACEHOLDERS)
    written, stderr = consolidated(cli, fixture.run, tmp_path / "out", "--tag", tag)
    assert_same_tensors(written, fixture.masters(step=1))
    assert f"read checkpoint-1, as --tag {tag} asks" in stderr and READ.format(stage=3, step=1) in stderr
    assert "checkpoint-1/diffusion_pytorch_model.safetensors beside it holds the same names with ZeRO-3's empty " \
           "placeholders" in stderr


@pytest.mark.parametrize("run, way", [(ZERO2, "run folder"), (ZERO3, "checkpoint, --tag global_step2"),
                                      (ZERO3_DIFFUSERS_PLACEHOLDERS, "run, --tag global_step2")],
                         ids=lambda value: getattr(value, "id", value))
def test_export_writes_the_trained_transformer(run, way, tmp_path, cli):
    source, tag = given(run, way)
    fixture = trainer_checkpoint(run)
    result = cli("--model-type", "t2v", source, tmp_path / "out", "--base", fixture.base, "--component",
                 "transformer", "--dtype", "fp32", *tag)
    assert result.exit_code == 0, result.stderr
    written = load_file(tmp_path / "out" / "diffusion_pytorch_model.safetensors")
    assert_same_tensors(written, fixture.masters())
    assert READ.format(stage=run.stage, step=2) in result.stderr


def test_inspect_describes_the_layout(cli):
    fixture = trainer_checkpoint(ZERO3)
    result = cli("inspect", fixture.run)
    assert result.exit_code == 0, result.stderr
    assert "Hugging Face Trainer checkpoint (DeepSpeed's save beside the Trainer's state): DeepSpeed ZeRO-3, bf16 " \
           "training, world size 2" in result.stdout
    report = json.loads(cli("inspect", fixture.run, "--json").stdout)
    assert (report["format"], report["stage"], report["tag"], report["step"]) == ("hf-trainer", 3, "global_step2", 2)
    assert READ.format(stage=3, step=2) in report["notes"] and f"checkpoint-2/{LOWER_PRECISION}" in report["notes"]
    assert report["problems"] == []


def test_the_trainers_placeholders_as_model_safetensors_are_set_aside(tmp_path, cli):
    """A Trainer that saves the module's own state dict under ZeRO-3 without the gather leaves model.safetensors of
    placeholders (transformers 5.24 deletes it; a save_pretrained of the module writes the same): here, the
    placeholders a real ZeRO-3 run wrote, under the Trainer's name."""
    step = Path(shutil.copytree(trainer_checkpoint(ZERO3_NO_GATHER).step(2), tmp_path / "run" / "checkpoint-2"))
    placeholders = trainer_checkpoint(ZERO3_DIFFUSERS_PLACEHOLDERS).step(2) / "diffusion_pytorch_model.safetensors"
    shutil.copy(placeholders, step / "model.safetensors")
    written, stderr = consolidated(cli, tmp_path / "run", tmp_path / "out")
    assert_same_tensors(written, trainer_checkpoint(ZERO3_NO_GATHER).masters())
    assert "checkpoint-2/model.safetensors beside it holds the same names with ZeRO-3's empty placeholders for 22 of " \
           "its 64 tensors" in stderr


@pytest.mark.parametrize("trainer_state", [True, False], ids=["Trainer", "DeepSpeed"])
def test_a_copy_may_keep_a_tied_weight_once(trainer_state, tmp_path, cli):
    """safetensors cannot store a tensor twice: a model with tied weights is copied without the alias (the toy model
    of the DeepSpeed fixtures ties head.weight to embed.weight). The copy rule is every reader's, the Trainer's or not."""
    fixture = deepspeed_checkpoint(DeepSpeedVariant(2, "bf16", 2))
    step = Path(shutil.copytree(fixture.checkpoint, tmp_path / "checkpoint-2"))
    expected = fixture.expected_state_dict()
    copy = {name: tensor.bfloat16() if tensor.is_floating_point() else tensor for name, tensor in expected.items()
            if name not in fixture.truth["tied"]}
    save_file(copy, step / "model.safetensors")
    if trainer_state:
        (step / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    written, stderr = consolidated(cli, step, tmp_path / "out")
    # at fp32: the masters, frozen weights upcast, buffers as kept, the alias a copy of its source
    assert_same_tensors(written, {name: tensor.float() if tensor.is_floating_point() and name not in
                                  fixture.truth["buffers"] else tensor for name, tensor in expected.items()})
    assert "model.safetensors beside it holds the same tensors (names and shapes): a lower-precision copy" in stderr
    assert ("the weights of the Hugging Face Trainer's checkpoint-2" in stderr) == trainer_state


def test_without_the_trainers_state_it_is_a_deepspeed_checkpoint(tmp_path):
    step = Path(shutil.copytree(trainer_checkpoint(ZERO2).step(2), tmp_path / "checkpoint-2"))
    (step / "trainer_state.json").unlink()
    with open_checkpoint(step) as checkpoint:
        assert checkpoint.info.format == "deepspeed"
        assert_same_tensors({n: t.load() for n, t in checkpoint.items()}, trainer_checkpoint(ZERO2).masters())


# -- bad input ------------------------------------------------------------------------------------------------
def copied_step(run: TrainerRun, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trainer_checkpoint(run).step(2), tmp_path / "run" / "checkpoint-2"))


@pytest.mark.parametrize("missing", ["bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
                                     "zero_pp_rank_1_mp_rank_00_model_states.pt"])
def test_a_missing_rank_file_is_named(missing, tmp_path, cli):
    step = copied_step(ZERO3, tmp_path)
    (step / "global_step2" / missing).unlink()
    for source in (step, tmp_path / "run"):
        assert_refused(cli, tmp_path, ["consolidate", source, tmp_path / "out"], missing, "missing")


@pytest.mark.parametrize("left", ["latest", "nothing"])
def test_placeholders_alone_are_no_weights(left, tmp_path, cli):
    """The Trainer's folder without DeepSpeed's save (deleted to save space) holds nothing to read."""
    step = copied_step(ZERO3_DIFFUSERS_PLACEHOLDERS, tmp_path)
    shutil.rmtree(step / "global_step2")
    if left == "nothing":
        (step / "latest").unlink()
    for source in (step, tmp_path / "run", step / "diffusion_pytorch_model.safetensors"):
        line = assert_refused(cli, tmp_path, ["consolidate", source, tmp_path / "out"])
        if left == "latest" and source.is_dir():
            assert "global_step2" in line and "does not exist" in line
        else:
            assert "diffusion_pytorch_model.safetensors holds DeepSpeed ZeRO-3's empty placeholders, not weights: 22 " \
                   "of its 64 tensors have shape [0]" in line and "read that step's DeepSpeed save instead" in line
    # a model folder once DeepSpeed's save is gone (its config.json names the class): described, never usable
    for source in (step / "diffusion_pytorch_model.safetensors", step) if left == "nothing" else ():
        inspected = cli("inspect", source)
        assert inspected.exit_code == 1 and "empty placeholders, not weights" in inspected.stdout, inspected.stdout
        assert re.search(r"^usable +no", inspected.stdout, re.MULTILINE), inspected.stdout


def other_tensors(file: Path, how: str) -> None:
    tensors = load_file(file)
    name = sorted(tensors)[0]
    if how == "a tensor missing":
        del tensors[name]
    elif how == "a shape changed":
        tensors[name] = tensors[name][:-1].contiguous()
    else:
        tensors = {"weight": torch.ones(3)}
    save_file(tensors, file)


@pytest.mark.parametrize("how, why", [("a tensor missing", "other tensor names: it lacks"),
                                      ("a shape changed", "has shape"),
                                      ("another model", "other tensor names"),
                                      ("unreadable", "it cannot be read")])
def test_a_model_safetensors_of_other_tensors_is_a_second_set_of_weights(how, why, tmp_path, cli):
    step = copied_step(ZERO2, tmp_path)
    if how == "unreadable":
        data = (step / "model.safetensors").read_bytes()
        (step / "model.safetensors").write_bytes(data[:-10])
    else:
        other_tensors(step / "model.safetensors", how)
    for source, shown, label in ((tmp_path / "run", "checkpoint-2/model.safetensors", "checkpoint-2"),
                                 (step, "model.safetensors", "checkpoint-2")):
        assert_refused(cli, tmp_path, ["consolidate", source, tmp_path / "out"], "holds more than one set of weights",
                       f"the Hugging Face Trainer checkpoint {label}, and {shown} inside it, which is not its copy",
                       why, f"--tag {label}")
    written, stderr = consolidated(cli, tmp_path / "run", tmp_path / "named", "--tag", "checkpoint-2")
    assert_same_tensors(written, trainer_checkpoint(ZERO2).masters())
    assert "checkpoint-2/model.safetensors inside it is not its copy" in stderr


def test_an_ema_is_not_asked_of_a_trainer_checkpoint(tmp_path):
    with pytest.raises(CogExportError, match="Hugging Face Trainer checkpoints hold one set of weights"):
        open_checkpoint(trainer_checkpoint(ZERO2).run, entry="ema")
