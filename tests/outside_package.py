"""A package that extends cogexport from outside, made in a temporary folder as pip would install it: its modules and
a ``<name>-0.1.dist-info`` whose ``entry_points.txt`` declares cogexport's entry-point groups. A process started with
that folder on ``PYTHONPATH`` finds the entry points with ``importlib.metadata``, exactly as it finds those of an
installed package; nothing of cogexport's is changed or told."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Mapping


def outside_package(folder: Path, name: str, files: Mapping[str, str],
                    entry_points: Mapping[str, Mapping[str, str]]) -> Path:
    """Write ``files`` (paths relative to ``folder``, dedented) and the distribution's metadata declaring
    ``entry_points`` ({group: {entry name: value}}); return ``folder``, to put on PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{entry} = {value}\n" for entry, value in entries.items()) + "\n"
        for group, entries in entry_points.items()))
    return folder


def run_with_package(package: Path, *args: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m cogexport ARGS`` in a fresh process that has ``package`` installed (on PYTHONPATH)."""
    paths = [str(package), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, "-m", "cogexport", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)
