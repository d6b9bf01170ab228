"""Shared test helpers: run the CLI as a user would, and snapshot folders to prove nothing changed."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cogexport.cli import main


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
