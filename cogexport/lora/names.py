"""The modules a family's transformer has, for checking an adapter's module names without knowing the model's size,
and for reading kohya's underscore names, which are ambiguous on their own (``blocks_0_self_attn_q`` could be
``blocks.0.self_attn.q`` or ``blocks.0.self.attn.q``): they are looked up among the family's real module names,
written the kohya way.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Iterable

import torch

from ..errors import CogExportError
from ..keymap.plan import translate_shapes
from ..models.family import ModelFamily, family_named
from ..models.target import build_target
from .tables import LoraTable, lora_tables

_INDEX = re.compile(r"(?:^|[._])(\d+)(?=$|[._])")
_LAYER_COUNT = re.compile(r"num_(\w+_)?layers")


def blocks_needed(names: Iterable[str]) -> int:
    """One more than the largest block index (a module path's first index) in these names, dotted or kohya-style."""
    firsts = (_INDEX.search(name) for name in names)
    return max((int(found.group(1)) + 1 for found in firsts if found), default=1)


def names_schema(family: ModelFamily, blocks: int) -> dict[str, torch.Size]:
    """Every tensor of a transformer of the family with at least ``blocks`` blocks, in the shapes of the published
    variant with every kind of layer (the family's [lora] names_from)."""
    return _names_schema(family.key, blocks)


@cache
def _names_schema(key: str, blocks: int) -> dict[str, torch.Size]:
    family = family_named(key)
    if not family.lora_names_from:
        raise CogExportError(f"{family.name} has no names_from variant in its family.toml [lora]")
    schema: dict[str, torch.Size] = {}
    for name in family.lora_names_from:  # several variants: the union of their names (the first's shape for each)
        config = family.transformer_config(family.variant_named(name))
        # every stack of blocks (num_layers; HunyuanVideo's num_single_layers and num_refiner_layers too) as deep as
        # the adapter needs: the names, not the release's depth
        config = {key: max(blocks, 1) if _LAYER_COUNT.fullmatch(key) else value for key, value in config.items()}
        schema = {**build_target(family.transformer.class_name, config).schema, **schema}
    return schema


def names_counts(family: ModelFamily) -> dict[str, int]:
    """The sizes of the family's published model (its first [lora] names_from variant), which rules may count by."""
    if not family.lora_names_from:
        return {}
    config = family.transformer_config(family.variant_named(family.lora_names_from[0]))
    return dict(build_target(family.transformer.class_name, config).counts)


@cache
def _kohya_names(table_name: str, blocks: int) -> dict[str, str]:
    """kohya name -> module name in the table's naming, for every module with a weight."""
    table = next(t for t in lora_tables() if t.name == table_name)
    schema = names_schema(table.family, blocks)
    own = translate_shapes(table.modules.inverted(), schema)
    modules = sorted({name[: -len(".weight")] for name in own if name.endswith(".weight")})
    found: dict[str, str] = {}
    for module in modules:
        encoded = module.replace(".", "_")
        if encoded in found:
            raise CogExportError(f"{table.name}: {found[encoded]} and {module} have the same kohya name {encoded}")
        found[encoded] = module
    return found


def decode_kohya(table: LoraTable, encoded: Iterable[str]) -> dict[str, str | None]:
    """Each kohya module name as the module it names (None when the family has no such module)."""
    encoded = list(encoded)
    known = _kohya_names(table.name, blocks_needed(encoded))
    return {name: known.get(name) for name in encoded}
