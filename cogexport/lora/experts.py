"""Which expert of a model with several (Wan 2.2 A14B: its high-noise and low-noise transformers) an adapter was
trained for, from what the trainers record. Nothing in an adapter's tensors says it; trainers record it in:

- file names: ai-toolkit saves an A14B run as ``NAME_high_noise.safetensors`` and ``NAME_low_noise.safetensors``
  side by side (its split_multistage_loras); people name single files ``..._HighNoise_...`` / ``..._low_noise...``;
- folder names: a run laid out like the release, ``high_noise_model/`` and ``low_noise_model/``;
- musubi-tuner's metadata: ``ss_sd_model_name`` is the file its ``--dit`` was (the expert it trained), and
  ``ss_dit_high_noise_name`` is there when ``--dit_high_noise`` trained one adapter across both experts.

The experts' names come from the family's data: a variant's ``experts`` (pipeline component -> the release's
subfolder, ``high_noise_model``); a file or folder names an expert when it contains that subfolder's name, or the
name without its ``_model``, in any case and with or without separators. Pure functions: no file is opened.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Mapping

TRAINED_ON = "ss_sd_model_name"  # musubi-tuner: the --dit file (the expert it trained)
SECOND_EXPERT = "ss_dit_high_noise_name"  # musubi-tuner: --dit_high_noise, one adapter trained across both


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def expert_tags(experts: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Each expert's component and the names (separators dropped) that tell it: its subfolder's name, and that name
    without a trailing ``_model``."""
    return {component: tuple(dict.fromkeys(_plain(name) for name in (folder, re.sub(r"[_-]?model$", "", folder))))
            for component, folder in experts.items()}


def _named(text: str, experts: Mapping[str, str]) -> set[str]:
    plain = _plain(text)
    return {component for component, tags in expert_tags(experts).items() if any(tag in plain for tag in tags)}


def expert_of(path: Path, metadata: Mapping[str, str] | None, experts: Mapping[str, str]) -> str | None:
    """The component (``transformer``, ``transformer_2``) the adapter in ``path`` was trained for; None when nothing
    tells, when the adapter was trained across every expert (``trained_on_every_expert``), or when the file's name,
    folders and metadata disagree (an ambiguous input is never resolved silently)."""
    if not experts or trained_on_every_expert(metadata, experts):
        return None
    found: set[str] = set()
    for evidence in _evidence(Path(path), metadata):
        named = _named(evidence, experts)
        if len(named) > 1:
            return None
        found |= named
    return found.pop() if len(found) == 1 else None


def _evidence(path: Path, metadata: Mapping[str, str] | None) -> list[str]:
    """What may name the expert: musubi-tuner's record of the model it trained, the file's name, its two folders."""
    recorded = (metadata or {}).get(TRAINED_ON)
    return [*([recorded] if recorded else []), path.stem, *(folder.name for folder in list(path.parents)[:2])]


def trained_on_every_expert(metadata: Mapping[str, str] | None, experts: Mapping[str, str]) -> bool:
    """Whether the adapter was trained across all the experts at once (musubi-tuner's --dit_high_noise): one adapter
    that goes into every expert."""
    return len(experts) > 1 and bool((metadata or {}).get(SECOND_EXPERT))


def expert_pairs(files: Iterable[Path], experts: Mapping[str, str]) -> dict[str, dict[str, Path]]:
    """Side-by-side adapters, one per expert, told apart by their names alone (ai-toolkit's ``NAME_high_noise`` /
    ``NAME_low_noise``): the run's name (the file name without the expert's name) -> component -> file. Only complete
    sets; a folder of step checkpoints gives one entry per step."""
    tags = expert_tags(experts)
    groups: dict[str, dict[str, Path]] = {}
    for file in files:
        named = _named(file.stem, experts)
        if len(named) != 1:
            continue
        component = named.pop()
        rest = _plain(file.stem)
        for tag in sorted(tags[component], key=len, reverse=True):
            rest = rest.replace(tag, "", 1) if tag in rest else rest
        if component in groups.setdefault(rest, {}):
            groups[rest][component] = None  # two files of one expert under one name: no pair
        else:
            groups[rest][component] = file
    return {name: found for name, found in groups.items()
            if set(found) == set(experts) and all(path is not None for path in found.values())}
