"""The one exception type for a user's mistake: bad input, a wrong option, an output in the way.

The CLI prints its message as a single line and exits with code 2; anything else is a bug and keeps its
traceback. Messages say what is wrong and what to do, naming the file or key.
"""


class CogExportError(Exception):
    """Something about the user's input or options is wrong; the message says what and what to do."""


class UnsafeCheckpointError(CogExportError):
    """A checkpoint file asks to run code while loading; it was refused before anything ran."""
