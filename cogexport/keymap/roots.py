"""Where key maps live: cogexport's own ``key_maps/`` (shipped in the package as ``cogexport.key_maps``), packages
that declare the entry-point group ``cogexport.key_maps`` (a family added by another installed package), and packages
added at run time with ``add_key_map_root``. Each root holds one folder per family (``<family>/family.toml`` and its
tables); a table is named ``<family>/<file stem>`` whichever root holds it.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata, resources
from importlib.resources.abc import Traversable

BUILT_IN = "cogexport.key_maps"
ENTRY_POINT_GROUP = "cogexport.key_maps"  # each entry point's value is an importable package holding family folders

_added: list[str] = []


@cache
def _installed_roots() -> tuple[str, ...]:
    return tuple(entry.value for entry in metadata.entry_points(group=ENTRY_POINT_GROUP))


def key_map_roots() -> tuple[str, ...]:
    """Every root, cogexport's own first."""
    return tuple(dict.fromkeys((BUILT_IN, *_installed_roots(), *_added)))


def add_key_map_root(package: str) -> None:
    """Read families and tables from ``package`` too (an importable package holding family folders)."""
    if package not in _added:
        _added.append(package)


def remove_key_map_root(package: str) -> None:
    if package in _added:
        _added.remove(package)


def family_folders() -> list[tuple[str, Traversable]]:
    """(family key, folder) of every family folder in every root, in root order, then name order."""
    found = []
    for root in key_map_roots():
        folders = [p for p in resources.files(root).iterdir() if p.is_dir() and not p.name.startswith(("_", "."))]
        found += [(folder.name, folder) for folder in sorted(folders, key=lambda p: p.name)]
    return found


def find_key_map_file(relative: str) -> Traversable | None:
    """The file ``<family>/<name>`` in the first root that has it."""
    for root in key_map_roots():
        path = resources.files(root).joinpath(*relative.split("/"))
        if path.is_file():
            return path
    return None
