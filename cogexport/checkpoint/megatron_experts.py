"""A Megatron-Core mixture-of-experts layer's experts, stacked on an axis of their own, handed out one by one.

megatron-core saves a layer's experts (``SequentialMLP`` and ``TEGroupedMLP`` alike: moe/experts.py
``sharded_state_dict``) under one key per expert tensor, ``...mlp.experts.experts.linear_fc1.weight``, with the
global expert index as an axis prepended after the layer axis: [L, E, ...] for the stacked layers (each rank's
local experts at their global places, so expert parallelism is undone by the save itself). With
``singleton_local_shards`` it saves each expert alone as ``...mlp.experts.experts.<expert>.linear_fc1.weight``
instead; those names are what the stacked form is handed out under here, expert by expert, so both forms read alike:
``decoder.layers.3.mlp.experts.experts.5.linear_fc1.weight``. Each expert is read from its layer's row, sliced (the
layer's row is read once per expert: fine for the expert counts of video models, not a streaming read).
"""

from __future__ import annotations

from ..lazy import LazyTensor

EXPERTS = "experts"


def experts_at(name: str) -> int | None:
    """Where an expert number goes in a per-layer name of experts stacked on their axis: after the ``experts.experts``
    pair when no number follows it; None otherwise."""
    parts = name.split(".")
    for index in range(len(parts) - 2):
        if parts[index] == parts[index + 1] == EXPERTS and not parts[index + 2].isdigit():
            return index + 2
    return None


def per_expert(name: str, at: int, layer: LazyTensor) -> list[tuple[str, LazyTensor]]:
    """One layer's stacked expert tensor [E, ...] as E tensors under the per-expert names."""
    parts = name.split(".")
    return [(".".join([*parts[:at], str(expert), *parts[at:]]),
             LazyTensor(layer.shape[1:], layer.dtype, lambda expert=expert: layer.load()[expert].clone(),
                        f"expert {expert} of {layer.origin}"))
            for expert in range(layer.shape[0])]
