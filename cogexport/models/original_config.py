"""The config file an original layout keeps beside its weights (config.json naming the original model class), for
families whose shapes modules translate it into the Diffusers config."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .base_folder import read_json


def original_config_beside(folders: Sequence[Path], class_names: Sequence[str]) -> tuple[dict, Path] | None:
    """The first config.json in ``folders`` whose ``_class_name`` is one of ``class_names``, and where it is."""
    for folder in folders:
        path = Path(folder) / "config.json"
        if path.is_file():
            config = read_json(path)
            if config.get("_class_name") in class_names:
                return config, path
    return None
