"""A run's start: the cyclic collector is paused while the modules are imported and is never left paused; the
command line freezes what its start made. Each case runs in a fresh interpreter, where the imports really happen."""

from __future__ import annotations

import subprocess
import sys

import pytest


def fresh_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("collecting", [True, False])
def test_importing_the_package_leaves_the_collector_as_it_found_it(collecting):
    setup = "" if collecting else "gc.disable(); "
    assert fresh_python(f"import gc; {setup}import cogexport; print(gc.isenabled())") == str(collecting)


def test_the_command_line_is_imported_then_its_start_frozen_and_the_collector_running():
    """After the start the collector runs (a long export's own cycles are collected), and the start's objects,
    torch's modules among them, are out of its reach."""
    code = ("import gc; from cogexport.__main__ import _command_line; main = _command_line(); "
            "print(gc.isenabled(), gc.get_freeze_count() > 100_000, main.name)")
    assert fresh_python(code).split() == ["True", "True", "main"]
