"""How people load an adapter, by the program that loads it: the lines a model card shows.

Each loader is a function of the pipeline class, the base model and the adapter's files (pipeline component ->
the file's path as the user will load it; one entry for an ordinary model, ``transformer`` and ``transformer_2``
for a model with two experts). A format names the loaders that read it (formats.py); a new loader is one function
here and its name in LOADERS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

Files = Mapping[str, str]


def _diffusers(files: Files) -> list[str]:
    # Diffusers' load_lora_weights reads its own files and, for Wan, kohya / musubi-tuner and ComfyUI files too
    return [f"pipe.load_lora_weights(\"{path}\"" + (", load_into_transformer_2=True" if component == "transformer_2"
                                                     else "") + ")" for component, path in files.items()]


def _peft(files: Files) -> list[str]:
    return [f"pipe.{component} = PeftModel.from_pretrained(pipe.{component}, \"{Path(path).parent}\")"
            ".merge_and_unload()" for component, path in files.items()]


def _lycoris(files: Files) -> list[str]:
    # LyCORIS applies the adapter live: lycoris-lora's merge_to (4.1.3) applies the strength twice
    return [line for component, path in files.items() for line in (
        f"network, _ = create_lycoris_from_weights(1.0, \"{path}\", pipe.{component})",
        "network.apply_to()")]


def _runners(names: str) -> Callable[[Files], list[str]]:
    def lines(files: Files) -> list[str]:
        return [f"# or in {names}: {', '.join(files.values())} at strength 1.0"]

    return lines


# name -> (imports it needs, the lines that load the adapter into ``pipe``); runner comments come last
LOADERS: dict[str, tuple[tuple[str, ...], Callable[[Files], list[str]]]] = {
    "diffusers": ((), _diffusers),
    "peft": (("from peft import PeftModel",), _peft),
    "lycoris": (("from lycoris import create_lycoris_from_weights",), _lycoris),
    "comfyui": ((), _runners("ComfyUI (LoraLoaderModelOnly)")),
    "comfyui+musubi": ((), _runners("ComfyUI (LoraLoaderModelOnly), musubi-tuner (--lora_weight)")),
}


def usage_lines(loaders: tuple[str, ...], pipeline: str, base_model: str | None, files: Files) -> list[str]:
    """The lines that load the adapter, at its trained strength, with each of these loaders."""
    imports = [line for name in loaders for line in LOADERS[name][0]]
    lines = ["import torch", f"from diffusers import {pipeline}", *imports, "",
             f"pipe = {pipeline}.from_pretrained(\"{base_model or 'path/to/base'}\", dtype=torch.bfloat16)"]
    return lines + [line for name in loaders for line in LOADERS[name][1](files)]
