"""The parts of one module's adapter, named as the canonical tensors are (PEFT's and LyCORIS's names), whatever a
file calls them: the low-rank matrices of a LoRA, the factors of a LyCORIS LoKr (Kronecker product) or LoHa
(Hadamard product), and the deltas and wrapped weights some layouts carry beside them."""

from __future__ import annotations

# LoRA: B A, the strength alpha / r
DOWN, UP = "lora_A.weight", "lora_B.weight"  # [r, in], [out, r]
BIAS = "lora_B.bias"  # added to the layer's bias times the module's scale (PEFT's lora_bias)
MAGNITUDE = "lora_magnitude_vector"  # DoRA's per-row magnitude
ALPHA = "alpha"  # the module's alpha, a 0-dim tensor
DIFF, DIFF_B = "diff", "diff_b"  # full weight / bias deltas, added as they are (ComfyUI)
BASE_WEIGHT, BASE_BIAS = "base_layer.weight", "base_layer.bias"  # a PEFT-wrapped layer's own weights

# LoKr: kron(w1, w2), each factor whole (w1, w2) or itself low-rank (w1_a @ w1_b, w2_a @ w2_b)
LOKR_W1, LOKR_W1_A, LOKR_W1_B = "lokr_w1", "lokr_w1_a", "lokr_w1_b"
LOKR_W2, LOKR_W2_A, LOKR_W2_B = "lokr_w2", "lokr_w2_a", "lokr_w2_b"
LOKR_T2 = "lokr_t2"  # the Tucker core of a convolution's w2
LOKR_PARTS = (LOKR_W1, LOKR_W1_A, LOKR_W1_B, LOKR_W2, LOKR_W2_A, LOKR_W2_B, LOKR_T2)
# LoHa: (w1_a @ w1_b) * (w2_a @ w2_b), elementwise
HADA_W1_A, HADA_W1_B, HADA_W2_A, HADA_W2_B = "hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"
HADA_T1, HADA_T2 = "hada_t1", "hada_t2"  # Tucker cores (convolutions)
LOHA_PARTS = (HADA_W1_A, HADA_W1_B, HADA_W2_A, HADA_W2_B, HADA_T1, HADA_T2)
FACTOR_PARTS = LOKR_PARTS + LOHA_PARTS

PARTS = (DOWN, UP, BIAS, MAGNITUDE, ALPHA, DIFF, DIFF_B, BASE_WEIGHT, BASE_BIAS, *FACTOR_PARTS)
# What each part is, for messages naming what a format cannot hold.
PART_NAMES = {BIAS: "LoRA bias deltas (lora_B.bias)", MAGNITUDE: "DoRA magnitudes", DIFF: "full-weight deltas (.diff)",
              DIFF_B: "bias deltas (.diff_b)"}
# The parts that make an adapter's own change of a weight (a layout needs one of them to be an adapter at all).
WEIGHT_PARTS = (DOWN, UP, DIFF, DIFF_B, *FACTOR_PARTS)

# The kinds of adapter a module can be, by the parts that make it, as people call them.
LORA, LOKR, LOHA = "LoRA", "LoKr", "LoHa"
KIND_PARTS = {LORA: (DOWN, UP), LOKR: LOKR_PARTS, LOHA: LOHA_PARTS}
KIND_TITLES = {LORA: "LoRA", LOKR: "LoKr (LyCORIS)", LOHA: "LoHa (LyCORIS)"}

# Suffixes LyCORIS, ComfyUI, kohya-style trainers and PEFT give the factors (PEFT's saved adapters drop the adapter
# name, a wrapped model keeps it: lokr_w1.default).
LYCORIS_SUFFIXES = {f".{part}": part for part in FACTOR_PARTS}
