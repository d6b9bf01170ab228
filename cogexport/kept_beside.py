"""The files cogexport keeps beside a Diffusers model folder's weights: the tensors its class has no place for (a key
map's drop rules with ``keep``, so that the way back writes them again), in a file of their own. They are part of the
folder as cogexport writes it, never stray weights: a reader of model folders (checkpoint/model_folder.py) knows them
by name without loading a table, and a key map may keep tensors only in one of these (keymap/table.py checks)."""

KEPT_BESIDE_MODELS = frozenset({
    "per_channel_statistics.safetensors",  # LTX-2's VAEs' latent statistics
    "rotary_frequencies.safetensors",  # a release's stored rotary frequencies its Diffusers class computes
    # an original layout's buffers and serialised state (training counters, constant tables, Transformer Engine's
    # extra state): no weights, but part of the release file --to original gives back
    "original_buffers.safetensors",
})
