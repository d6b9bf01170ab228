"""A run's start: ``import cogexport`` imports nothing heavy until the package is used; the command line sets torch's
environment before torch is imported; the cyclic collector is paused while the modules are imported and is never left
paused; the command line freezes what its start made, and leaves out what only some jobs need. And the package's
functions keep their names however its modules are imported. Each case runs in a fresh interpreter, where the imports
really happen."""

from __future__ import annotations

import pytest
import torch
from conftest import fresh_python
from safetensors.torch import save_file


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


def test_importing_the_package_imports_torch_only_when_it_is_used():
    code = ("import sys, cogexport; before = 'torch' in sys.modules; cogexport.open_checkpoint; "
            "print(before, 'torch' in sys.modules)")
    assert fresh_python(code) == "False True"


def test_the_export_commands_start_leaves_the_gguf_package_to_gguf_jobs():
    """Importing ``gguf`` is 20 ms of a start; only ``--to gguf`` needs it (and imports it when it plans)."""
    code = ("import sys; from cogexport.__main__ import _command_line; _command_line(); import cogexport.cli_export; "
            "from cogexport.quantize import ggml_type; before = 'gguf' in sys.modules; ggml_type('Q4_K'); "
            "print(before, 'gguf' in sys.modules)")
    assert fresh_python(code) == "False True"


@pytest.mark.parametrize("users_value", [None, "1"])
def test_the_command_line_turns_off_torchs_search_for_device_backends_unless_the_user_set_it(users_value):
    """Set before torch is imported (torch reads it as it loads): a search of every installed package's entry points,
    0.06 s of a start, for backends a CPU tool never uses."""
    code = ("import os, sys; from cogexport.__main__ import _run_command_line; sys.argv = ['cogexport', '--version']; "
            "before = 'torch' in sys.modules; _run_command_line(); "
            "print(before, os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'], 'torch' in sys.modules)")
    printed = fresh_python(code, {"TORCH_DEVICE_BACKEND_AUTOLOAD": users_value}).splitlines()[-1]
    assert printed == f"False {users_value or '0'} True"


def test_export_and_consolidate_stay_functions_when_their_modules_are_imported():
    """Importing a module binds it on its package by its name: when the modules doing the work shared their names
    with these functions, a second ``cogexport.export(...)`` in one process failed with "'module' object is not
    callable", and after a guard for that, ``import cogexport.export.to_diffusers as m`` failed. The modules are
    named apart (cogexport/exporter/, cogexport/consolidation.py); both ways must work."""
    code = ("import cogexport\n"
            "for call in ('export', 'consolidate', 'export', 'consolidate', 'export_original'):\n"
            "    try:\n"
            "        getattr(cogexport, call)('/nonexistent-checkpoint', '/tmp/never-written')\n"
            "    except cogexport.CogExportError as error:\n"
            "        print(call, 'refused')\n"
            "import cogexport.exporter.to_diffusers as exporting, cogexport.consolidation as consolidating\n"
            "print(callable(cogexport.export), callable(cogexport.consolidate))\n"
            "print(exporting.export is cogexport.exporter.export, consolidating.consolidate is cogexport.consolidate)\n"
            "print(cogexport.ExportOptions is cogexport.exporter.ExportOptions)")
    assert fresh_python(code).splitlines() == [*(f"{call} refused" for call in ("export", "consolidate", "export",
                                                                                "consolidate", "export_original")),
                                               "True True", "True True", "True"]


def test_the_readers_of_other_packages_are_looked_up_when_a_checkpoint_is_opened_not_at_the_start(tmp_path):
    """Reading every installed package's entry points is tens of milliseconds: the command line's start and importing
    the checkpoint package leave the group cogexport.readers unread; opening a checkpoint reads it."""
    save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    code = ("import importlib.metadata as m; asked = []; real = m.entry_points\n"
            "m.entry_points = lambda **kw: asked.append(kw.get('group')) or real(**kw)\n"
            "from cogexport.__main__ import _command_line; _command_line(); import cogexport.checkpoint as c\n"
            "before = 'cogexport.readers' in asked\n"
            f"c.open_checkpoint({str(tmp_path / 'model.safetensors')!r}).close()\n"
            "print(before, 'cogexport.readers' in asked)")
    assert fresh_python(code) == "False True"
