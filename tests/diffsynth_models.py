"""DiffSynth-Studio's own model files (diffsynth/models/*.py: its ports of the LTX-2, MiniMax-H3 and Wan-Animate-2
repositories' module trees, the releases' names) loaded without the rest of the package, whose import needs
torchvision, torchaudio and more. Their attention function is DiffSynth's own file (it needs only torch and einops; on
CPU it runs torch's scaled-dot-product attention), so the models run; only the gradient checkpointing helper is stood
in for, by what it does without checkpointing (call the block), which spares importing DeepSpeed. These models are the
judges of release names and forwards that no file of the shared fixtures holds."""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from pathlib import Path

import pytest

PACKAGE = "cogexport_tests_diffsynth"


def _package(name: str, path: list[str], **attributes) -> types.ModuleType:
    """A package whose __init__ is not run (DiffSynth's imports everything), its submodules found under ``path``."""
    module = types.ModuleType(name)
    module.__path__ = path
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def _without_checkpointing(model, use_checkpointing, offload, *args, **kwargs):
    return model(*args, **kwargs)


def diffsynth_module(name: str) -> types.ModuleType:
    """diffsynth.models.<name> (ltx2_dit, minimax_h3_dit, wan_animate_2_dit, ...), loaded from the installed
    package's file. The model files import the helpers both ways DiffSynth's code does (``..core`` and
    ``..core.gradient``; ``..core.attention`` and its ``attention`` module), so each is there."""
    spec = importlib.util.find_spec("diffsynth")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("DiffSynth-Studio is not installed (scripts/setup_venv.sh installs it)")
    if f"{PACKAGE}.models" not in sys.modules:
        root = Path(list(spec.submodule_search_locations)[0])
        _package(PACKAGE, [])
        _package(f"{PACKAGE}.core", [str(root / "core")], gradient_checkpoint_forward=_without_checkpointing)
        _package(f"{PACKAGE}.core.gradient", [], gradient_checkpoint_forward=_without_checkpointing)
        attention = _package(f"{PACKAGE}.core.attention", [str(root / "core" / "attention")])
        attention.attention_forward = importlib.import_module(f"{PACKAGE}.core.attention.attention").attention_forward
        _package(f"{PACKAGE}.models", [str(root / "models")])
    with _torchaudio_stand_in():
        return importlib.import_module(f"{PACKAGE}.models.{name}")


class _NoTorchaudio(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):  # what tools ask of any module (__file__, __path__): it has none
            raise AttributeError(name)
        raise ImportError(f"torchaudio is not installed: DiffSynth's torchaudio.{name} cannot run here")


@contextlib.contextmanager
def _torchaudio_stand_in():
    """ltx2_audio_vae.py imports torchaudio at its top for its AudioProcessor (the mel front end of training), which
    no test runs; its vocoders need only torch. Where torchaudio is not installed, a stand-in that refuses every use
    is there while the file is imported, and is gone after (nothing else sees it)."""
    if "torchaudio" in sys.modules or importlib.util.find_spec("torchaudio") is not None:
        yield
        return
    sys.modules["torchaudio"] = _NoTorchaudio("torchaudio")
    try:
        yield
    finally:
        del sys.modules["torchaudio"]
