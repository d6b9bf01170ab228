"""Which model a checkpoint holds, read from its names and shapes: the layout (SAT or Diffusers names), the
CogVideoX variant, and whether it is a LoRA run. Used by ``export`` to choose a key map and by ``inspect``."""

from __future__ import annotations

from typing import Mapping, Sequence

from ..errors import CogExportError
from ..keymap.plan import translate_shapes
from ..keymap.table import KeyMapTable, load_table
from ..lazy import LazyTensor
from .cogvideox import published_variant, read_transformer_shape

TRANSFORMER_TABLES = ("sat_transformer", "diffusers_transformer")
VAE_TABLES = ("sat_vae", "diffusers_vae")
LORA_TABLES = ("sat_lora", "peft_lora", "diffusers_lora")
# Name fragments only LoRA checkpoints have (SAT's LoRA mixin, PEFT, kohya-style files).
LORA_MARKERS = (".original.", ".matrix_A.", ".matrix_B.", ".lora_A.", ".lora_B.", ".base_layer.", ".lora_down.",
                ".lora_up.")


def lora_key(keys: Sequence[str]) -> str | None:
    """A key that marks the checkpoint as a LoRA run, if any."""
    return next((key for key in keys if any(marker in key for marker in LORA_MARKERS)), None)


def fitting_tables(keys: Sequence[str], candidates: Sequence[str]) -> list[KeyMapTable]:
    tables = [load_table(name) for name in candidates]
    return [table for table in tables if table.recognises(table.select(keys)[0])]


def choose_table(source: Mapping[str, LazyTensor], candidates: Sequence[str], what: str, where: str) -> KeyMapTable:
    """The one table whose signature the checkpoint's names carry."""
    fitting = fitting_tables(list(source), candidates)
    if len(fitting) == 1:
        return fitting[0]
    if not fitting:
        sample = ", ".join(list(source)[:3]) or "no tensors at all"
        raise CogExportError(f"{where} holds no {what} weights cogexport recognises (tried {', '.join(candidates)}); "
                             f"its first keys are {sample}")
    raise CogExportError(f"{where} matches several layouts ({', '.join(t.name for t in fitting)}); its keys are mixed")


def recognise(source: Mapping[str, LazyTensor], metadata: Mapping[str, str] | None = None,
              folders: Sequence = ()) -> dict:
    """A description of the models in a checkpoint, for ``inspect`` (never raises for unknown content)."""
    from ..lora import read_adapter

    keys = list(source)
    found: dict = {}
    marker = lora_key(keys)
    if marker is not None:
        try:
            adapter = read_adapter(source, "the checkpoint", folders=folders, metadata=metadata)
        except CogExportError as error:
            found["lora"] = {"marker": marker, "problem": str(error)}
        else:
            found["lora"] = {"layout": adapter.table.name, "description": adapter.table.source, "rank": adapter.rank,
                             "ranks": sorted(set(adapter.ranks.values())),
                             "alpha": adapter.alpha if adapter.alpha_recorded else None,
                             "assumed_alpha": None if adapter.alpha_recorded else adapter.alpha,
                             "alpha_source": adapter.alpha_source, "per_module_alphas": bool(adapter.alpha_pattern),
                             "use_rslora": adapter.use_rslora, "target_modules": adapter.target_modules,
                             "modules": len(adapter.ranks), "layers": adapter.layers,
                             "base_weights": adapter.has_base_weights}
        return found
    for component, candidates in (("transformer", TRANSFORMER_TABLES), ("vae", VAE_TABLES)):
        for table in fitting_tables(keys, candidates):
            selected, ignored = table.select(keys)
            entry = {"layout": table.name, "description": table.source, "keys": len(selected), "other_keys": len(ignored)}
            if component == "transformer":
                try:
                    shape = read_transformer_shape(translate_shapes(table, {k: source[k].shape for k in keys}))
                except CogExportError as error:
                    entry["problem"] = str(error)
                else:
                    variant = published_variant(shape)
                    entry.update(model=variant.name if variant else f"CogVideoX {shape.version} (unpublished size)",
                                 model_type="i2v" if shape.image_to_video else "t2v", layers=shape.num_layers,
                                 hidden_size=shape.hidden, in_channels=shape.in_channels)
            found[component] = entry
    return found
