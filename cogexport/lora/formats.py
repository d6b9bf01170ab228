"""How each trainer names an adapter's tensors: the key grammar of a LoRA file, the same for every model family.

A key is ``<prefix><module><suffix>``: the suffix says which part of the module's adapter it is (down and up
matrices, alpha, bias and full-weight deltas, DoRA magnitudes, a wrapped layer's base weights); the module is named
in whatever naming the file uses (Diffusers or the original repo's, with dots written as underscores in kohya
files). Which naming, and how it maps to Diffusers modules, is family data (key_maps/<family>/*_lora.toml).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

# The parts of one module's adapter, named as the canonical (Diffusers/PEFT) tensors are.
DOWN, UP = "lora_A.weight", "lora_B.weight"  # [r, in], [out, r]
BIAS = "lora_B.bias"  # added to the layer's bias times the module's scale (PEFT's lora_bias)
MAGNITUDE = "lora_magnitude_vector"  # DoRA's per-row magnitude
ALPHA = "alpha"  # the module's lora_alpha, a 0-dim tensor
DIFF, DIFF_B = "diff", "diff_b"  # full weight / bias deltas, added as they are (ComfyUI)
BASE_WEIGHT, BASE_BIAS = "base_layer.weight", "base_layer.bias"  # a PEFT-wrapped layer's own weights
PARTS = (DOWN, UP, BIAS, MAGNITUDE, ALPHA, DIFF, DIFF_B, BASE_WEIGHT, BASE_BIAS)
# What each part is, for messages naming what a format cannot hold.
PART_NAMES = {BIAS: "LoRA bias deltas (lora_B.bias)", MAGNITUDE: "DoRA magnitudes", DIFF: "full-weight deltas (.diff)",
              DIFF_B: "bias deltas (.diff_b)"}


@dataclass(frozen=True)
class LoraFormat:
    name: str  # as --lora-format and reports name it
    title: str  # as people call it
    parts: Mapping[str, str]  # key suffix -> part
    strip: tuple[str, ...] = ()  # prefixes removed, in order, when every key has them
    prefix: str = ""  # a prefix every key must have
    write_prefix: str = ""  # the prefix written keys get
    encoded: bool = False  # kohya: a module path's dots are written as underscores
    base_weights: bool = False  # a wrapped model: base_layer weights and plain (unwrapped) keys beside the adapters
    file: str = ""  # the file a written adapter goes in
    alpha_optional: bool = False  # its loaders apply a module without .alpha at scale 1, so alpha = r is left out
    write_parts: Mapping[str, str] = field(default_factory=dict)  # part -> suffix, for the parts the format holds
    strength_where: str = ""  # where a written file keeps each module's strength, for the model card
    runners: str = ""  # what else loads a written file, for the model card's usage lines
    loads_as_peft_folder: bool = False  # its loader takes the folder (PEFT), not the file (Diffusers' loader)

    def usage_lines(self, pipeline: str, base_model: str | None, files: Mapping[str, str]) -> list[str]:
        """How a written adapter is loaded at its trained strength. ``files`` maps each expert's pipeline component
        (transformer, transformer_2; one entry for an ordinary model) to the adapter file as the user loads it."""
        lines = ["import torch", f"from diffusers import {pipeline}", ""]
        lines.append(f"pipe = {pipeline}.from_pretrained(\"{base_model or 'path/to/base'}\", "
                     "torch_dtype=torch.bfloat16)")
        if self.loads_as_peft_folder:
            lines[1:1] = ["from peft import PeftModel"]
            for component, path in files.items():
                folder = path.rsplit("/", 1)[0]
                lines.append(f"pipe.{component} = PeftModel.from_pretrained(pipe.{component}, \"{folder}\")"
                             ".merge_and_unload()")
        else:  # Diffusers reads its own files, and for Wan kohya / musubi and ComfyUI files too
            for component, path in files.items():
                into = ", load_into_transformer_2=True" if component == "transformer_2" else ""
                lines.append(f"pipe.load_lora_weights(\"{path}\"{into})")
        if self.runners:
            lines.append(f"# or in {self.runners}: {', '.join(files.values())} at strength 1.0")
        return lines

    def split(self, keys: Iterable[str]) -> tuple[dict[str, tuple[str, str | None]], list[str]] | None:
        """Each key as (module, part) (part None for a plain key of a wrapped model), and the keys that fit no
        suffix; None when the keys do not carry this format's prefix or none is an adapter key."""
        keys = list(keys)
        names = {key: key for key in keys}
        for strip in self.strip:
            if names and all(name.startswith(strip) for name in names.values()):
                names = {key: name[len(strip):] for key, name in names.items()}
        if self.prefix:
            if not all(name.startswith(self.prefix) for name in names.values()):
                return None
            names = {key: name[len(self.prefix):] for key, name in names.items()}
        parsed: dict[str, tuple[str, str | None]] = {}
        unknown: list[str] = []
        by_length = sorted(self.parts.items(), key=lambda item: len(item[0]), reverse=True)
        for key, name in names.items():
            found = next(((name[: -len(suffix)], part) for suffix, part in by_length
                          if name.endswith(suffix) and len(name) > len(suffix)), None)
            if found is not None:
                parsed[key] = found
            elif self.base_weights:
                parsed[key] = (name, None)
            else:
                unknown.append(key)
        if not any(part in (DOWN, UP, DIFF, DIFF_B) for _, part in parsed.values()):
            return None
        wrapped = any(part is None or part in (BASE_WEIGHT, BASE_BIAS) for _, part in parsed.values())
        if self.base_weights and not wrapped:
            return None  # a wrapped model without its model: an adapter file (DiffSynth-Studio's), not this
        return parsed, unknown

    def key(self, module: str, part: str) -> str:
        """The key this format writes for a module's part (the module already in the format's naming)."""
        name = module.replace(".", "_") if self.encoded else module
        return f"{self.write_prefix}{name}{self.write_parts[part]}"


_LORA_AB = {".lora_A.weight": DOWN, ".lora_B.weight": UP, ".lora_B.bias": BIAS, ".lora_magnitude_vector": MAGNITUDE}
LORA_AB_NAMES = {DOWN: ".lora_A.weight", UP: ".lora_B.weight"}  # PEFT's names for the two matrices
_WRAPPED = {".lora_A.default.weight": DOWN, ".lora_B.default.weight": UP, ".lora_B.default.bias": BIAS,
            ".lora_magnitude_vector.default.weight": MAGNITUDE}

FORMATS = {f.name: f for f in (
    LoraFormat("diffusers", "Diffusers", _LORA_AB, strip=("transformer.",), write_prefix="transformer.",
               file="pytorch_lora_weights.safetensors",
               write_parts={DOWN: ".lora_A.weight", UP: ".lora_B.weight", BIAS: ".lora_B.bias"},
               strength_where="lora_alpha, r and per-module patterns are in the file's lora_adapter_metadata"),
    LoraFormat("peft", "PEFT", _LORA_AB, prefix="base_model.model.", write_prefix="base_model.model.",
               file="adapter_model.safetensors",
               write_parts={DOWN: ".lora_A.weight", UP: ".lora_B.weight", BIAS: ".lora_B.bias",
                            MAGNITUDE: ".lora_magnitude_vector"},
               strength_where="lora_alpha, r and per-module patterns are in adapter_config.json",
               loads_as_peft_folder=True),
    # A model wrapped by PEFT, as a training checkpoint holds it (DeepSpeed, DDP, DCP): the adapters of PEFT's default
    # adapter beside the wrapped layers' base weights and every other weight of the model.
    LoraFormat("peft-checkpoint", "PEFT-wrapped model", {**_WRAPPED, ".base_layer.weight": BASE_WEIGHT,
                                                         ".base_layer.bias": BASE_BIAS},
               strip=("module.", "_orig_mod.", "base_model.model."), base_weights=True),
    # DiffSynth-Studio saves the adapter part of its PEFT-wrapped DiT, with the pipeline's "pipe.dit." removed.
    LoraFormat("diffsynth", "DiffSynth-Studio", {".lora_A.default.weight": DOWN, ".lora_B.default.weight": UP}),
    LoraFormat("musubi", "kohya / musubi-tuner", {".lora_down.weight": DOWN, ".lora_up.weight": UP, ".alpha": ALPHA},
               prefix="lora_unet_", write_prefix="lora_unet_", encoded=True, file="lora.safetensors",
               write_parts={DOWN: ".lora_down.weight", UP: ".lora_up.weight", ALPHA: ".alpha"},
               strength_where="each module's alpha is in its .alpha tensor (the loader applies alpha / r)",
               runners="ComfyUI (LoraLoaderModelOnly), musubi-tuner (--lora_weight)"),
    LoraFormat("comfyui", "ComfyUI / original names",
               {".lora_down.weight": DOWN, ".lora_up.weight": UP, ".lora_A.weight": DOWN, ".lora_B.weight": UP,
                ".alpha": ALPHA, ".diff": DIFF, ".diff_b": DIFF_B},
               strip=("model.", "diffusion_model."), write_prefix="diffusion_model.", file="lora.safetensors",
               alpha_optional=True,
               write_parts={DOWN: ".lora_down.weight", UP: ".lora_up.weight", ALPHA: ".alpha", DIFF: ".diff",
                            DIFF_B: ".diff_b"},
               strength_where="each module's alpha is in its .alpha tensor (the loader applies alpha / r)",
               runners="ComfyUI (LoraLoaderModelOnly)"),
    # A key map (SAT's LoraMixin) already gives Diffusers names: base weights and lora_A / lora_B.
    LoraFormat("sat", "SAT LoraMixin", {".lora_A.weight": DOWN, ".lora_B.weight": UP}, base_weights=True),
)}
WRITABLE = ("diffusers", "peft", "comfyui", "musubi")


def writable_formats() -> tuple[str, ...]:
    """The formats --lora-format writes, in --help order."""
    return WRITABLE


def writable_format(name: str) -> LoraFormat:
    from ..errors import CogExportError

    if name not in WRITABLE:
        raise CogExportError(f"--lora-format {name!r} is not one of {', '.join(WRITABLE)}")
    return FORMATS[name]
