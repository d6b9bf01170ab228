"""The example outputs of README.md and docs/, made by running their commands on the tests' tiny fixtures.

A fenced block right after a line ``<!-- example: NAME -->`` is example NAME's: the commands it shows (``$ cogexport
...``) each followed by what that command printed (stdout and stderr, in order). The commands run in-process in a
fresh folder holding the example's inputs under the names the docs use (``wan-base``: a link to a cached tiny
pipeline), so the paths print as the docs spell them; what could still differ from run to run (the work folder's
path, timings) is normalised. tests/test_docs.py fails when a committed block is not what the commands print now.

    .venv/bin/python scripts/doc_examples.py --write    # rewrite every marked block
    .venv/bin/python scripts/doc_examples.py --check    # exit 1 if a marked block is stale
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's cogexport, whichever is installed
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
REGENERATE = ".venv/bin/python scripts/doc_examples.py --write"
MARK = re.compile(r"^<!-- example: ([\w-]+) -->$")
TIMING = re.compile(r"\b\d+(\.\d+)? ?(s|ms|seconds)\b")


def _cached(module: str, function: str, *args: str) -> Path:
    """One of the tests' cached tiny pipelines (tests/<module>.py's ``function(*args)``, made once)."""
    sys.path.insert(0, str(ROOT / "tests"))
    return getattr(importlib.import_module(module), function)(*args)


def _linked(module: str, function: str, *args: str) -> Callable[[Path], None]:
    """An input that is a cached fixture, linked under the name the docs use."""
    return lambda where: where.symlink_to(_cached(module, function, *args))


def _model_folder(module: str, function: str, variant: str, inside: str,
                  files: dict[str, str]) -> Callable[[Path], None]:
    """A model folder: the fixture's ``inside`` folder's config.json and ``files`` (name -> the fixture file it is)."""
    def make(where: Path) -> None:
        source = _cached(module, function, variant) / inside
        where.mkdir(parents=True)
        for name, original in {"config.json": "config.json", **files}.items():
            (where / name).symlink_to(source / original)

    return make


@dataclass(frozen=True)
class Example:
    """Inputs made in the work folder under the names the docs use; ``setup`` commands run first unshown."""

    inputs: dict[str, Callable[[Path], None]]
    shown: tuple[str, ...]
    setup: tuple[str, ...] = ()


WAN_BASE = {"wan-base": _linked("wan_fixtures", "tiny_wan_pipeline", "t2v-a14b")}
COG_BASE = {"cog-base": _linked("cogvideox_fixtures", "tiny_pipeline", "i2v")}
WEIGHTS = "diffusion_pytorch_model.safetensors"
# a Wan transformer folder with a stray file beside its weights, and one with the stray file only
STRAY = {"finetune/transformer": _model_folder("wan_fixtures", "tiny_wan_pipeline", "t2v", "transformer",
                                               {WEIGHTS: WEIGHTS, "ground_truth.safetensors": WEIGHTS}),
         "bare/transformer": _model_folder("wan_fixtures", "tiny_wan_pipeline", "t2v", "transformer",
                                           {"ground_truth.safetensors": WEIGHTS})}
TO_ORIGINAL = "wan-base wan-release --to original --dtype fp32"
EXAMPLES: dict[str, Example] = {
    "wan-to-original": Example(WAN_BASE, (TO_ORIGINAL,)),
    "wan-pipeline": Example(WAN_BASE, ("wan-release wan-exported --base wan-base",), setup=(TO_ORIGINAL,)),
    "wan-there-and-back": Example(WAN_BASE, (TO_ORIGINAL, "wan-release wan-exported --base wan-base")),
    "wan-vae-to-original": Example(WAN_BASE, ("wan-base wan-vae --to original --component vae",)),
    "cogvideox-to-sat": Example(COG_BASE, ("cog-base/transformer cog-sat --to original --dtype fp32",)),
    "model-folder-weights": Example(STRAY, ("finetune/transformer out", "bare/transformer out")),
}


@contextmanager
def _work_folder() -> Iterator[Path]:
    before = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="cogexport-doc-example-") as work:
        os.chdir(work)
        try:
            yield Path(work)
        finally:
            os.chdir(before)


def _run(command: str, work: Path) -> list[str]:
    """What ``cogexport COMMAND`` prints, stdout and stderr in order, normalised."""
    from click.testing import CliRunner

    from cogexport.cli import main

    result = CliRunner().invoke(main, shlex.split(command), catch_exceptions=False)
    text = result.output.replace(f"{work.resolve()}/", "").replace(f"{work}/", "")
    return [TIMING.sub("<time>", line) for line in text.splitlines()]


def render(name: str) -> str:
    """Example NAME's block: each shown command and what it printed."""
    example = EXAMPLES[name]
    with _work_folder() as work:
        for name, make in example.inputs.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            make(work / name)
        for command in example.setup:
            _run(command, work)
        lines = []
        for command in example.shown:
            lines += [f"$ cogexport {command}", *_run(command, work)]
    return "\n".join(lines)


def marked_blocks(text: str) -> list[tuple[str, int, int]]:
    """Each marked block of a page: its example's name and the line range of its body (between the fences)."""
    lines, found = text.split("\n"), []
    for number, line in enumerate(lines):
        mark = MARK.match(line)
        if mark is None:
            continue
        if number + 1 >= len(lines) or not lines[number + 1].startswith("```"):
            raise ValueError(f"<!-- example: {mark.group(1)} --> is not followed by a fenced block")
        end = next(i for i in range(number + 2, len(lines)) if lines[i].startswith("```"))
        found.append((mark.group(1), number + 2, end))
    return found


def rendered_pages(rendered: dict[str, str] | None = None) -> dict[Path, str]:
    """Every page holding a marked block, with each block as its example renders now (each example run once)."""
    rendered = {} if rendered is None else rendered
    pages = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        blocks = marked_blocks(text)
        if not blocks:
            continue
        lines = text.split("\n")
        for name, start, end in reversed(blocks):
            if name not in EXAMPLES:
                raise ValueError(f"{page.relative_to(ROOT)} marks a block as example {name!r}, which "
                                 f"scripts/doc_examples.py does not know ({', '.join(EXAMPLES)})")
            rendered.setdefault(name, render(name))
            lines[start:end] = rendered[name].split("\n")
        pages[page] = "\n".join(lines)
    return pages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite every marked block")
    parser.add_argument("--check", action="store_true", help="exit 1 if a marked block is stale")
    args = parser.parse_args()
    stale = {page: text for page, text in rendered_pages().items() if page.read_text(encoding="utf-8") != text}
    for page, text in stale.items():
        if args.write:
            page.write_text(text, encoding="utf-8")
        print(f"{'rewrote' if args.write else 'stale'}: {page.relative_to(ROOT)}")
    return 1 if stale and args.check else 0

if __name__ == "__main__":
    sys.exit(main())
