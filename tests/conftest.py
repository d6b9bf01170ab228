"""Shared test helpers: run the CLI as a user would, snapshot folders to prove nothing changed, check a refusal's whole
contract, and compare tensors to the bit."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from cogexport.cli import main

# What exports learn of Diffusers' classes (cogexport/models/diffusers_cache.py) goes to a folder of this test process
# and the processes it starts, not the user's ~/.cache: each run of the suite starts by asking Diffusers itself. The
# process that makes the folder (pytest's first; its xdist workers inherit the variable) removes it when it ends.
if "COGEXPORT_CACHE_DIR" not in os.environ:
    os.environ["COGEXPORT_CACHE_DIR"] = tempfile.mkdtemp(prefix="cogexport-test-cache-")
    atexit.register(shutil.rmtree, os.environ["COGEXPORT_CACHE_DIR"], ignore_errors=True)


class CliResult:
    def __init__(self, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


@pytest.fixture
def cli():
    """Run ``cogexport ARGS`` in-process; returns exit code, stdout and stderr separately."""

    def run(*args: object) -> CliResult:
        result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
        return CliResult(result.exit_code, result.stdout, result.stderr)

    return run


def run_cogexport_process(*args: object) -> subprocess.CompletedProcess:
    """Run cogexport in a fresh interpreter, the way a user's shell does."""
    return subprocess.run([sys.executable, "-m", "cogexport", *map(str, args)], capture_output=True, text=True)


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file below ``folder`` with its size, mtime and content hash."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns,
                                        hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted(folder.rglob("*")) if path.is_file()
    }


def leftovers(parent: Path) -> list[str]:
    """Staging folders a failed run would have left behind."""
    return [p.name for p in parent.iterdir() if ".cogexport-" in p.name]


def assert_refusal(result: CliResult, *phrases: str) -> str:
    """The CLI refused: exit code 2 and ONE error line holding every phrase. Returns that line."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert len(result.error_lines) == 1, result.stderr
    for phrase in phrases:
        assert phrase in result.error_lines[0], result.error_lines[0]
    return result.error_lines[0]


def assert_refused(cli, tmp_path: Path, args: list, *phrases: str, inputs: list[Path] = ()) -> str:
    """``cogexport ARGS`` on bad input keeps the whole contract of a refusal: ``assert_refusal``, no ``tmp_path/out``
    and no staging folder left, nothing below ``tmp_path`` changed, nor below ``inputs`` (a file's folder for a
    file). Returns the error line."""
    watched = [tmp_path, *(path if path.is_dir() else path.parent for path in inputs)]
    before = [snapshot(folder) for folder in watched]
    line = assert_refusal(cli(*args), *phrases)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    assert [snapshot(folder) for folder in watched] == before
    return line


def assert_same_tensors(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """The same names, every tensor equal to the bit and in the same dtype."""
    assert set(actual) == set(expected)
    for name, tensor in expected.items():
        assert actual[name].dtype == tensor.dtype and torch.equal(actual[name], tensor), name


def component_weights(folder: Path, component: str) -> dict[str, torch.Tensor]:
    """The tensors of a pipeline folder's component saved unsharded (diffusion_pytorch_model.safetensors)."""
    return load_file(folder / component / "diffusion_pytorch_model.safetensors")


@pytest.fixture
def counted():
    """The process-wide tally of bytes copied file to file (cogexport/write/byte_copy.py), from zero."""
    from cogexport.write import byte_copy

    byte_copy.COUNTS.reset()
    yield byte_copy.COUNTS


# Runs the command line in a fresh interpreter, then says which of these packages the run imported.
_RUN_AND_TELL_IMPORTS = """
import json, sys
from cogexport.__main__ import _run_command_line
sys.argv = ["cogexport", *sys.argv[1:]]
code = _run_command_line()
imported = sorted(name for name in ("diffusers", "transformers", "peft") if name in sys.modules)
print(json.dumps({"code": code, "imported": imported}))
"""


def command_in_fresh_process(args: list, cache: str) -> dict:
    """``cogexport ARGS`` in a fresh interpreter with ``COGEXPORT_CACHE_DIR=cache`` (empty: the Diffusers cache
    off); its exit code (which must be 0) and which of diffusers, transformers and peft it imported."""
    env = {**os.environ, "COGEXPORT_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-c", _RUN_AND_TELL_IMPORTS, *map(str, args)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout.strip().splitlines()[-1])
    assert told["code"] == 0, done.stderr
    return told


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but its model card (which names the command's output folder)."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and path.name != "README.md"}


def fresh_python(code: str, env: dict[str, str | None] | None = None) -> str:
    """What ``code`` prints, run in a fresh interpreter (where imports really happen); ``env``: variables set beside
    this process's (None: unset)."""
    environment = {**os.environ, **(env or {})}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={name: value for name, value in environment.items() if value is not None})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
