"""DiffSynth-Studio's own Wan-Animate-2 model (diffsynth/models/wan_animate_2_dit.py: the release's module tree, whose
state dict is the release file's names) loaded without the rest of the package, whose import needs torchvision and
more. Its attention is DiffSynth's own (diffsynth/core/attention/attention.py, loaded from the installed file: on CPU
it runs torch's scaled_dot_product_attention); only the gradient-checkpointing helper, which no test runs (and whose
module imports DeepSpeed), is stood in for."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

PACKAGE = "cogexport_tests_diffsynth_animate2"


def _package(name: str, path: list[str], **attributes) -> types.ModuleType:
    """A package whose __init__ is not run (DiffSynth's import everything), its submodules found under ``path``."""
    module = types.ModuleType(name)
    module.__path__ = path
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def wan_animate2_module() -> types.ModuleType:
    """diffsynth.models.wan_animate_2_dit, loaded from the installed package's file."""
    spec = importlib.util.find_spec("diffsynth")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("DiffSynth-Studio is not installed (scripts/setup_venv.sh installs it)")
    if f"{PACKAGE}.models" not in sys.modules:
        root = Path(list(spec.submodule_search_locations)[0])

        def unused(*args, **kwargs):
            raise RuntimeError("gradient checkpointing is never run here")

        _package(PACKAGE, [])
        _package(f"{PACKAGE}.core", [str(root / "core")])
        _package(f"{PACKAGE}.core.gradient", [], gradient_checkpoint_forward=unused)
        _package(f"{PACKAGE}.core.attention", [str(root / "core" / "attention")])
        _package(f"{PACKAGE}.models", [str(root / "models")])
    return importlib.import_module(f"{PACKAGE}.models.wan_animate_2_dit")
