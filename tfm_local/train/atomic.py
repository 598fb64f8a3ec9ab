"""Files written atomically, and SHA-256 of files."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from tfm_convert.atomic import atomic_output

__all__ = ["atomic_output", "write_json", "sha256_file"]


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path``; the file appears only when complete (fsync'd)."""
    path = Path(path)
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
    return path


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file's bytes (read in 4 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
