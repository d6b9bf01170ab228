"""The documentation stays true to the code: the command-line reference is what scripts/cli_reference.py makes of the
click definitions now, it names every command and option, every relative link of README.md and docs/ reaches a
file (and heading) that exists, the example outputs marked in README.md and docs/ are what the commands print now
(scripts/doc_examples.py), and the README stays a front page (at most ~350 lines; the record lives in docs/)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 350
# Pages other branches are writing; the index links them by these names already. Remove a name once its page is in.
PAGES_ON_OTHER_BRANCHES: set[str] = set()


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_what_the_click_definitions_make_now():
    reference = _cli_reference()
    committed = reference.REFERENCE.read_text(encoding="utf-8") if reference.REFERENCE.is_file() else ""
    assert committed == reference.render(), (
        f"docs/reference/cli.md is stale (a command, option or help text changed, or a family or LoRA format was "
        f"added): regenerate it with `{reference.REGENERATE}` and commit the result")


def test_the_cli_reference_names_every_command_and_option():
    from cogexport.cli import main

    text = _cli_reference().render()
    root = click.Context(main, info_name="cogexport", **main.context_settings)
    for name in main.list_commands(root):
        command = main.get_command(root, name)
        assert f"## `cogexport {name}`" in text, name
        section = text.split(f"## `cogexport {name}`")[1].split("\n## ")[0]
        ctx = click.Context(command, info_name=name, parent=root, **command.context_settings)
        for param in command.get_params(ctx):
            for option in getattr(param, "opts", ()) if isinstance(param, click.Option) else ():
                assert f"`{option}`" in section, f"{name} {option}"
            if isinstance(param, click.Option) and param.help:
                assert param.help.split()[0] in section, f"{name} {param.name}: help text missing"
            if isinstance(param.type, click.Choice):
                assert all(f"`{choice}`" in section for choice in param.type.choices), f"{name} {param.name}"


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _outside_code(text: str) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return lines


def _anchors(path: Path) -> set[str]:
    """The heading anchors GitHub makes: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    anchors = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = re.match(r"#{1,6} (.+)", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(page):
    broken = []
    for line in _outside_code(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            relative = linked.relative_to(ROOT).as_posix() if linked.is_relative_to(ROOT) else str(linked)
            if relative in PAGES_ON_OTHER_BRANCHES:
                continue
            if not linked.exists():
                broken.append(f"{target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{target}: no heading #{anchor} in {relative}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_stays_a_front_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail "
                                       "into a page of docs/ and link it")


def test_the_two_commands_the_readme_gives_exist():
    text = README.read_text(encoding="utf-8")
    for script in ("scripts/demo.sh", "scripts/test.sh"):
        assert f"./{script}" in text
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_table_reference_is_what_the_declarations_make_now():
    reference = _script("table_reference")
    committed = reference.REFERENCE.read_text(encoding="utf-8") if reference.REFERENCE.is_file() else ""
    assert committed == reference.render(), (
        f"docs/reference/tables.md is stale (a field of family.toml, a key map, a LoRA layout, quantized.toml or "
        f"LoraFormat changed): regenerate it with `{reference.REGENERATE}` and commit the result")


def _inline_code(page: Path) -> list[str]:
    """The inline code spans of a Markdown page, outside fenced blocks."""
    text = "\n".join(line for line in _fenced_out(page.read_text(encoding="utf-8")))
    return re.findall(r"`([^`\n]+)`", text)


def _fenced_out(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _declared_keys(declaration) -> set[str]:
    from cogexport.schema import declared_fields

    return {spec.key for spec in declared_fields(declaration) if not spec.rest}


FAMILY_FIELDS = "FamilyFile FamilySection ComponentSection OriginalLayout LoraSection PipelineSection TaskSection " \
                "ReleaseSection VariantEntry"


@pytest.mark.parametrize("page, declarations", [
    ("adding-a-lora-format.md", {"cogexport.lora.formats": "LoraFormat",
                                 "cogexport.keymap.table_fields": "LoraLayout"}),
    ("adding-a-family.md", {"cogexport.models.family_fields": FAMILY_FIELDS,
                            "cogexport.quantize.policy_fields": "GgufSection GgufRoles Fp8Section"}),
    ("key-maps.md", {"cogexport.keymap.table_fields": "TableHeader"}),
])
def test_a_guide_names_every_field_it_describes(page, declarations):
    text = (DOCS / page).read_text(encoding="utf-8")
    missing = []
    for module, names in declarations.items():
        for name in names.split():
            for key in sorted(_declared_keys(getattr(importlib.import_module(module), name))):
                if not re.search(rf"(?<!\w){re.escape(key)}(?!\w)", text):
                    missing.append(f"{name}.{key}")
    assert not missing, f"docs/{page} does not name {', '.join(missing)}"


def _code_words() -> set[str]:
    """Every identifier of cogexport's code, tables, tests and scripts (this file aside: it names wrong ones)."""
    sources = [*ROOT.joinpath("cogexport").rglob("*.py"), *ROOT.joinpath("key_maps").rglob("*.toml"),
               *ROOT.joinpath("tests").glob("*.py"), *ROOT.joinpath("scripts").glob("*.py")]
    sources = [path for path in sources if path.resolve() != Path(__file__).resolve()]
    return {word for path in sources for word in re.findall(r"[A-Za-z_]\w*", path.read_text(encoding="utf-8"))}


CODE_NAME = re.compile(r"[A-Za-z_][\w.]*(\(\))?")
PATH = re.compile(r"(cogexport|tests|scripts|key_maps|docs)/[\w./-]+")


@pytest.mark.parametrize("page", ["adding-a-lora-format.md", "adding-a-family.md", "key-maps.md"])
def test_every_code_name_a_guide_gives_exists(page):
    """The guides describe what the code does: a function, class, field or file they name in code is there (what a
    guide said once of fields that did not exist, `runners` and `loads_as_peft_folder`, fails here)."""
    words = _code_words()
    missing = []
    for span in _inline_code(DOCS / page):
        if (ROOT / span).exists():
            continue
        if PATH.fullmatch(span) and "<" not in span:
            missing.append(span)
        elif CODE_NAME.fullmatch(span):
            missing += [span for word in re.findall(r"[A-Za-z_]\w*", span) if word not in words][:1]
    assert not missing, f"docs/{page} names code that does not exist: {', '.join(missing)}"



def _section_tables(page: Path, heading: str) -> list[list[list[str]]]:
    """The tables under ``## heading``, each as its rows (header row and rule left out), cell by cell."""
    section = page.read_text(encoding="utf-8").split(f"\n## {heading}\n")[1].split("\n## ")[0]
    tables, rows = [], []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            tables, rows = [*tables, rows[2:]], []
    return tables


def test_the_reader_guide_names_every_field_of_a_reader_and_a_claim_and_every_reader_of_cogexports():
    """docs/adding-a-reader.md cannot go stale: its tables are Reader's fields (and which are required), cogexport's
    own readers in registry order, and Claim's fields."""
    from dataclasses import MISSING, fields

    from cogexport.checkpoint.readers import BUILT_IN, Claim, Reader

    guide = DOCS / "adding-a-reader.md"
    fields_table, readers_table = _section_tables(guide, "What a reader declares")
    required = {f.name: f.default is MISSING and f.default_factory is MISSING for f in fields(Reader)}
    assert [(row[0], row[1]) for row in fields_table] == [
        (f"`{name}`", "yes" if needed else "no") for name, needed in required.items()], \
        "docs/adding-a-reader.md: the table of a reader's fields is not Reader's fields"
    assert [(row[0], row[1]) for row in readers_table] == [(r.name, f"`{r.format}`") for r in BUILT_IN], \
        "docs/adding-a-reader.md: the table of cogexport's readers is not the registry's BUILT_IN"
    [claim_table] = _section_tables(guide, "Claims")
    assert [row[0] for row in claim_table] == [f"`{f.name}`" for f in fields(Claim)], \
        "docs/adding-a-reader.md: the table of a claim's fields is not Claim's fields"


def test_the_example_outputs_are_what_the_commands_print_now():
    """Every block marked ``<!-- example: NAME -->`` in README.md and docs/ is what its commands print, run now on the
    tests' tiny fixtures (scripts/doc_examples.py): an example cannot go stale (issue 40, item 8: the fp32 lines of the
    way back had changed under the README and docs/families/wan.md)."""
    examples = _script("doc_examples")
    stale = [str(page.relative_to(ROOT)) for page, text in examples.rendered_pages().items()
             if page.read_text(encoding="utf-8") != text]
    assert not stale, (f"the example outputs of {', '.join(stale)} are not what the commands print now: regenerate "
                       f"them with `{examples.REGENERATE}` and commit the result")


def test_every_example_is_shown_and_every_marked_block_names_one():
    examples = _script("doc_examples")
    shown = {name for page in _markdown_files()
             for name, _, _ in examples.marked_blocks(page.read_text(encoding="utf-8"))}
    assert shown == set(examples.EXAMPLES), f"examples no page shows: {set(examples.EXAMPLES) - shown}; " \
                                            f"marked blocks no example makes: {shown - set(examples.EXAMPLES)}"
