"""What the tiny-model builders of every family share: seeded noise in every tensor; the offline tokenizers (T5
Unigram, CLIP and byte-level Qwen2 BPE, each over a written-out vocabulary) and small text encoders (T5 / umT5, CLIP);
and the command line of a make_tiny_<family>.py script.

Each family's own script (cogvideox_tiny_configs.py, make_tiny_*.py, wan_tiny_configs.py, hunyuanvideo_tiny.py, ...)
keeps its configs and pipeline; the fixtures that run those scripts list this file in their cache key too.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable

import click
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
# The words the tiny CLIP (and HunyuanVideo's Llama) BPE tokenizers merge whole.
BPE_WORDS = ("a an the of on in at under with and cat dog panda astronaut car boat city forest sea sky moon "
             "playing guitar walking sailing flying red blue small big night sunset").split()
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML, as Qwen2.5-VL's template writes the system and user turns and the assistant's opening
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


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


def random_state_dict(shapes: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Seeded noise, N(0.1, 0.2), of each of ``shapes``, in their order: an original layout's tensors for a model
    whose class is not installable."""
    generator = torch.Generator().manual_seed(seed)
    return {name: (torch.randn(shape, generator=generator) * 0.2 + 0.1).to(dtype) for name, shape in shapes.items()}


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


def spelling_merges(vocabulary: dict[str, int], spellings: list[list[str]]) -> list[tuple[str, str]]:
    """BPE merges that join each spelling's pieces, left to right, into one token; every piece and every merged piece
    is added to ``vocabulary``."""
    merges = []
    for pieces in spellings:
        for piece in pieces:
            vocabulary.setdefault(piece, len(vocabulary))
        while len(pieces) > 1:
            merges.append((pieces[0], pieces[1]))
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            vocabulary.setdefault(pieces[0], len(vocabulary))
    return list(dict.fromkeys(merges))


def build_clip_tokenizer():
    """CLIP's BPE tokenizer: its two specials, the lower-case letters (each also word-final), BPE_WORDS whole."""
    from transformers import CLIPTokenizer

    vocabulary = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for letter in CHARACTERS.lower():
        vocabulary.setdefault(letter, len(vocabulary))
        vocabulary.setdefault(letter + "</w>", len(vocabulary))
    merges = spelling_merges(vocabulary, [[*word[:-1], word[-1] + "</w>"] for word in BPE_WORDS])
    return CLIPTokenizer(vocab=vocabulary, merges=merges)


def build_clip_text_encoder(vocab_size: int, width: int):
    """A 2-layer CLIPTextModel whose width (and projection) is ``width``: a pooled text embedding."""
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(vocab_size=vocab_size, hidden_size=width, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=77, projection_dim=width, bos_token_id=0,
                            eos_token_id=1, pad_token_id=1)
    return CLIPTextModel(config).eval()


def _byte_pieces() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    pieces, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            pieces[byte] = chr(byte)
        else:
            pieces[byte] = chr(256 + extra)
            extra += 1
    return pieces


def build_qwen_tokenizer():
    """A byte-level BPE Qwen2 tokenizer: every byte, merges that spell TOKENIZER_WORDS whole (with their leading
    space), the ChatML specials and template."""
    from transformers import Qwen2Tokenizer

    alphabet = _byte_pieces()
    vocabulary = {piece: index for index, piece in enumerate(alphabet.values())}
    space = alphabet[ord(" ")]
    merges = spelling_merges(vocabulary, [[space, *word] for word in sorted(set(TOKENIZER_WORDS))])
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "vocab.json").write_text(json.dumps(vocabulary))
        lines = [f"{left} {right}" for left, right in merges]
        (Path(folder) / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n")
        tokenizer = Qwen2Tokenizer(str(Path(folder) / "vocab.json"), str(Path(folder) / "merges.txt"),
                                   unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIALS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def pipeline_command(build: Callable[..., Any], title: str, *options: Callable) -> click.Command:
    """The command line of a make_tiny_<family>.py script: OUT, the family's ``options`` (click options named as
    ``build``'s parameters) and --seed; it writes ``build(**options, seed=SEED).save_pretrained(OUT)``."""

    def main(out: Path, seed: int, **choices) -> None:
        pipeline = build(**choices, seed=seed)
        pipeline.save_pretrained(out)
        described = ", ".join([*map(str, choices.values()), type(pipeline).__name__])
        click.echo(f"wrote {out} (tiny {title}: {described})")

    main.__doc__ = f"Write a tiny {title} pipeline folder to OUT."
    command = click.option("--seed", type=int, default=0, show_default=True)(main)
    for option in reversed(options):
        command = option(command)
    return click.command()(click.argument("out", type=click.Path(file_okay=False, path_type=Path))(command))
