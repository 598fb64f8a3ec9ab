"""Files that appear only when complete, and the SHA-256 of a file: the one helper for the package,
the converter and the trainer.

``atomic_output(path)`` yields a temporary path beside ``path`` (same folder, so the same file system)
with a short hidden name of its own, ``.H.PID.R.tmp`` (H: 16 hex digits of the SHA-256 of ``path``'s
name, so ``stale_temps`` finds what a killed writer left; R: 8 random hex digits, so two writes of one
path never share a file): under 50 bytes whatever ``path``'s name, so any name the file system takes
(255 bytes) can be written; the caller writes it however it likes; when the ``with`` body returns, the
file is renamed onto ``path`` with ``os.replace`` (atomic on POSIX and Windows). When the body
raises (an exception, KeyboardInterrupt), the temporary file is removed, the exception propagates
and an existing ``path`` is left as it was. ``write_json`` / ``write_text`` are the
common bodies (flushed and fsync'd before the rename).

Errors:
    OutputPathError (an OSError): ``path`` exists and is not a regular file (a folder, device or
        pipe), or its folder does not exist; raised before anything is written. The converter turns
        it into its ConvertError (``tfm_convert.errors.convert_errors``).
    OSError: the folder is not writable, the disk is full, ... (from the body or the rename).
    TypeError / ValueError (``write_json``): a document JSON cannot hold; the old file stays.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["OutputPathError", "atomic_output", "stale_temps", "write_json", "write_text", "sha256_file"]


class OutputPathError(OSError):
    """An output path that cannot become a file: it is a folder (device, pipe), or its folder is missing.

    The message is meant for the user as is."""


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path in the folder of ``path``; when the body returns, rename it to ``path``.

    Args:
        path: the destination file (replaced when it exists).
        mode: permission bits given to the file before the rename (default: as the body created it,
            i.e. 0o666 less the umask for a plain ``open``).
    Yields:
        Path of the temporary file to write (it does not exist yet).
    Raises:
        OutputPathError: see the module doc (before the body runs).
    """
    dest = Path(path)
    if dest.exists() and not dest.is_file():
        raise OutputPathError(f"output {dest} exists and is not a regular file (a folder, device or pipe)")
    if not dest.parent.is_dir():
        raise OutputPathError(f"output folder {dest.parent} does not exist")
    tmp = dest.with_name(f"{_temp_prefix(dest)}{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _temp_prefix(dest: Path) -> str:
    """``.H.``: the start of every temporary name of ``dest`` (module doc)."""
    return "." + hashlib.sha256(os.fsencode(dest.name)).hexdigest()[:16] + "."


def stale_temps(path: str | os.PathLike) -> list[Path]:
    """The temporary files of ``path`` in its folder (left by writers that were killed, or still being
    written: the caller knows which, e.g. under a lock)."""
    dest = Path(path)
    return sorted(dest.parent.glob(f"{_temp_prefix(dest)}*.tmp"))


def write_text(path: str | os.PathLike, text: str, mode: int | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (flushed and fsync'd); returns ``path`` as a Path."""
    with atomic_output(path, mode) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, mode: int | None = None) -> Path:
    """Write ``obj`` as indented JSON (``indent=1``, a final newline) to ``path`` atomically (flushed and
    fsync'd); returns ``path`` as a Path. A document JSON cannot hold raises TypeError / ValueError and
    leaves any previous file whole."""
    with atomic_output(path, mode) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file's bytes (read in 4 MiB chunks). Raises OSError when unreadable."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
