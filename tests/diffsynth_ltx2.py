"""DiffSynth-Studio's own LTX-2 models (diffsynth/models/ltx2_*.py: its port of the LTX-2 repository's ltx_core, module
for module, the release's names) loaded without the rest of the package, whose import needs torchvision, torchaudio and
more. Their attention function is DiffSynth's own file (it needs only torch and einops; on CPU it runs torch's
scaled-dot-product attention), so the models run; only the gradient checkpointing helper is stood in for, by what it
does without checkpointing (call the block), which spares importing DeepSpeed. These models are the judge of the
LTX-2.3 and LTX-2.5 layers' release names and forwards, which no file of the shared fixtures holds."""

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


def _load_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def diffsynth_module(name: str) -> types.ModuleType:
    """diffsynth.models.<name> (ltx2_dit, ltx2_text_encoder, ...), loaded from the installed package's file."""
    spec = importlib.util.find_spec("diffsynth")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("DiffSynth-Studio is not installed (scripts/setup_venv.sh installs it)")
    if f"{PACKAGE}.models" not in sys.modules:
        models = Path(list(spec.submodule_search_locations)[0]) / "models"

        def without_checkpointing(model, use_checkpointing, offload, *args, **kwargs):
            return model(*args, **kwargs)

        _stand_in(PACKAGE)
        _stand_in(f"{PACKAGE}.core", gradient_checkpoint_forward=without_checkpointing)
        _stand_in(f"{PACKAGE}.core.attention")
        _load_file(f"{PACKAGE}.core.attention.attention", models.parent / "core" / "attention" / "attention.py")
        _stand_in(f"{PACKAGE}.models").__path__ = [str(models)]
    return importlib.import_module(f"{PACKAGE}.models.{name}")
