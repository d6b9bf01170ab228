"""Byte counts as people read them (decimal units, as the Hub and ``--max-shard-size`` use)."""

from __future__ import annotations


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    return f"{count} B"
