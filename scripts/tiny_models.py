"""What the tiny-model builders of every family share: seeded noise in every tensor, and the offline T5 tokenizer and
2-layer text encoders (T5 for CogVideoX, LTX-Video and Mochi; umT5, the same shapes, for Wan).

Each family's own script (cogvideox_tiny_configs.py, make_tiny_*.py, wan_tiny_configs.py, hunyuanvideo_tiny.py) keeps
its configs and pipeline; the fixtures that run those scripts list this file in their cache key too.
"""

from __future__ import annotations

import torch

TINY_TEXT_LENGTH = 8  # the tokenizer's cap: every tiny transformer's text length

# The words the tiny tokenizer knows whole; anything else is spelled out in CHARACTERS (or becomes <unk>).
TOKENIZER_WORDS = (
    "a an the of on in at under over across along and with "
    "panda cat dog car boat astronaut drone city forest road sea sky lake moon mountains waves fireworks "
    "playing guitar walking sailing driving sleeping exploding crashing flying red blue calm snowy sunny "
    "stormy small big night sunset bamboo coastal"
).split()
CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'-"


def randomize_(module: torch.nn.Module, seed: int, scale: float = 0.1, shift: float = 0.0) -> torch.nn.Module:
    """Overwrite every persistent floating tensor with seeded noise, N(shift, scale).

    Diffusers initialises norms to ones and gates and outputs to zeros, so two norms (or two zero tensors) would be
    equal and a swapped or misplaced mapping would go unnoticed; noise makes every tensor distinguishable by value.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in module.state_dict(keep_vars=True).values():
            if tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * scale + shift)
    return module


def build_tokenizer():
    """A T5 tokenizer (Unigram; T5's special ids pad 0, eos 1, unk 2), capped at TINY_TEXT_LENGTH.

    The vocabulary is written out rather than trained: whole words score higher than the letters that spell
    them, so known words are one token each and a short prompt fits the tiny 8-token cap.
    """
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [(f"\u2581{word}", -4.0) for word in sorted(set(TOKENIZER_WORDS))]
    pieces += [("\u2581", -8.0)] + [(character, -10.0) for character in CHARACTERS]
    # extra_ids=0: T5's 100 sentinel tokens are for span corruption, which nothing here uses.
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=TINY_TEXT_LENGTH)


def build_text_encoder(vocab_size: int, width: int, umt5: bool = False):
    """A 2-layer T5 v1.1-style encoder (gated GELU, relative positions) whose width is the transformer's text dim;
    ``umt5``: Wan's umT5 encoder class with the same shapes."""
    import transformers

    config_class, model_class = ("UMT5Config", "UMT5EncoderModel") if umt5 else ("T5Config", "T5EncoderModel")
    config = getattr(transformers, config_class)(
        vocab_size=vocab_size, d_model=width, d_kv=8, d_ff=36, num_layers=2, num_heads=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
        dropout_rate=0.0, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
    )
    return getattr(transformers, model_class)(config).eval()
