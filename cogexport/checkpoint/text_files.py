"""A file given as a checkpoint that is text, not weights: a README, a config, a training YAML, or the Git LFS pointer
left where a file's weights were never fetched. No weights format cogexport reads is text, so such a file is named for
what it is, rather than read as damaged weights ("not a torch.save archive; copy it again"). Also: the JSON files a
checkpoint keeps beside its weights, read with one line for a damaged one."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

from ..errors import CogExportError

LFS_POINTER = b"version https://git-lfs.github.com/spec/"
_HEAD = 4096  # enough of a file to tell text from the binary header every weights format starts with
_KINDS = {".json": "a JSON file", ".md": "a Markdown file", ".txt": "a text file", ".yaml": "a YAML file",
          ".yml": "a YAML file", ".toml": "a TOML file", ".py": "a Python file", ".sh": "a shell script"}


def text_file_kind(path: Path) -> str | None:
    """What ``path`` is when it is empty or its first bytes are text ("a JSON file", "a Git LFS pointer"); None for a
    binary file (or one that cannot be read: its reader says why)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEAD)
    except OSError:
        return None
    if not head:
        return "an empty file"
    if head.startswith(LFS_POINTER):
        return "a Git LFS pointer"
    if b"\0" in head:
        return None
    try:  # incremental: the head may end inside a character
        codecs.getincrementaldecoder("utf-8")().decode(head)
    except UnicodeDecodeError:
        return None
    return _KINDS.get(path.suffix.lower(), "a text file")


def not_weights_message(path: Path, kind: str) -> str:
    """The line for a text file given as a checkpoint: what it is and what to give instead."""
    if kind == "a Git LFS pointer":
        return (f"{path} is a Git LFS pointer, not the weights it stands for (they were never downloaded): fetch them "
                "(git lfs pull in its repository, or download the file itself) and give the file again")
    instead = (f"give the checkpoint's folder (perhaps {path.resolve().parent}) or one of its weights files; cogexport "
               "inspect FOLDER shows what a folder holds")
    if kind == "an empty file":
        return f"{path} is empty (0 bytes): copy it again if it held weights, or {instead}"
    return f"{path} is {kind}, not a checkpoint cogexport reads: {instead}"


def read_checkpoint_json(path: Path) -> object:
    """A JSON file a checkpoint keeps beside its weights (a run's metadata.json), parsed; one line naming it when it
    cannot be read or is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CogExportError(f"cannot read {path}: {error.strerror}") from None
    except (ValueError, UnicodeDecodeError):
        raise CogExportError(f"{path} is damaged: it is not JSON; copy the checkpoint again") from None
