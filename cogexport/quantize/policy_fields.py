"""What ``key_maps/<family>/quantized.toml`` may say: its fields, declared once (cogexport/schema.py reads the file
with them and the docs' field tables are made from them). policy.py turns them into a family's QuantizationPolicy."""

# No `from __future__ import annotations`: the schema takes these types as objects, with nothing to evaluate.

from dataclasses import dataclass

from ..schema import declared


@dataclass(frozen=True, kw_only=True)
class GgufRoles:
    """The rules of ComfyUI-GGUF's llama-quantize patch (img_tensor_get_type) that raise a tensor's type in the
    ``_M`` / ``_S`` mixes (and in Q4_0 / Q5_0 for ffn_down): substrings of the name, checked in this order, the first
    that matches counting."""

    attn_v: tuple[str, ...] = declared("attention value weights", ())
    attn_qkv: tuple[str, ...] = declared("fused query / key / value weights", ())
    ffn_down: tuple[str, ...] = declared("feed-forward down projections", ())


@dataclass(frozen=True, kw_only=True)
class GgufSection:
    """GGUF as ComfyUI-GGUF's tools/convert.py makes it and its loader reads it, on the original layout's names. Each
    list of names holds substrings of a name, or with a leading `^` its start (a top-level module whose name the
    blocks' modules also end in: `^proj_out.` is the final projection, not a block's `proj_out`)."""

    architecture: str = declared("general.architecture, as convert.py writes it and ComfyUI-GGUF's loader accepts it")
    signature: tuple[str, ...] = declared("globs convert.py recognises the architecture by (`*` stands for a block "
                                          "index): every one must match a tensor")
    keep_f32: tuple[str, ...] = declared("convert.py's keys_hiprec: substrings of the names kept in F32 (besides 1-D "
                                         "tensors and tensors of at most 1,024 values)", ())
    keep_float: tuple[str, ...] = declared("the patch's never-quantized substrings: kept in the file's float type", ())
    roles: GgufRoles = declared("the tensors the `_M` / `_S` mixes raise a step", GgufRoles())
    release_metadata: tuple[str, ...] = declared(
        "keys of the original release's header metadata (the family's `original_metadata`) the file also holds, as "
        "string keys: ComfyUI-GGUF hands a file's string keys to ComfyUI, whose model detection reads some (a "
        "release's `config`)", ())
    loaders: tuple[str, ...] = declared(
        "what loads the family's GGUF files, as its model card says: `ComfyUI-GGUF` (its loader lists the "
        "architecture), `Diffusers` (its single-file table has the family's class); `[]`: neither does, the file is "
        "for tools that read GGUF generically (the architecture is then cogexport's own name), and the export says so",
        ("ComfyUI-GGUF", "Diffusers"))
    drop: tuple[str, ...] = declared("convert.py's keys_ignore: substrings of the names left out of the file (training "
                                     "state and serialised extras no loader reads)", ())


@dataclass(frozen=True, kw_only=True)
class Fp8Section:
    """ComfyUI's quantized safetensors (Comfy-Org's *_fp8_scaled releases, and the same layers in nvfp4, mxfp8 and
    int8): the weights stored quantized; everything else stays in high precision."""

    quantize: tuple[str, ...] = declared("globs on the full names of the weights stored quantized, in every `--to "
                                         "comfyui` format (only tensors of two or more dimensions)", ())
    refused: str = declared("why the family gets no ComfyUI quantized file (no ComfyUI model of it whose names are "
                            "established), said when `--to comfyui` is refused; empty: `quantize` names the layers", "")


@dataclass(frozen=True, kw_only=True)
class PolicyFile:
    """``key_maps/<family>/quantized.toml``: a family's facts for GGUF and ComfyUI's quantized files (``--to gguf``,
    ``--to comfyui``). A family without it has no quantized outputs."""

    layout: str = declared(
        "the family's key-map table (its name in the family's folder) the quantized files hold the transformer in, "
        "where the files people load are not in its way back's layout (a single file's tensor order, not the "
        "release's shards'); empty: the way back's", "")
    same_as: str = declared("another family's folder whose quantized.toml this one shares (its weights are that "
                            "family's): its tables, each field given here replacing theirs", "")
    gguf: GgufSection = declared("the GGUF facts")
    fp8: Fp8Section = declared("the facts of ComfyUI's quantized files (fp8 and the others)", Fp8Section())
