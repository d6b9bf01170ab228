"""cogexport installs as users install it: from its built wheel, not the editable checkout the other tests use.

The wheel and sdist are built as `pip install .` and a PyPI upload build them (PEP 517, isolated), the wheel must hold
every module and key map of the source tree, `twine check` must pass, and the wheel installed (not editable, its
dependencies resolved by pip) into a fresh virtualenv must run the commands on a real DeepSpeed fine-tune.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from cogvideox_fixtures import finetune

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    # from a clean copy of the tree (a build/ folder left by an earlier build would slip stale modules in)
    source, out = tmp_path_factory.mktemp("source") / "cogexport", tmp_path_factory.mktemp("dist")
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".fixtures", "build", "dist", "*.egg-info", "__pycache__", "demo-output", ".bench"))
    # each from the source tree, as `pip install .` builds the wheel (not through the sdist, whose file list would
    # hide a module left out of the package list)
    done = subprocess.run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(source)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


def _source_files() -> set[str]:
    """What the wheel must hold: every module of the package and every key map (as cogexport/key_maps/...)."""
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "cogexport").rglob("*.py") if "__pycache__" not in p.parts
               and "key_maps" not in p.relative_to(ROOT / "cogexport").parts}
    maps = {"cogexport/key_maps/" + str(p.relative_to(ROOT / "key_maps")) for p in (ROOT / "key_maps").rglob("*")
            if p.suffix in (".toml", ".py") and "__pycache__" not in p.parts}
    return modules | maps


def test_the_wheel_holds_every_module_and_key_map(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    missing = sorted(_source_files() - names)
    assert not missing, f"left out of the wheel: {missing}"
    # the K types' compiled quantizer, built with the wheel; its source in the sdist, for builds from it
    assert any(n.startswith("cogexport/quantize/_kquant_kernel") and n.endswith(".so") for n in names), sorted(names)
    with tarfile.open(built["sdist"]) as sdist:
        assert any(n.endswith("/cogexport/quantize/kquant_kernel.c") for n in sdist.getnames())
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(built["wheel"]).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text and "Requires-Python: >=3.10" in text
    assert any(n.endswith("licenses/LICENSE") for n in names)
    entry_points = zipfile.ZipFile(built["wheel"]).read(metadata.replace("METADATA", "entry_points.txt")).decode()
    assert "cogexport = cogexport.__main__:run" in entry_points


def test_twine_check_passes(built):
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(built["wheel"]),
                           str(built["sdist"])], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_installed_wheel_runs_the_commands(built, tmp_path):
    """A fresh virtualenv, the wheel installed the ordinary way; every command from that install only."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    torch = os.environ.get("TORCH_SPEC", "torch==2.13.0")  # installed first, as scripts/setup_venv.sh does
    for spec in (torch, str(built["wheel"])):
        done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", spec], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    run = finetune("t2v", 2, 2)
    command = str(venv / "bin" / "cogexport")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def cogexport(*args) -> str:
        done = subprocess.run([command, *map(str, args)], capture_output=True, text=True, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    where = subprocess.run([str(python), "-c", "import cogexport; print(cogexport.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, env=env).stdout
    assert str(venv) in where, f"cogexport was imported from {where}, not the installed wheel"
    compiled = subprocess.run([str(python), "-c", "from cogexport.quantize import kernel; print(kernel.available())"],
                              capture_output=True, text=True, cwd=tmp_path, env=env).stdout
    assert compiled.strip() == "True", "the installed wheel's compiled K quantizer does not load"
    assert "--model-type" in cogexport("export", "--help")
    assert "usable" in cogexport("inspect", run.checkpoint)
    cogexport("--model-type", "t2v", run.checkpoint, tmp_path / "out", "--base", run.base, "--component", "transformer",
              "--dtype", "fp32")
    assert "ok:" in cogexport("verify", tmp_path / "out", "--against", run.checkpoint, "--no-load")
