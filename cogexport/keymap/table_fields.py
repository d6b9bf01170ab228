"""What a key-map table (``key_maps/<family>/<name>.toml``) may say, and a LoRA layout with it: the fields, declared
once (cogexport/schema.py reads the files with them; the docs' field tables are made from them). table.py turns a
file into a KeyMapTable and checks what types cannot say (placeholders, overlapping rules); cogexport/lora/tables.py
makes the LoRA tables.
"""

# No `from __future__ import annotations`: the schema takes these types as objects, with nothing to evaluate.

from dataclasses import dataclass, fields
from typing import Any

from ..schema import declared

_FROM = "the source key pattern (one)"
_OPTIONAL = "apply only when the target model has the target; otherwise drop the source key for this reason"


@dataclass(frozen=True, kw_only=True)
class ToldApart:
    """``told_apart`` of ``[table]``: what beside the tensors says a checkpoint is in this layout, for layouts whose
    names and shapes are alike and whose values are not (a fused qkv in two row orders). When several such layouts
    fit, the one whose evidence the input shows is taken (a config first); none: the input is refused, and told what
    to add."""

    config_class: str | None = declared(
        "a config.json beside the weights (or above a training checkpoint's folder) names this class "
        "(`_class_name`, or one of `architectures`)", None)
    single_file: bool = declared("the checkpoint is one safetensors file (and no config names another layout's "
                                 "class)", False)


@dataclass(frozen=True, kw_only=True)
class TableHeader:
    """``[table]``: which keys the table applies to, and what it is. A field left out is the included table's."""

    name: str | None = declared("the table's name, `<family>/<file stem>` (default: the file's)", None)
    description: str | None = declared("what the table does", None)
    source: str | None = declared("the layout in words (what `inspect` calls it)", None)
    target: str | None = declared("the Diffusers class it translates into", None)
    select_keys: tuple[str, ...] | None = declared(
        "globs of the keys it reads, by their full names; the other keys are another model's, ignored", None)
    select_prefix: str | None = declared(
        "only keys under this prefix are translated; the others (a SAT engine's T5 and VAE) are ignored, never "
        "renamed; a file with no key under it is taken as already unprefixed", None)
    strip_prefixes: tuple[str, ...] | None = declared(
        "wrapper prefixes removed, in order, when every key has them (`module.`, `_orig_mod.`, ...)", None)
    signature: tuple[str, ...] | None = declared("globs that recognise the layout: some key matches one of them", None)
    requires: tuple[str, ...] | None = declared(
        "globs that must each match some key (what tells look-alike layouts apart)", None)
    excludes: tuple[str, ...] | None = declared("globs no key may match (a look-alike layout's own keys)", None)
    include: str | None = declared(
        "another table whose rules and placeholders become this table's own (checked with them for overlaps)", None)
    fallback: str | None = declared("a table that names the keys no rule here matches (e.g. plain Diffusers names)",
                                    None)
    judge: str | None = declared(
        "Diffusers' own converter for this layout (in diffusers.loaders.single_file_utils), which `verify` asks", None)
    judge_args: dict | None = declared(
        "keyword arguments the judge takes beside the checkpoint (`qkv_layout = \"interleaved\"`); `config = "
        "\"target\"` gives it the target model's config", None)
    judge_when: dict | None = declared(
        "source keys and the shapes (`\"*\"` for any size, `false` for absent) the judge's hard-coded constants "
        "assume: it is asked only then", None)
    no_judge: str | None = declared(
        "when there is no judge: why, and what checks the table instead (a table saying so inherits no judge)", None)
    told_apart: ToldApart | None = declared(
        "what beside the tensors says the input is this layout, when another layout has the same names and shapes",
        None)


@dataclass(frozen=True, kw_only=True)
class RenameRule:
    """``[[rename]]``: one source key to one target key."""

    source: str | tuple[str, ...] = declared(_FROM, key="from")
    to: str | tuple[str, ...] = declared("the target key pattern (one)")
    optional: str | None = declared(_OPTIONAL, None)


@dataclass(frozen=True, kw_only=True)
class ChunkRule:
    """``[[chunk]]``: one source split into equal chunks along `dim`, one per target, in order."""

    source: str | tuple[str, ...] = declared(_FROM, key="from")
    to: str | tuple[str, ...] = declared("the target key patterns, one per chunk")
    dim: int = declared("the dimension split", 0)
    optional: str | None = declared(_OPTIONAL, None)


@dataclass(frozen=True, kw_only=True)
class RegroupTarget:
    """An entry of a regroup rule's `to`."""

    key: str = declared("the target key pattern")
    chunks: tuple[int, ...] = declared("the source chunks it is made of, concatenated in this order")


@dataclass(frozen=True, kw_only=True)
class RegroupRule:
    """``[[regroup]]``: the source split into `chunks` equal chunks, each target made of some of them (every chunk
    used exactly once): SAT's 12-chunk adaLN into norm1 and norm2, a half swap."""

    source: str | tuple[str, ...] = declared(_FROM, key="from")
    chunks: int = declared("how many equal chunks the source is split into")
    to: tuple[RegroupTarget, ...] = declared("the targets: `{ key = ..., chunks = [...] }` tables")
    dim: int = declared("the dimension split", 0)
    groups: str | None = declared(
        "the target config value that counts the groups the arrangement repeats in: every tensor is that many equal "
        "consecutive parts along `dim`, the chunks laid out within each part and each target made of its chunks of "
        "every group in turn (a fused qkv interleaved per head: `[h0: q k v, h1: q k v, ...]`)", None)
    optional: str | None = declared(_OPTIONAL, None)


@dataclass(frozen=True, kw_only=True)
class ReindexRule:
    """``[[reindex]]``: a placeholder's value v becomes count - 1 - v, the count read from the target config (SAT
    builds the decoder's up list in reverse)."""

    source: str | tuple[str, ...] = declared(_FROM, key="from")
    to: str | tuple[str, ...] = declared("the target key pattern (one)")
    reverse: dict[str, str] = declared("placeholder -> the target config value that counts it", {})
    optional: str | None = declared(_OPTIONAL, None)


@dataclass(frozen=True, kw_only=True)
class ReshapeRule:
    """``[[reshape]]``: the same values in another shape."""

    source: str | tuple[str, ...] = declared(_FROM, key="from")
    to: str | tuple[str, ...] = declared("the target key pattern (one)")
    from_shape: tuple[int, ...] | None = declared(
        "the source's shape (required): sizes, -1 for the one the element count decides", None)
    to_shape: tuple[int, ...] | None = declared("the target's shape (required), likewise", None)


@dataclass(frozen=True, kw_only=True)
class DropRule:
    """``[[drop]]``: source keys the target has no place for; the export prints the reason."""

    source: str | tuple[str, ...] | None = declared("the key pattern dropped (this or `glob`)", None, key="from")
    glob: str | None = declared("a glob of the keys dropped (this or `from`)", None)
    reason: str = declared("why (required): the export prints it", "")
    keep: str | None = declared("the file beside the model folder the dropped tensors are kept in (one of "
                                "cogexport/kept_beside.py's, which readers of model folders know)", None)


# The rule kinds, in the order a table's rules are made.
RULES: dict[str, type] = {"rename": RenameRule, "chunk": ChunkRule, "regroup": RegroupRule, "reindex": ReindexRule,
                          "reshape": ReshapeRule, "drop": DropRule}


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """``[lora]`` of a LoRA table file: the key grammar its files are in and the key map that names their modules,
    and what the format says about strength. A field left out takes the format's default (`LoraFormat.layout`,
    cogexport/lora/formats.py), else the default its description gives."""

    format: str | None = declared("the key grammar: a name of `FORMATS` (cogexport/lora/formats.py)", None)
    modules: str | None = declared(
        "the key map naming the modules: `<module>.weight` is matched against its rules (a table with rules of its "
        "own has none)", None)
    writes: bool | None = declared(
        "`--lora-format <format>` writes this family's adapters with this table (one per family and format); "
        "default false", None)
    default_alpha: float | str | None = declared(
        "alpha when nothing records it: a number, or `\"rank\"` (scale 1); default `\"rank\"`", None)
    default_alpha_reason: str | None = declared("where that default comes from, for the report", None)
    alpha_recorded: bool | None = declared(
        "true: the default is what the format means (no warning); false: a guess, warned; default false", None)
    network_module: str | None = declared(
        "kohya metadata written into the file (`ss_network_module`): the network module that loads it; required "
        "by a writing table of a format with `kohya_metadata`", None)
    write_lora_ab: bool | None = declared(
        "write `lora_A` / `lora_B` where the format's own names are `lora_down` / `lora_up` (a loader of the family "
        "reads only those); default false", None)
    reads_settings: dict[str, tuple[str, ...]] | None = declared(
        "the values of the family's recorded settings (`[lora] recorded_settings`) this layout is the reading of, by "
        "setting: a list of `\"unset\"` (not recorded), `\"true\"` and `\"false\"`; a setting it does not name: "
        "`[\"unset\", \"false\"]`", None)


@dataclass(frozen=True, kw_only=True)
class LoraLayout(LoraSettings):
    """``[[lora.layout]]`` of family.toml: one layout the family's adapters come in, in the order layouts are tried.
    It names its format and the key map naming its modules, and only what differs from the format's defaults; or,
    with `file`, a LoRA table file of its own (a table with rules, SAT's). A format's defaults are a layout too."""

    name: str | None = declared("the table's name in the family, `<family>/<name>` (default: the format's)", None)
    description: str | None = declared(
        "what the table is (default: the format's, `{family}` standing for the family's name)", None)
    source: str | None = declared("the layout in words, for `inspect` and the report (default: the format's)", None)
    file: str | None = declared(
        "a LoRA table file of the family's (`<file>.toml`, with `[table]` and `[lora]`), whose fields are all this "
        "layout says: nothing else may be given beside it", None)


def given(layout: LoraSettings) -> dict[str, Any]:
    """The fields a layout (or a [lora] section) gives, by name."""
    return {spec.name: getattr(layout, spec.name) for spec in fields(layout) if getattr(layout, spec.name) is not None}


@dataclass(frozen=True, kw_only=True)
class TableFile:
    """A key-map table: ``key_maps/<family>/<name>.toml``."""

    table: TableHeader = declared("the table's header", TableHeader())
    placeholders: dict[str, Any] = declared(
        "each placeholder's kind: `\"int\"`, `\"name\"`, `\"path\"`, a list of literal alternatives, or "
        "`{ map = { source = \"target\", ... } }`", {})
    lora: LoraSettings | None = declared("a LoRA table's settings (see `[[lora.layout]]`)", None)
    rename: tuple[RenameRule, ...] = declared("rename rules", ())
    chunk: tuple[ChunkRule, ...] = declared("chunk rules", ())
    regroup: tuple[RegroupRule, ...] = declared("regroup rules", ())
    reindex: tuple[ReindexRule, ...] = declared("reindex rules", ())
    reshape: tuple[ReshapeRule, ...] = declared("reshape rules", ())
    drop: tuple[DropRule, ...] = declared("drop rules", ())
