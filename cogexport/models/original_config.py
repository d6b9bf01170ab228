"""The config file an original layout keeps beside its weights (config.json naming the original model class), for
families whose shapes modules translate it into the Diffusers config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..errors import CogExportError
from .base_folder import read_json


def original_config_beside(folders: Sequence[Path], class_names: Sequence[str],
                           strict: bool = True) -> tuple[dict, Path] | None:
    """The first config.json in ``folders`` whose ``_class_name`` is one of ``class_names``, and where it is.

    ``strict``: a config.json that cannot be read, or holds JSON other than an object, is an error. Not strict (Wan's
    and HunyuanVideo 1.5's reading, as they have always read it): one that cannot be read is "not valid JSON", and
    JSON other than an object is passed over as another model's file."""
    for folder in folders:
        path = Path(folder) / "config.json"
        if path.is_file():
            config = read_json(path) if strict else _read_leniently(path)
            if isinstance(config, dict) and config.get("_class_name") in class_names:
                return config, path
    return None


def _read_leniently(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise CogExportError(f"{path} is not valid JSON") from None
