"""Build a tiny but complete HunyuanVideo pipeline folder, fully offline (tests, README, benchmarks).

    python scripts/make_tiny_hunyuanvideo.py OUT --shape-class t2v --seed 0
    python scripts/make_tiny_hunyuanvideo.py OUT --shape-class i2v-33ch

OUT is what ``DiffusionPipeline.save_pretrained`` writes. ``t2v``: ``HunyuanVideoPipeline`` with ``text_encoder``
(a 3-layer LlamaModel), ``tokenizer`` (a Llama BPE tokenizer), ``text_encoder_2`` (a 2-layer CLIPTextModel),
``tokenizer_2`` (a CLIP BPE tokenizer), ``transformer``, ``vae`` and the scheduler (FlowMatchEulerDiscreteScheduler,
shift 7.0). ``i2v-33ch`` / ``i2v-16ch``: ``HunyuanVideoImageToVideoPipeline``, whose text encoder is a tiny
LlavaForConditionalGeneration (a CLIP vision tower in front of the Llama) with a CLIPImageProcessor. Nothing is
downloaded: the tokenizers' vocabularies are written out (whole words and the letters that spell anything else);
every model is randomly initialised from ``--seed``. The transformers are hunyuanvideo_tiny's (same seeded weights),
so fixtures and pipeline folders of one shape class and seed fit together.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never fall back to the Hub

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hunyuanvideo_tiny import (MODEL_TYPE, SHAPE_CLASSES, TINY_POOLED_DIM, TINY_TEXT_DIM,  # noqa: E402
                               build_tiny_transformer)
from tiny_models import (BPE_WORDS, CHARACTERS, build_clip_text_encoder, build_clip_tokenizer,  # noqa: E402
                         pipeline_command, randomize_, spelling_merges)

LLAMA_SPECIALS = ("<unk>", "<s>", "</s>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<image>")
TINY_VAE = {"block_out_channels": (8, 8, 16, 16), "norm_num_groups": 4, "layers_per_block": 1}
# the tiny prompt template render calls pass: the release's template is hundreds of tokens at these vocabularies
TINY_PROMPT_TEMPLATE = {"template": "{}", "crop_start": 0}


def build_llama_tokenizer():
    """A Llama-3-style byte-level-free BPE tokenizer: specials, letters, and merges for a few whole words."""
    from transformers import LlamaTokenizerFast

    vocabulary = {token: index for index, token in enumerate(LLAMA_SPECIALS)}
    vocabulary.update({piece: len(vocabulary) + i for i, piece in enumerate(["\u2581", *CHARACTERS])})
    merges = spelling_merges(vocabulary, [["\u2581" + word[0], *word[1:]] for word in BPE_WORDS])
    return LlamaTokenizerFast(vocab=vocabulary, merges=merges, pad_token="</s>", add_bos_token=True,
                              additional_special_tokens=list(LLAMA_SPECIALS[3:]))


def llama_config(vocab_size: int):
    from transformers import LlamaConfig

    # three layers: the pipeline reads the hidden states two layers before the last
    return LlamaConfig(vocab_size=vocab_size, hidden_size=TINY_TEXT_DIM, intermediate_size=64, num_hidden_layers=3,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=2,
                       bos_token_id=1, eos_token_id=2)


def build_text_encoder(vocab_size: int):
    from transformers import LlamaModel

    return LlamaModel(llama_config(vocab_size)).eval()


def build_llava_text_encoder(vocab_size: int, image_token_index: int):
    """A tiny Llava: a CLIP vision tower (32x32 images, 16 patches) feeding the tiny Llama."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=16)
    config = LlavaConfig(vision_config=vision, text_config=llama_config(vocab_size),
                         image_token_index=image_token_index, vision_feature_layer=-2, pad_token_id=2)
    return LlavaForConditionalGeneration(config).eval()


def build_image_processor():
    from transformers import CLIPImageProcessor

    return CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def build_vae(seed: int):
    from diffusers import AutoencoderKLHunyuanVideo

    # small random weights: decoded frames stay finite through the tiny, untrained decoder
    return randomize_(AutoencoderKLHunyuanVideo(**TINY_VAE), seed + 1, scale=0.05).eval()


def build_tiny_pipeline(shape_class: str = "t2v", seed: int = 0):
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoImageToVideoPipeline, HunyuanVideoPipeline

    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = build_llama_tokenizer(), build_clip_tokenizer()
    components = dict(tokenizer=tokenizer, text_encoder_2=build_clip_text_encoder(len(tokenizer_2), TINY_POOLED_DIM),
                      tokenizer_2=tokenizer_2, transformer=build_tiny_transformer(shape_class, seed),
                      vae=build_vae(seed), scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    if MODEL_TYPE[shape_class] == "t2v":
        return HunyuanVideoPipeline(text_encoder=build_text_encoder(len(tokenizer)), **components)
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    return HunyuanVideoImageToVideoPipeline(text_encoder=build_llava_text_encoder(len(tokenizer), image_token),
                                            image_processor=build_image_processor(), **components)


main = pipeline_command(build_tiny_pipeline, "HunyuanVideo", click.option(
    "--shape-class", type=click.Choice(sorted(SHAPE_CLASSES)), default="t2v", show_default=True))


if __name__ == "__main__":
    main()
