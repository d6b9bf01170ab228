"""The training-stacks benchmark (scripts/benchmark_training_stacks.py) compares every tool's output before timing
it: the FastVideo exports against the student's weights, cogexport's universal checkpoint against DeepSpeed's
ds_to_universal. Each comparison must pass on right outputs and refuse one spoiled in one place (a value, a dtype,
an extra or a missing tensor). The files are real safetensors and torch.save files laid out as the tools write them,
at a few elements a tensor."""

from __future__ import annotations

import sys

import pytest
import torch
from fixtures import SCRIPTS
from safetensors.torch import save_file

sys.path.insert(0, str(SCRIPTS))
from benchmark_training_stacks import COMPARE_FASTVIDEO, COMPARE_UNIVERSAL  # noqa: E402

STUDENT = {"blocks.0.attn1.to_q.weight": torch.arange(6.0).reshape(2, 3), "scale_shift_table": torch.ones(1, 2, 3)}


def run_check(source: str, *arguments, monkeypatch) -> None:
    """The check as the harness runs it (``python -c SOURCE ARGUMENTS``), in this process."""
    monkeypatch.setattr(sys, "argv", ["-c", *map(str, arguments)])
    exec(compile(source, "<check>", "exec"), {"__name__": "__main__"})


@pytest.fixture
def fastvideo_outputs(tmp_path):
    truth = tmp_path / "truth.safetensors"
    save_file({**{f"student.{k}": v for k, v in STUDENT.items()}, "critic.scale_shift_table": torch.zeros(1, 2, 3)},
              truth)
    outputs = []
    for tool in ("cogexport", "fastvideo"):
        (tmp_path / tool / "transformer").mkdir(parents=True)
        save_file({k: v.clone() for k, v in STUDENT.items()}, tmp_path / tool / "transformer" / "model.safetensors")
        outputs.append(tmp_path / tool)
    return truth, outputs


def test_fastvideo_compare_accepts_the_students_weights(fastvideo_outputs, monkeypatch, capsys):
    run_check(COMPARE_FASTVIDEO, *fastvideo_outputs[0:1], *fastvideo_outputs[1], monkeypatch=monkeypatch)
    assert capsys.readouterr().out.strip() == '{"tensors": 2}'


@pytest.mark.parametrize("spoiled", [
    {"scale_shift_table": torch.full((1, 2, 3), 2.0)},  # one value set
    {"scale_shift_table": torch.ones(1, 2, 3, dtype=torch.bfloat16)},  # a lower precision, the same values
    {"blocks.0.ffn.fc_in.weight.exp_avg": torch.ones(2)},  # a tensor more (optimizer state written as a weight)
])
def test_fastvideo_compare_refuses_a_spoiled_output(fastvideo_outputs, spoiled, monkeypatch):
    truth, outputs = fastvideo_outputs
    save_file({**STUDENT, **spoiled}, outputs[1] / "transformer" / "model.safetensors")
    with pytest.raises(AssertionError):
        run_check(COMPARE_FASTVIDEO, truth, *outputs, monkeypatch=monkeypatch)


def test_fastvideo_compare_refuses_a_missing_tensor(fastvideo_outputs, monkeypatch):
    truth, outputs = fastvideo_outputs
    save_file({"scale_shift_table": STUDENT["scale_shift_table"]}, outputs[0] / "transformer" / "model.safetensors")
    with pytest.raises(AssertionError):
        run_check(COMPARE_FASTVIDEO, truth, *outputs, monkeypatch=monkeypatch)


def write_universal(folder, states: dict, step: bool) -> None:
    """A universal checkpoint's per-parameter files: zero/<name>/<state>.pt holding {"param": tensor}."""
    for name, tensor in STUDENT.items():
        (folder / "zero" / name).mkdir(parents=True)
        for state, scale in states.items():
            torch.save({"param": tensor * scale}, folder / "zero" / name / f"{state}.pt")
        if step:
            torch.save({"param": torch.tensor(1.0)}, folder / "zero" / name / "step.pt")
    torch.save({"param_groups": []}, folder / "zero" / "optimizer_state.pt")


STATES = {"fp32": 1.0, "exp_avg": 0.5, "exp_avg_sq": 0.25}


@pytest.mark.parametrize("theirs_states, message", [
    (STATES, None),
    ({**STATES, "exp_avg": 0.75}, "exp_avg.pt"),  # a moment differs
    ({**STATES, "exp_avg_sq2": 1.0}, "exp_avg_sq2.pt"),  # a file only the other tool wrote
    ({"fp32": 1.0, "exp_avg": 0.5}, None),  # one the other tool did not write: refused by the count
])
def test_universal_compare_needs_every_file_equal(tmp_path, theirs_states, message, monkeypatch, capsys):
    write_universal(tmp_path / "ours", STATES, step=True)  # cogexport writes each step too; ds_to_universal not
    write_universal(tmp_path / "theirs", theirs_states, step=False)
    if theirs_states is STATES:
        run_check(COMPARE_UNIVERSAL, tmp_path / "ours", tmp_path / "theirs", monkeypatch=monkeypatch)
        assert capsys.readouterr().out.strip() == '{"files": 6}'
        return
    with pytest.raises((AssertionError, FileNotFoundError), match=message):
        run_check(COMPARE_UNIVERSAL, tmp_path / "ours", tmp_path / "theirs", monkeypatch=monkeypatch)
