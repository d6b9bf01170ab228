"""``--json`` for scripts: every command prints exactly one JSON object on stdout, with ``ok``, on success and on
failure (the one error line stays on stderr, the exit code is the one without --json); ``verify`` one object holding
its reports; the long lists of names of a checkpoint's facts given as their count and first few unless --verbose."""

from __future__ import annotations

import json
import os
import signal
import shutil

import pytest
import torch
from cogvideox_fixtures import build_tiny_transformer, config_folder, write_sat_run
from conftest import assert_refusal
from fixtures import DeepSpeedVariant, deepspeed_checkpoint
from safetensors.torch import load_file, save_file

ZERO3 = DeepSpeedVariant(3, "fp16", 3)  # 9 trainable tensors, 2 frozen, 1 tied, 2 buffers, 6 rank files


def one_object(text: str) -> dict:
    """stdout holds one JSON object and nothing else (json.loads refuses anything after it)."""
    report = json.loads(text)
    assert isinstance(report, dict), text
    return report


@pytest.fixture
def sat_export(tmp_path):
    """A tiny CogVideoX SAT run, the --base folder of its config, and its export."""
    original = build_tiny_transformer("1.5-5b", num_layers=2, seed=1)
    run = write_sat_run(tmp_path / "run", original.state_dict()).run_dir
    base = config_folder(tmp_path / "base", original)
    return run, base


@pytest.mark.parametrize("command", [
    ["export", "{readme}", "{out}"],
    ["{readme}", "{out}"],  # the default command
    ["consolidate", "{missing}", "{out}"],
    ["universal", "{missing}", "{out}"],
    ["inspect", "{missing}"],
    ["verify", "{out}", "--against", "{missing}"],
])
def test_every_command_fails_with_one_json_object_and_its_error_line(cli, tmp_path, command):
    (tmp_path / "README.md").write_text("# my run\n")
    paths = {"readme": tmp_path / "README.md", "missing": tmp_path / "nowhere", "out": tmp_path / "out"}
    result = cli(*[part.format(**paths) for part in command], "--json")
    line = assert_refusal(result)
    assert one_object(result.stdout) == {"ok": False, "error": line.removeprefix("cogexport: error: "), "exit_code": 2}
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arguments", [["inspect"], ["consolidate", "--no-such-option", "x", "y"],
                                       ["export", "a", "b", "--dtype", "fp64"]])
def test_a_command_line_mistake_is_a_json_object_too(cli, arguments):
    result = cli(*arguments, "--json")
    assert result.exit_code == 2 and "Usage:" in result.stderr
    report = one_object(result.stdout)
    assert report["ok"] is False and report["exit_code"] == 2 and report["error"] in result.stderr


def test_consolidate_summarises_the_sources_lists_of_names_unless_verbose(cli, tmp_path):
    fixture = deepspeed_checkpoint(ZERO3)
    result = cli("consolidate", fixture.checkpoint, tmp_path / "out", "--json")
    assert result.exit_code == 0, result.stderr
    report = one_object(result.stdout)
    assert report["ok"] is True and report["tensors"] == 14
    source = report["source"]
    assert source["frozen"] == {"count": 2, "first": fixture.truth["frozen"]}
    assert source["tied"] == {"count": 1, "first": fixture.truth["tied"]}
    assert source["trainable"]["count"] == 9 and len(source["trainable"]["first"]) == 5
    assert source["files"]["count"] == 6 and source["stage"] == 3 and source["problems"] == []

    verbose = one_object(cli("consolidate", fixture.checkpoint, tmp_path / "again", "--json", "--verbose").stdout)
    assert verbose["source"]["frozen"] == fixture.truth["frozen"] and verbose["source"]["tied"] == fixture.truth["tied"]
    assert len(verbose["source"]["trainable"]) == 9 and verbose["source"]["trainable"][:5] == source["trainable"]["first"]
    assert len(verbose["source"]["files"]) == 6


def test_universal_summarises_its_source(cli, tmp_path):
    save_dir = tmp_path / "run"
    shutil.copytree(deepspeed_checkpoint(DeepSpeedVariant(3, "fp32", 2)).checkpoint, save_dir)
    report = one_object(cli("universal", save_dir, "--json").stdout)
    assert report["ok"] is True and report["output"] == str(save_dir / "global_step2_universal")
    assert set(report["source"]["trainable"]) == {"count", "first"}


def test_inspect_is_one_object_whose_ok_says_usable(cli, tmp_path):
    fixture = deepspeed_checkpoint(ZERO3)
    report = one_object(cli("inspect", fixture.checkpoint, "--json").stdout)
    assert report["ok"] is True and report["usable"] is True
    assert report["buffers"] == {"count": 2, "first": fixture.truth["buffers"]}
    assert [row["name"] for row in report["tensors"]] == fixture.truth["order"], "every tensor's row stays"
    verbose = one_object(cli("inspect", fixture.checkpoint, "--json", "--verbose").stdout)
    assert verbose["buffers"] == fixture.truth["buffers"] and len(verbose["trainable"]) == 9

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(fixture.checkpoint, checkpoint)
    next(checkpoint.glob("*/zero_pp_rank_2_mp_rank_00_optim_states.pt")).unlink()
    result = cli("inspect", checkpoint, "--json")
    report = one_object(result.stdout)
    assert result.exit_code == 1 and report["ok"] is False and report["usable"] is False and report["problems"]


def test_export_and_verify_are_one_object_each(cli, tmp_path, sat_export):
    run, base = sat_export
    result = cli(run, tmp_path / "out", "--base", base, "--json")
    assert result.exit_code == 0, result.stderr
    report = one_object(result.stdout)
    assert report["ok"] is True and report["component"] == "transformer" and report["tensors"] == 64
    assert report["source"]["format"] == "deepspeed" and set(report["source"]["trainable"]) == {"count", "first"}

    verified = cli("verify", tmp_path / "out", "--against", run, "--no-load", "--json")
    assert verified.exit_code == 0, verified.stderr
    report = one_object(verified.stdout)
    assert report["ok"] is True and report["notes"] == []
    (model,) = report["reports"]
    assert model["ok"] and model["kind"] == "model" and model["tensors"] == 64

    weights = tmp_path / "out" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    tensors["proj_out.bias"] = tensors["proj_out.bias"] + 1
    save_file(tensors, weights, metadata={"format": "pt"})
    failed = cli("verify", tmp_path / "out", "--against", run, "--no-load", "--json")
    report = one_object(failed.stdout)
    assert failed.exit_code == 1 and report["ok"] is False
    assert report["reports"][0]["mismatches"] == ["proj_out.bias: values differ from the checkpoint's"]


def test_a_weights_file_holding_nan_refused_in_json(cli, tmp_path):
    torch.save({"good": torch.ones(4), "bad": torch.tensor([1.0, float("nan")])}, tmp_path / "weights.pt")
    result = cli("consolidate", tmp_path / "weights.pt", tmp_path / "out", "--json")
    line = assert_refusal(result, "bad")
    assert one_object(result.stdout)["error"] == line.removeprefix("cogexport: error: ")


@pytest.mark.parametrize("stop, exit_code, error", [
    (lambda: os.kill(os.getpid(), signal.SIGTERM), 128 + signal.SIGTERM, "stopped by SIGTERM; nothing was written"),
    (lambda: (_ for _ in ()).throw(KeyboardInterrupt), 130, "interrupted; nothing was written"),
])
def test_a_run_stopped_midway_is_one_json_object_too(cli, tmp_path, monkeypatch, stop, exit_code, error):
    """Stopped as it plans its files (by a kill signal, or Ctrl-C): nothing written, the object says so."""
    from cogexport import consolidation

    real_plan_shards = consolidation.plan_shards

    def stopped(*args, **kwargs):
        stop()  # a signal is delivered at the next bytecode: before the plan below
        return real_plan_shards(*args, **kwargs)

    torch.save({"w": torch.ones(4)}, tmp_path / "weights.pt")
    monkeypatch.setattr(consolidation, "plan_shards", stopped)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        result = cli("consolidate", tmp_path / "weights.pt", tmp_path / "out", "--json")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == exit_code
    assert one_object(result.stdout) == {"ok": False, "error": error, "exit_code": exit_code}
    assert not (tmp_path / "out").exists()
