"""What the families' shapes modules read the same way: the tensors a transformer must have, how many numbered blocks
it has, a JSON value a release file keeps in its header metadata, and the hooks of a family that has one task or one
published variant. A shapes module calls these; the hooks themselves are described in shapes.py.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..errors import CogExportError


def require(shapes: Mapping[str, Any], needed: Iterable[str], model: str) -> None:
    """Refuse shapes that lack any of ``needed``: they are not ``model`` ("a Wan transformer")."""
    absent = [name for name in needed if name not in shapes]
    if absent:
        raise CogExportError(f"the checkpoint has no {', '.join(absent)}: it is not {model}")


def block_count(shapes: Iterable[str], prefix: str) -> int:
    """How many numbered blocks the names hold under ``prefix`` ("transformer_blocks."): the highest index + 1."""
    indices = {int(name[len(prefix):].split(".")[0]) for name in shapes if name.startswith(prefix)}
    return max(indices) + 1 if indices else 0


def metadata_json(metadata: Mapping[str, str], key: str, fact: str, source: str) -> dict[str, Any]:
    """``{fact: the JSON object under metadata[key]}``, or {} where there is none; invalid JSON means the file is
    corrupt or not ``source`` ("an LTX-2 release")."""
    if key not in metadata:
        return {}
    try:
        value = json.loads(metadata[key])
    except ValueError:
        raise CogExportError(f"the checkpoint's safetensors metadata '{key}' is not valid JSON; the file is corrupt or "
                             f"not {source}") from None
    return {fact: value} if isinstance(value, dict) else {}


def one_task(task: str) -> Callable[[Mapping[str, Any]], str]:
    """The task_of hook of a family whose transformers all perform ``task``."""
    def task_of(facts: Mapping[str, Any]) -> str:
        return task

    return task_of


def one_variant(variant: str) -> Callable[..., str]:
    """The layout_variant hook of a family with one published variant, which every custom config is built like."""
    def layout_variant(config: Mapping[str, Any], experts: Sequence[str] = (),
                       pipeline: Mapping[str, Any] | None = None) -> str:
        return variant

    return layout_variant
