"""Adapters cogexport does not read, told by name: a file of LyCORIS's other algorithms (or a LoRA / LoKr / LoHa
variant cogexport does not compute) is refused as what it is, not as "no layout cogexport knows"."""

from __future__ import annotations

from typing import Sequence

# key ending -> what a file with it is (LyCORIS: lycoris/modules/*.py; the names its save gives each part)
_UNREAD = (
    (".dora_scale", "a LyCORIS adapter with weight decomposition (DoRA: dora_scale)"),
    (".lokr_t2", "a LoKr adapter (LyCORIS) of convolutions (Tucker core lokr_t2)"),
    (".hada_t1", "a LoHa adapter (LyCORIS) of convolutions (Tucker cores hada_t1 / hada_t2)"),
    (".oft_blocks", "an OFT adapter (LyCORIS)"),
    (".oft_diag", "an OFT adapter (LyCORIS)"),
    (".oft_R", "an OFT adapter"),
    (".boft_R", "a BOFT adapter"),
    (".a1.weight", "a GLoRA adapter (LyCORIS)"),
    (".lora_mid.weight", "a LoCon adapter of convolutions (LyCORIS, Tucker lora_mid)"),
    (".on_input", "an (IA)^3 adapter (LyCORIS)"),
)


def unread_adapter(keys: Sequence[str]) -> str | None:
    """What the keys are when they are an adapter cogexport does not read, with what to do; None otherwise."""
    for ending, what in _UNREAD:
        if any(key.endswith(ending) for key in keys):
            return (f"{what}: not read (cogexport reads LoRA, DoRA (PEFT), LoKr and LoHa adapters of linear layers); "
                    "merge it into the model with the trainer or ComfyUI and export the full model")
    return None
