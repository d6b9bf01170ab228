"""Progress bars for long work: tqdm on stderr, quiet when stderr is not a terminal unless asked."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def byte_progress(total: int, description: str, enabled: bool | None = None) -> tqdm:
    """A bar counting bytes; ``enabled=None`` shows it only on a terminal."""
    return tqdm(total=total, desc=description, unit="B", unit_scale=True, file=sys.stderr, leave=False,
                disable=(None if enabled is None else not enabled), dynamic_ncols=True)
