"""Write files so that they appear only when complete."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from .errors import ConvertError


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in the folder of ``path``; on success rename it to ``path``.

    The temporary file sits next to the destination (same file system, so
    ``os.replace`` is atomic). If the body raises, the temporary file is
    removed and the exception propagates; an existing ``path`` is left as
    it was.

    Yields:
        Path of the temporary file to write.
    """
    dest = Path(path)
    if dest.exists() and not dest.is_file():
        raise ConvertError(f"output {dest} exists and is not a regular file (a folder, device or pipe)")
    if not dest.parent.is_dir():
        raise ConvertError(f"output folder {dest.parent} does not exist")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
