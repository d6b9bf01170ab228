"""Every table kind is read by one schema layer (cogexport/schema.py): a field is declared once, and an unknown field,
a missing one or a value of the wrong type is refused when the table loads, in one line naming the file and the
dotted place. One test per table kind: family.toml, a key map (its header, a rule, its [lora] section), a LoRA layout
of family.toml, and quantized.toml ([gguf], [gguf.roles], [fp8])."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cogexport.keymap.roots import add_key_map_root, remove_key_map_root
from cogexport.quantize.policy import PolicyError, parse_policy, policy_table, quantization_policy
from cogexport.schema import SchemaError, declared, read

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, kw_only=True)
class Inner:
    """A nested table."""

    globs: tuple[str, ...] = declared("globs", ())


@dataclass(frozen=True, kw_only=True)
class Outer:
    """A toy declaration."""

    name: str = declared("a name")
    alpha: float | str | None = declared("a number or a word", None)
    source: str = declared("a key that is no Python name", "", key="from")
    inner: Inner = declared("a nested table", Inner())
    entries: tuple[Inner, ...] = declared("an array of tables", ())


@pytest.mark.parametrize("data, message", [
    ({"name": "x", "speling": 1}, "unknown field speling"),
    ({"name": "x", "inner": {"glob": []}}, r"unknown field \[inner\] glob"),
    ({"name": "x", "entries": [{}, {"glob": []}]}, r"unknown field \[\[entries\]\] #2 glob"),
    ({}, r"\[name\] is missing"),
    ({"name": 3}, "name must be a string, not an integer 3"),
    ({"name": "x", "alpha": True}, "alpha must be a number or a string, not true"),
    ({"name": "x", "inner": {"globs": ["a", 1]}}, r"\[inner\] globs #2 must be a string, not an integer 1"),
    ({"name": "x", "inner": "globs"}, r"inner must be a table, not a string 'globs'"),
])
def test_the_schema_names_what_is_wrong_and_where(data, message):
    with pytest.raises(SchemaError, match=f"^{message}$"):
        read(Outer, data)


def test_the_schema_reads_a_table_into_its_declaration():
    read_back = read(Outer, {"name": "x", "alpha": 64, "from": "y", "entries": [{"globs": ["a"]}]})
    assert read_back == Outer(name="x", alpha=64, source="y", entries=(Inner(globs=("a",)),))


def assert_refused(parse, text: str, change: tuple[str, str], error: type, message: str) -> None:
    """``text`` parses as it is; with ``change`` made, it is refused with ``message``, whole."""
    parse(text)
    assert change[0] in text
    with pytest.raises(error, match=f"^{message}$"):
        parse(text.replace(*change, 1))


WAN_POLICY = (ROOT / "key_maps" / "wan" / "quantized.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize("change, message", [
    (("[gguf]\n", "[gguf]\nkeep_f16 = []\n"), r"unknown field \[gguf\] keep_f16"),
    (("attn_qkv = []", "attn_qkv = []\nattn_out = []"), r"unknown field \[gguf.roles\] attn_out"),
    (("[fp8]\n", "[fp8]\nscale = 1\n"), r"unknown field \[fp8\] scale"),
    (("[fp8]\n", "[fp9]\n"), r"unknown section \[fp9\]"),
    (('architecture = "wan"', "architecture = 3"), r"\[gguf\] architecture must be a string, not an integer 3"),
    (('architecture = "wan"', 'architecture = "wan"\nloaders = ["ComfyUI"]'),
     r"\[gguf\] loaders may name ComfyUI-GGUF, Diffusers, not 'ComfyUI'"),
    (("[fp8]\n", '[fp8]\nrefused = "no ComfyUI model"\n'),
     r"\[fp8\] names layers to quantize and a reason to refuse; one of them"),
])
def test_quantized_toml_refuses_an_unknown_or_mistyped_field(change, message):
    assert_refused(lambda text: parse_policy(text, "wan"), WAN_POLICY, change, PolicyError,
                   f"wan/quantized.toml: {message}")


def test_a_family_sharing_wans_facts_reads_them_from_wans_file():
    """ChronoEdit's quantized.toml says only ``same_as = "wan"``: every fact is Wan's file's."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11 on)
    assert tomllib.loads((ROOT / "key_maps" / "chronoedit" / "quantized.toml").read_text()) == {"same_as": "wan"}
    wan, chronoedit = quantization_policy("wan"), quantization_policy("chronoedit")
    assert chronoedit.family == "chronoedit" and {**vars(chronoedit), "family": "wan"} == vars(wan)


@pytest.fixture
def policy_root(tmp_path, monkeypatch):
    """A temporary key-map root holding only the quantized.toml files given (folder -> text)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    package = tmp_path / "policyroot"
    package.mkdir()
    (package / "__init__.py").write_text("")

    def add(files: dict[str, str]) -> None:
        for folder, text in files.items():
            (package / folder).mkdir()
            (package / folder / "quantized.toml").write_text(text)
        importlib.invalidate_caches()
        add_key_map_root("policyroot")

    yield add
    remove_key_map_root("policyroot")
    sys.modules.pop("policyroot", None)  # the next test's root is another folder of the same name


def test_same_as_takes_the_other_file_and_replaces_the_fields_given(policy_root):
    policy_root({"toy_base": WAN_POLICY, "toy_variant": 'same_as = "toy_base"\n[gguf]\narchitecture = "toy"\n'
                                                        'keep_f32 = ["x."]\n[gguf.roles]\nattn_v = []\n'})
    variant, base = parse_policy(policy_table("toy_variant"), "toy_variant"), parse_policy(WAN_POLICY, "toy_base")
    assert (variant.architecture, variant.keep_f32, variant.roles["attn_v"]) == ("toy", ("x.",), ())
    assert (variant.keep_float, variant.roles["ffn_down"], variant.fp8_quantize, variant.signature) == \
        (base.keep_float, base.roles["ffn_down"], base.fp8_quantize, base.signature)


@pytest.mark.parametrize("files, message", [
    ({"toy_lone": 'same_as = "toy_missing"\n'}, "toy_lone/quantized.toml: same_as names 'toy_missing', which has no "
                                                  "quantized.toml"),
    ({"toy_one": 'same_as = "toy_two"\n', "toy_two": 'same_as = "toy_one"\n'},
     "toy_two/quantized.toml: same_as must name another family's folder, one that does not lead back to toy_two"),
])
def test_same_as_is_refused_where_it_leads_nowhere_or_back(policy_root, files, message):
    policy_root(files)
    with pytest.raises(PolicyError, match=f"^{message}$"):
        policy_table(next(iter(files)))


def test_every_table_kinds_error_is_said_in_one_line_by_the_command_line():
    """The command line turns an ExtensionError into one line, "cogexport: error: <kind>: ...", exit 2 (the family
    and output-format tests run it end to end); a table kind raising anything else would be a traceback."""
    from cogexport.errors import ExtensionError
    from cogexport.keymap.table import TableError
    from cogexport.lora.formats import FormatError
    from cogexport.models.family import FamilyError

    for error in (PolicyError, TableError, FamilyError, FormatError):
        assert issubclass(error, ExtensionError) and error.kind != ExtensionError.kind, error


KEY_MAP = """
[table]
name = "toy/layout"
signature = ["a.*"]

[placeholders]
i = "int"

[lora]
format = "comfyui"
modules = "wan/original_transformer"

[[rename]]
from = "a.{i}"
to = "b.{i}"

[[drop]]
glob = "c.*"
reason = "not the model's"
"""


@pytest.mark.parametrize("change, message", [
    (('signature = ["a.*"]', 'signature = ["a.*"]\nsignatures = []'), r"unknown field \[table\] signatures"),
    (('to = "b.{i}"', 'to = "b.{i}"\ndim = 0'), r"unknown field \[\[rename\]\] #1 dim"),
    (('reason = "not the model\'s"', 'reason = "not the model\'s"\nwhy = ""'), r"unknown field \[\[drop\]\] #1 why"),
    (('format = "comfyui"', 'format = "comfyui"\nalpha = 1'), r"unknown field \[lora\] alpha"),
    (("[[rename]]", "[[renames]]"), r"unknown section \[renames\]"),
    (('signature = ["a.*"]', 'signature = "a.*"'),
     r"\[table\] signature must be a list of strings, not a string 'a.\*'"),
])
def test_a_key_map_refuses_an_unknown_or_mistyped_field(change, message):
    from cogexport.keymap.table import TableError, parse_table

    assert_refused(lambda text: parse_table(text, "toy/layout"), KEY_MAP, change, TableError,
                   f"key map toy/layout: {message}")


MOCHI = (ROOT / "key_maps" / "mochi" / "family.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize("change, message", [
    (('[family]\n', '[family]\nnickname = "m"\n'), r"unknown field \[family\] nickname"),
    (('[vae]\n', '[vae]\nkeep_fp16 = []\n'), r"unknown field \[vae\] keep_fp16"),
    (('hub_id = "genmo/mochi-1-preview"', 'hub_id = "genmo/mochi-1-preview"\nhub = ""'),
     r"unknown field \[\[variant\]\] #1 hub"),
    (('hub_id = "genmo/mochi-1-preview"', 'hub_id = "genmo/mochi-1-preview"\nunet = {}'),
     r"unknown field \[\[variant\]\] #1 unet"),
    (('[tasks.t2v]\n', '[tasks.t2v]\ntag = ""\n'), r"unknown field \[tasks.t2v\] tag"),
    (('[pipeline]\n', '[pipeline]\nschedule = ""\n'), r"unknown field \[pipeline\] schedule"),
    (('writer = "safetensors"', 'writer = "safetensors", kind = 1'), r"unknown field \[transformer.original\] kind"),
    (('tags = ["mochi", "video-generation"]', 'tags = "mochi"'),
     r"\[family\] tags must be a list of strings, not a string 'mochi'"),
    (('name = "Mochi"', 'name = 1'), r"\[family\] name must be a string, not an integer 1"),
])
def test_family_toml_refuses_an_unknown_or_mistyped_field(change, message):
    from cogexport.models.family import FamilyError, parse_family

    assert_refused(lambda text: parse_family(text, "mochi"), MOCHI, change, FamilyError, f"family mochi: {message}")


WAN = (ROOT / "key_maps" / "wan" / "family.toml").read_text(encoding="utf-8")
MUSUBI = 'format = "musubi"\nmodules = "original_transformer"\n'


@pytest.mark.parametrize("change, message", [
    ((MUSUBI, MUSUBI + "networks = 1\n"), r"unknown field \[\[lora.layout\]\] #7 networks"),
    ((MUSUBI, MUSUBI + 'default_alpha = true\n'),
     r"\[\[lora.layout\]\] #7 default_alpha must be a number or a string, not true"),
    ((MUSUBI, 'modules = "original_transformer"\n'), r"\[\[lora.layout\]\] #7 needs format and modules \(or a file of "
                                                     r"its own\)"),
    ((MUSUBI, MUSUBI + 'file = "musubi_lora"\n'),
     r"\[\[lora.layout\]\] #7: a layout with a file of its own gives nothing else"),
])
def test_a_lora_layout_of_family_toml_refuses_an_unknown_or_mistyped_field(change, message):
    from cogexport.models.family import FamilyError, parse_family

    assert_refused(lambda text: parse_family(text, "wan"), WAN, change, FamilyError, f"family wan: {message}")
