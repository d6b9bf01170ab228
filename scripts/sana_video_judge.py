"""Diffusers' SanaVideo conversion script (huggingface/diffusers scripts/convert_sana_video_to_diffusers.py, not part of
the installed package) run from its own source at toy size: the judge of cogexport's key map for NVlabs' release.

The script's ``main(args)`` reads the release with torch.load, converts with 20 layers and the 2B model's widths
hard-coded, loads SanaVideoTransformer3DModel strictly and saves it. Here its source is executed with only those
constants replaced by a tiny config's, so a tiny release is converted by the script's own renames and splits.

    python scripts/sana_video_judge.py SCRIPT RELEASE.pth CONFIG.json OUT
"""

from __future__ import annotations

import argparse
import ast
import json
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

# the 2B release's constants in the script's main(), each replaced once by the tiny config's value
_KWARGS = ("num_attention_heads", "attention_head_dim", "num_layers", "num_cross_attention_heads",
           "cross_attention_head_dim", "cross_attention_dim", "caption_channels", "in_channels", "out_channels")


def _main_source(script: str) -> str:
    tree = ast.parse(script)
    (main,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"]
    return ast.get_source_segment(script, main)


def _replace_once(source: str, old: str, new: str) -> str:
    if source.count(old) != 1:
        raise RuntimeError(f"the script no longer reads {old!r} once; re-check the judge")
    return source.replace(old, new)


def tiny_main(script: str, config: dict[str, Any], weight_dtype: torch.dtype = torch.float32,
              empty_init: bool = False):
    """The script's main() with the release's sizes replaced by ``config``'s; ``weight_dtype`` the one its --dtype
    names, ``empty_init`` builds the model in accelerate's init_empty_weights, as the script's own CTX does."""
    source = _replace_once(_main_source(script), "layer_num = 20", f"layer_num = {config['num_layers']}")
    source = _replace_once(source, "transformer = SanaVideoTransformer3DModel(**transformer_kwargs)",
                           "transformer = SanaVideoTransformer3DModel(**{**transformer_kwargs, **TINY})")
    from accelerate import init_empty_weights
    from diffusers import SanaVideoTransformer3DModel

    namespace = {"torch": torch, "os": __import__("os"), "SanaVideoTransformer3DModel": SanaVideoTransformer3DModel,
                 "CTX": init_empty_weights if empty_init else nullcontext,
                 "colored": lambda text, *args, **kwargs: text, "ckpt_ids": [], "weight_dtype": weight_dtype,
                 "TINY": {key: config[key] for key in _KWARGS}}
    exec(compile(source, "convert_sana_video_to_diffusers.py", "exec"), namespace)
    return namespace["main"]


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def convert(script: Path, release: Path, config: dict[str, Any], out: Path, dtype: str = "fp32",
            empty_init: bool = False) -> Path:
    """The script's conversion of ``release`` (transformer only, in ``dtype``) into ``out``/transformer."""
    args = SimpleNamespace(orig_ckpt_path=str(release), video_size=480, model_type="SanaVideo",
                           scheduler_type="flow-euler", vae_type="wan", vae_path=None, task="t2v", dump_path=str(out),
                           save_full_pipeline=False, dtype=dtype)
    tiny_main(script.read_text(), config, DTYPES[dtype], empty_init)(args)
    return out / "transformer"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", type=Path)
    parser.add_argument("release", type=Path)
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(convert(args.script, args.release, json.loads(args.config.read_text()), args.out))


if __name__ == "__main__":
    main()
