"""What an export learns from Diffusers' model classes, kept on disk so that the next export need not import Diffusers.

An export plans against the real Diffusers class: its constructor's defaults, and the model it builds from a config
(on the meta device: its config.json text and its state_dict's names, shapes and dtypes). Importing Diffusers for
that takes seconds (it brings torch._dynamo, and transformers and peft where they are installed): more than copying
a few GB. These facts depend only on the installed Diffusers and torch (their versions and the hashes of their
files, from pip's records), cogexport's version, the class and the config, so each answer is kept as JSON under those
and found again by them; an answer that cannot be read back exactly (a damaged file, another key in it) is made
anew. A Diffusers installed in editable mode is never cached: its code may change under the same record.

Where: ``$COGEXPORT_CACHE_DIR``, else ``$XDG_CACHE_HOME/cogexport``, else ``~/.cache/cogexport``; an empty
``COGEXPORT_CACHE_DIR`` turns the cache off. Writes are atomic (a whole file or none) and failures to write are
ignored: the cache only ever saves time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import __version__

CACHE_VARIABLE = "COGEXPORT_CACHE_DIR"
_TUPLE = "__tuple__"  # JSON has no tuples; a config's tuples must come back as tuples


class NotCacheable(ValueError):
    """A value JSON cannot carry exactly."""


def encode(value: Any) -> Any:
    """``value`` as JSON that ``decode`` turns back into an equal value of the same types."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {_TUPLE: [encode(item) for item in value]}
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value) and _TUPLE not in value:
        return {key: encode(item) for key, item in value.items()}
    raise NotCacheable(f"{type(value).__name__} {value!r}")


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(item) for item in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(decode(item) for item in value[_TUPLE])
        return {key: decode(item) for key, item in value.items()}
    return value


def remembered(kind: str, key: Mapping[str, Any], make: Callable[[], dict], fields: tuple[str, ...] = ()) -> dict:
    """The answer ``make()`` gives for ``key``, from the cache when it holds it (with every one of ``fields``), else
    made and kept. Key and answer are kept as ``encode`` writes them and come back as ``decode`` reads them (tuples as
    tuples); an answer or key holding a value JSON cannot carry exactly is made each time and never kept. ``kind``
    names what is asked ("defaults", "target")."""
    folder = _cache_folder()
    try:
        encoded_key = encode(dict(key))
    except NotCacheable:
        folder = None
    if folder is None:
        return make()
    text_key = json.dumps({"kind": kind, "key": encoded_key}, sort_keys=True)
    path = folder / f"{kind}-{hashlib.sha256(text_key.encode()).hexdigest()[:32]}.json"
    found = _read(path, text_key)
    if found is not None and all(name in found for name in fields):
        return decode(found)
    answer = make()
    try:
        _write(path, {"key": text_key, "answer": encode(answer)})
    except NotCacheable:
        pass  # asked again next time
    return answer


def _read(path: Path, text_key: str) -> dict | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != text_key or not isinstance(entry.get("answer"), dict):
        return None
    return entry["answer"]


def _write(path: Path, entry: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".writing-", suffix=".json")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(entry, handle)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # a read-only home or a full disk: the next export asks Diffusers again


@cache
def _cache_folder() -> Path | None:
    """This installation's folder of answers (its versions in its name), or None when caching is off."""
    configured = os.environ.get(CACHE_VARIABLE)
    if configured == "":
        return None
    diffusers = _installed_version("diffusers")
    torch = _installed_version("torch")
    if diffusers is None or torch is None:
        return None
    try:
        root = Path(configured) if configured else \
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cogexport"
    except (RuntimeError, KeyError):  # no home folder to be found (a bare container): no cache
        return None
    return root / f"diffusers-{diffusers}-torch-{torch}-cogexport-{__version__}"


def diffusers_version() -> str:
    """``diffusers.__version__`` (what a config's ``_diffusers_version`` holds), read from the installed package's
    metadata, which importing Diffusers to ask would cost seconds; an editable Diffusers, whose metadata may be older
    than its code, is asked."""
    if _installed_version("diffusers") is not None:
        return metadata.version("diffusers")
    import diffusers

    return diffusers.__version__


def _installed_version(package: str) -> str | None:
    """An installed package's version and a digest of its files' list (pip's RECORD, which holds each file's hash: a
    reinstall of another build under the same version differs), or None if that cannot tell its code (an editable
    install, whose files are a source tree)."""
    try:
        distribution = metadata.distribution(package)
        direct = json.loads(distribution.read_text("direct_url.json") or "{}")
        record = distribution.read_text("RECORD")
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return None
    if direct.get("dir_info", {}).get("editable") or not record:
        return None
    digest = hashlib.sha256(record.encode()).hexdigest()[:12]
    return f"{distribution.version}-{digest}".replace("/", "_")
