"""Checks that must pass before an output is moved into place, registered by the readers that defer them (a zip
record read only in part finishes its CRC-32 check here) and run by the writer's staging: the source side and the
sink side never import each other."""

from __future__ import annotations

from typing import Callable

_CHECKS: list[Callable[[], None]] = []


def before_publishing(check: Callable[[], None]) -> Callable[[], None]:
    """Register ``check`` (raises on failure) to run before every output is published."""
    _CHECKS.append(check)
    return check


def run_pending_checks() -> None:
    for check in _CHECKS:
        check()
