"""Which GGML type each tensor of a GGUF file gets: the family's facts (``key_maps/<family>/quantized.toml``) and
the presets (``Q4_K_M``, ``Q8_0``, ...) applied to original-layout names, as a plan made and checked before any
byte is written.

The decisions are those of the chain people use today, ComfyUI-GGUF's ``tools/convert.py`` (F32 for 1-D tensors,
tensors of at most 1,024 values and the family's high-precision names; the source's float type otherwise) followed
by ``llama-quantize`` with ComfyUI-GGUF's patch (only 2-D tensors whose names end in ``weight`` are quantized,
never the family's embedders and heads; the ``_M``/``_S`` mixes raise attention-value, fused-qkv and
feed-forward-down weights a step); the names convert.py ignores (the family's ``drop``) are left out. Where they
differ on purpose:
- a row whose length is not a multiple of the type's block stays in the file's float type (the patch falls back to
  F16 for the K types only; the legacy types would fail there), and the plan says so;
- tensors of more than 4 dimensions (Wan's and HunyuanVideo's Conv3d patch embeddings) are stored as they are, in
  F32, which ComfyUI-GGUF's loader and Diffusers' GGUF loader both read: the chain sets them aside and adds them
  back with ``fix_5d_tensors.py`` the same way, by hand.
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field
from functools import cache
from typing import Mapping

import torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..errors import CogExportError, ExtensionError, quoted
from ..keymap.roots import family_folders, find_key_map_file
from ..lazy import LazyTensor
from ..schema import SchemaError, declared_fields, read
from .formats import GgmlType, ggml_type
from .policy_fields import GgufRoles, PolicyFile

POLICY_FILE = "quantized.toml"
SMALL_TENSOR = 1024  # convert.py's QUANTIZATION_THRESHOLD: tensors of at most this many values stay in F32
MAX_NAME = 127  # GGML_MAX_NAME (128 with ComfyUI-GGUF's patch) less the terminating zero
ROLES = tuple(spec.key for spec in declared_fields(GgufRoles))  # the patch's rule order: attn_v, attn_qkv, ffn_down
GGUF_LOADERS = ("ComfyUI-GGUF", "Diffusers")  # what may load a family's GGUF file ([gguf] loaders)


@dataclass(frozen=True)
class Bump:
    """A mix's raised type for one role; ``first`` limits it to the first N tensors of the role (Q4_K_S)."""

    type: str
    first: int | None = None


@dataclass(frozen=True)
class Preset:
    """A ``--quant`` choice: the type most weights get (None: a float file), the float type it forces, the bumps."""

    name: str
    base: str | None
    float_type: str | None = None
    bumps: Mapping[str, Bump] = field(default_factory=dict)

    @property
    def file_type(self) -> int:
        import gguf  # imported by GGUF jobs only (see formats.ggml_type)

        return int(gguf.LlamaFileType[f"MOSTLY_{self.name}"])


# llama-quantize's ftypes and the rules ComfyUI-GGUF's patch (img_tensor_get_type) gives them.
PRESETS: dict[str, Preset] = {preset.name: preset for preset in (
    Preset("F16", None, "F16"),
    Preset("BF16", None, "BF16"),
    Preset("Q8_0", "Q8_0"),
    Preset("Q6_K", "Q6_K"),
    Preset("Q5_K_M", "Q5_K", bumps={"attn_v": Bump("Q6_K"), "attn_qkv": Bump("Q6_K"), "ffn_down": Bump("Q6_K")}),
    Preset("Q5_K_S", "Q5_K"),
    Preset("Q5_1", "Q5_1"),
    Preset("Q5_0", "Q5_0", bumps={"ffn_down": Bump("Q5_1")}),
    Preset("Q4_K_M", "Q4_K", bumps={"attn_v": Bump("Q6_K"), "attn_qkv": Bump("Q5_K"), "ffn_down": Bump("Q6_K")}),
    Preset("Q4_K_S", "Q4_K", bumps={"attn_v": Bump("Q5_K", first=4), "ffn_down": Bump("Q5_K")}),
    Preset("Q4_1", "Q4_1"),
    Preset("Q4_0", "Q4_0", bumps={"ffn_down": Bump("Q4_1")}),
)}


@dataclass(frozen=True)
class QuantizationPolicy:
    """One family's facts for quantized files (the fields of quantized.toml: policy_fields.py)."""

    family: str
    architecture: str
    signature: tuple[str, ...]
    keep_f32: tuple[str, ...]
    keep_float: tuple[str, ...]
    roles: Mapping[str, tuple[str, ...]]
    fp8_quantize: tuple[str, ...]
    release_metadata: tuple[str, ...] = ()
    gguf_loaders: tuple[str, ...] = GGUF_LOADERS
    gguf_drop: tuple[str, ...] = ()
    layout: str = ""  # the family's table the files are written in, where not the way back's (its full name)
    fp8_refused: str = ""  # why the family has no ComfyUI quantized files (empty: it has)

    def drops(self, name: str) -> bool:
        return names_any(self.gguf_drop, name)

    def role_of(self, name: str) -> str | None:
        return next((role for role in ROLES if names_any(self.roles.get(role, ()), name)), None)

    def fp8_quantizes(self, name: str, shape: tuple[int, ...]) -> bool:
        return len(shape) >= 2 and any(fnmatch.fnmatchcase(name, glob) for glob in self.fp8_quantize)


def names_any(patterns: tuple[str, ...], name: str) -> bool:
    """Whether one of a policy list's patterns names ``name``: a substring of it, or with a leading ``^`` its start
    (a top-level module whose name the blocks' modules end in too)."""
    return any(name.startswith(p[1:]) if p.startswith("^") else p in name for p in patterns)


class PolicyError(ExtensionError):
    """A family's quantized.toml is malformed (a bug in the family's data, not in the user's input)."""

    kind = "key maps"


def parse_policy(data: str | Mapping, family: str) -> QuantizationPolicy:
    """``data``: the family's quantized.toml, as text or as a table (with a ``same_as`` family's facts merged in)."""
    if isinstance(data, str):
        data = tomllib.loads(data)
    try:
        policy = read(PolicyFile, data)
    except SchemaError as error:
        raise PolicyError(f"{family}/{POLICY_FILE}: {error}") from None
    gguf = policy.gguf
    if not gguf.signature:
        raise PolicyError(f"{family}/{POLICY_FILE}: [gguf] signature names no tensor")
    unknown = [loader for loader in gguf.loaders if loader not in GGUF_LOADERS]
    if unknown:  # none at all is a family no loader reads (its file for generic GGUF readers)
        raise PolicyError(f"{family}/{POLICY_FILE}: [gguf] loaders may name {', '.join(GGUF_LOADERS)}, not "
                          f"{quoted(unknown[0])}")
    if policy.fp8.quantize and policy.fp8.refused:
        raise PolicyError(f"{family}/{POLICY_FILE}: [fp8] names layers to quantize and a reason to refuse; one of them")
    roles = {role: getattr(gguf.roles, role) for role in ROLES}
    return QuantizationPolicy(family, gguf.architecture, gguf.signature, gguf.keep_f32, gguf.keep_float, roles,
                              policy.fp8.quantize, gguf.release_metadata, gguf.loaders, gguf.drop,
                              f"{family}/{policy.layout}" if policy.layout else "", policy.fp8.refused)


@cache
def quantization_policy(family: str) -> QuantizationPolicy:
    """The policy of the family whose tables live in ``key_maps/<family>/`` (its ``ModelFamily.key``)."""
    return parse_policy(policy_table(family), family)


def policy_table(family: str, referred_by: tuple[str, ...] = ()) -> dict:
    """``family``'s quantized.toml as a table. A file whose weights are another family's says ``same_as = "<that
    family>"`` and gives only the fields that differ: the other file's tables, each field it gives replacing theirs,
    so that one family's facts are written once and a correction to them reaches every family that shares them."""
    path = find_key_map_file(f"{family}/{POLICY_FILE}")
    if path is None and not referred_by:
        raise CogExportError(f"no quantized outputs are defined for the {family} family (no {family}/{POLICY_FILE})")
    if path is None:
        raise PolicyError(f"{referred_by[-1]}/{POLICY_FILE}: same_as names {quoted(family)}, which has no "
                          f"{POLICY_FILE}")
    own = tomllib.loads(path.read_text(encoding="utf-8"))
    base = own.get("same_as")
    if base is None:
        return own
    if not isinstance(base, str) or base in (family, *referred_by):
        raise PolicyError(f"{family}/{POLICY_FILE}: same_as must name another family's folder, one that does not "
                          f"lead back to {family}")
    return _merged(policy_table(base, (*referred_by, family)), own)


def _merged(base: Mapping, own: Mapping) -> dict:
    """``base`` with ``own``'s values in its place: tables merged key by key, any other value replaced whole."""
    merged = dict(base)
    for key, value in own.items():
        both_tables = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _merged(base[key], value) if both_tables else value
    return merged


def quantizable_families() -> tuple[str, ...]:
    return tuple(sorted(key for key, folder in family_folders() if folder.joinpath(POLICY_FILE).is_file()))


def preset_named(name: str) -> Preset:
    try:
        return PRESETS[name.upper()]
    except KeyError:
        raise CogExportError(f"unknown GGUF quantization {quoted(name)}; one of {', '.join(PRESETS)}") from None


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the file: its name, source, type, its shape and the shape it is stored in, and why."""

    name: str
    source: LazyTensor
    type: GgmlType
    shape: tuple[int, ...]
    stored_shape: tuple[int, ...]
    reason: str

    @property
    def nbytes(self) -> int:
        return self.type.nbytes(self.stored_shape)


@dataclass(frozen=True)
class GgufPlan:
    """Every tensor of a GGUF file, decided and checked; ``notes`` says what did not get the preset's type;
    ``strings``: the string keys the file holds beside its type keys (the policy's ``release_metadata``)."""

    architecture: str
    preset: Preset
    tensors: tuple[PlannedTensor, ...]
    notes: tuple[str, ...]
    strings: Mapping[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for tensor in self.tensors:
            counts[tensor.type.name] = counts.get(tensor.type.name, 0) + 1
        return counts


def plan_gguf(tensors: Mapping[str, LazyTensor], policy: QuantizationPolicy, preset: Preset | str,
              strings: Mapping[str, str] | None = None) -> GgufPlan:
    """The plan for ``tensors`` (ORIGINAL release names, ComfyUI layout) under ``policy`` and ``preset``;
    ``strings``: the file's string keys beside (the release metadata the policy names)."""
    preset = preset_named(preset) if isinstance(preset, str) else preset
    tensors = {name: source for name, source in tensors.items() if not policy.drops(name)}
    _check_names(tensors, policy)
    counts: dict[str, int] = {}
    planned, notes = [], []
    for name, source in tensors.items():
        entry, note = _plan_one(name, source, policy, preset, counts)
        planned.append(entry)
        if note:
            notes.append(note)
    return GgufPlan(policy.architecture, preset, tuple(planned), tuple(notes), dict(strings or {}))


def _check_names(tensors: Mapping[str, LazyTensor], policy: QuantizationPolicy) -> None:
    missing = [glob for glob in policy.signature if not any(fnmatch.fnmatchcase(n, glob) for n in tensors)]
    if missing:
        raise CogExportError(f"these tensors are not in the original {policy.family} layout that ComfyUI-GGUF reads "
                             f"(no {quoted(missing[0])}); convert them to the original names first")
    for name, source in tensors.items():
        if len(name.encode()) > MAX_NAME:
            raise CogExportError(f"tensor name {quoted(name)} is longer than GGUF's {MAX_NAME} bytes")
        if not source.dtype.is_floating_point:
            raise CogExportError(f"tensor {quoted(name)} is {source.dtype}; a GGUF model file holds float tensors")


def _plan_one(name: str, source: LazyTensor, policy: QuantizationPolicy, preset: Preset,
              counts: dict[str, int]) -> tuple[PlannedTensor, str | None]:
    shape = tuple(source.shape)
    float_type = preset.float_type or ("BF16" if source.dtype == torch.bfloat16 else "F16")
    chosen, reason = _high_precision(name, source, policy, float_type)
    note = None
    if chosen is None and preset.base is None:
        chosen, reason = float_type, f"{preset.name} file"
    if chosen is None and _never_quantized(name, shape, policy):
        chosen, reason = float_type, "not quantized (ComfyUI-GGUF's rules for this name)"
    if chosen is None:
        chosen, reason = _mixed_type(name, policy, preset, counts), "quantized"
        if not ggml_type(chosen).fits(shape[-1]):
            note = (f"{name}: rows of {shape[-1]} values do not fill {chosen} blocks of {ggml_type(chosen).block}; "
                    f"kept in {float_type}")
            chosen, reason = float_type, note
    return PlannedTensor(name, source, ggml_type(chosen), shape, shape, reason), note


def _high_precision(name: str, source: LazyTensor, policy: QuantizationPolicy,
                    float_type: str) -> tuple[str | None, str]:
    """convert.py's F32 decisions (only for float32 and bfloat16 sources, as there) and the >4-D tensors."""
    shape = tuple(source.shape)
    if len(shape) > 4:
        return "F32", f"{len(shape)}-D: stored as it is, in F32"
    if source.dtype == torch.float16:
        return None, ""
    if len(shape) <= 1:
        return "F32", "1-D"
    if source.numel <= SMALL_TENSOR:
        return "F32", f"at most {SMALL_TENSOR} values"
    if names_any(policy.keep_f32, name):
        return "F32", "kept in F32 for the family"
    return None, ""


def _never_quantized(name: str, shape: tuple[int, ...], policy: QuantizationPolicy) -> bool:
    return (not name.endswith("weight") or "_norm.weight" in name or len(shape) != 2
            or names_any(policy.keep_float, name))


def _mixed_type(name: str, policy: QuantizationPolicy, preset: Preset, counts: dict[str, int]) -> str:
    role = policy.role_of(name)
    bump = preset.bumps.get(role) if role else None
    if role:
        counts[role] = counts.get(role, 0) + 1
    if bump is None or (bump.first is not None and counts[role] > bump.first):
        return preset.base
    return bump.type
