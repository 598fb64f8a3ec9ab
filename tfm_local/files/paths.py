"""Where tfm-local keeps files of its own (assembled models, later drafters)."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that moves the whole tfm-local cache.
CACHE_ENV = "TFM_CACHE"


def cache_dir(*parts: str, create: bool = True) -> Path:
    """Return tfm-local's cache directory, or a subdirectory of it.

    The root is ``$TFM_CACHE`` when that variable is set and not empty, else
    ``~/.cache/tfm-local``. It is read at every call, so tests can point it
    elsewhere with ``monkeypatch.setenv``.

    Args:
        *parts: path components below the root, e.g. ``cache_dir("models")``.
        create: make the directory (and its parents) when missing.

    Returns:
        The absolute directory path.

    Raises:
        OSError: ``create`` is true and the directory cannot be made.
    """
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tfm-local"
    path = Path(root).expanduser().absolute().joinpath(*parts)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path
