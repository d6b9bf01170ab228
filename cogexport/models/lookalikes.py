"""Weights two families share exactly: a family may declare (``same_weights_as`` in family.toml) that its weights are
another's, names and shapes alike, the difference being in the config alone (ChronoEdit's are Wan 2.1 I2V's, its
config adds a RoPE setting). Such weights say nothing of which model they are; when nothing else says it either
(--model-name, --base, a config beside them), exporting them as either model would be a guess, silently wrong half the
time, so the export is refused with the choices named.
"""

from __future__ import annotations

from ..errors import CogExportError
from .family import ModelFamily, Variant, families
from .recognize import Recognised


def lookalike_variants(recognised: Recognised) -> list[tuple[ModelFamily, Variant]]:
    """The published variants of the families declaring the recognised family's weights their own, whose shapes
    these are (their shapes modules read the same facts: the weights are the same)."""
    found = []
    for family in families():
        if recognised.family.key in family.same_weights_as:
            variant = family.published_variant(recognised.facts)
            if variant is not None:
                found.append((family, variant))
    return found


def refuse_unsaid_lookalike(recognised: Recognised, where: str) -> None:
    """Refuse weights another family's published model has too, when nothing said which model they are (call it
    only then: no --model-name, no --base, no config beside the weights)."""
    others = lookalike_variants(recognised)
    if not others:
        return
    names = ([recognised.variant.name] if recognised.variant else []) + [variant.name for _, variant in others]
    families_named = " and ".join(dict.fromkeys([recognised.family.name, *(family.name for family, _ in others)]))
    choices = " or ".join(f"--model-name {name}" for name in names)
    raise CogExportError(f"{where} has the tensor names and shapes of both {' and '.join(names)} ({families_named} "
                         f"differ in the config alone), and nothing says which it is; pass {choices} (or --base with "
                         "the Diffusers folder it was trained from, or keep its config.json beside the weights)")
