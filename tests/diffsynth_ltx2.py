"""DiffSynth-Studio's own LTX-2 models (diffsynth/models/ltx2_*.py: its port of the LTX-2 repository's ltx_core, module
for module, the release's names) loaded without the rest of the package, whose import needs torchvision, torchaudio and
more. Only what building a model on the meta device needs is stood in for: the attention function and the gradient
checkpointing helper, which no test here runs. These models are the judge of the LTX-2.3 layers' release names, which
no file of the shared fixtures holds."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

PACKAGE = "cogexport_tests_diffsynth"


def _stand_in(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so that its submodules import
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def diffsynth_module(name: str) -> types.ModuleType:
    """diffsynth.models.<name> (ltx2_dit, ltx2_text_encoder, ...), loaded from the installed package's file."""
    spec = importlib.util.find_spec("diffsynth")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("DiffSynth-Studio is not installed (scripts/setup_venv.sh installs it)")
    if f"{PACKAGE}.models" not in sys.modules:
        models = Path(list(spec.submodule_search_locations)[0]) / "models"

        def unused(*args, **kwargs):
            raise RuntimeError("DiffSynth's models are built here, never run")

        _stand_in(PACKAGE)
        _stand_in(f"{PACKAGE}.core", gradient_checkpoint_forward=unused)
        _stand_in(f"{PACKAGE}.core.attention")
        _stand_in(f"{PACKAGE}.core.attention.attention", attention_forward=unused)
        _stand_in(f"{PACKAGE}.models").__path__ = [str(models)]
    return importlib.import_module(f"{PACKAGE}.models.{name}")
