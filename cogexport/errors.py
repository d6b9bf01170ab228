"""The one exception type for a user's mistake: bad input, a wrong option, an output in the way.

The CLI prints its message as a single line and exits with code 2; anything else is a bug and keeps its
traceback. Messages say what is wrong and what to do, naming the file or key. Text that comes from the input
(file contents, tag names, keys) goes into a message through ``quoted``, so a hostile or damaged file can
neither break the line nor hide what it holds; the message itself is kept to one line as a last resort.
"""

from __future__ import annotations


def quoted(text: object, limit: int = 80) -> str:
    """``text`` in quotes with anything unprintable escaped, cut to about ``limit`` characters."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return repr(text[:limit]) + ("..." if len(text) > limit else "")
    text = str(text)
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def one_line(message: str) -> str:
    """``message`` with line breaks and other control characters escaped."""
    return "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in message)


class CogExportError(Exception):
    """Something about the user's input or options is wrong; the message says what and what to do."""

    def __str__(self) -> str:
        return one_line(super().__str__())


class UnsafeCheckpointError(CogExportError):
    """A checkpoint file asks to run code while loading; it was refused before anything ran."""


class RoleError(CogExportError):
    """The set of weights asked for (``--role``, ``--ema``) is not in the checkpoint, or not whole there: the reader's
    own reason, which no other reader's fallback may replace."""


class ExtensionError(ValueError):
    """An extension is malformed: a bug in a family's data, a key map, or a LoRA, output or reader format's declaration
    (maybe another package's), found when it loads, not in the user's input. The CLI says it in one line, after
    ``kind``, and exits 2."""

    kind = "extensions"
