"""Load a model file once in a child process before the engine's own process does.

llama.cpp refuses most damaged GGUF files with an error, but some values make it abort the process
(a ``GGML_ASSERT`` in the loader or while building a graph: a layer count of 0, a NaN norm epsilon,
a token string twice in the vocabulary, a state size that does not fit the tensors of a hybrid). The
cheap checks in ``gguf_meta.check_hparams`` catch the common ones with a precise message; this probe
catches the rest: ``probe_model(path)`` loads the file on the CPU in a child process (``python -m
tfm_local.llama.probe_child PATH``), builds a small context and decodes two tokens (not for a DFlash
drafter, whose graph needs its target: it is loaded only). A child that dies (a signal, an abort) or
hangs means the file would have taken the engine down: ``GGUFError`` naming the file, with
llama.cpp's last words. A child that ends cleanly, or with llama.cpp's ordinary refusal (the in-process
load then raises its own error with the reason), is fine.

A file that passed is remembered by path, size, modification time and inode in
``$TFM_CACHE/probed.json`` (``files.paths.cache_dir``), so each file pays once (~0.5 s for a tiny
model, a few seconds for a 7B one). ``TFM_PROBE=0`` turns the probe off (a trusted file system).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..files.gguf_meta import GGUFError

#: seconds the child may take; a 7B target loads and decodes two tokens on a CPU in well under this
TIMEOUT = 300.0
#: what a child that loaded the file prints last (``probe_child``)
OK = "tfm-probe-ok"


def _key(path: Path) -> str:
    st = path.stat()
    # st_ctime_ns too: a write in place that restores the size and the modification time (os.utime)
    # still moves the change time, which no user call can set back
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


def _cache() -> Path:
    from ..files.paths import cache_dir

    return cache_dir() / "probed.json"


def _known(key: str) -> bool:
    try:
        return key in json.loads(_cache().read_text())
    except (OSError, ValueError):
        return False


def _remember(key: str) -> None:
    from ..files.atomic import write_json

    try:
        try:
            seen = json.loads(_cache().read_text())
            if not isinstance(seen, dict):
                seen = {}
        except (OSError, ValueError):
            seen = {}
        seen[key] = 1
        if len(seen) > 4096:  # keep the newest
            seen = dict(list(seen.items())[-4096:])
        write_json(_cache(), seen)
    except OSError:
        pass  # a read-only cache: probe again next time


def passed(path: str | os.PathLike) -> bool:
    """Whether this very file (path, size, modification and change times, inode) passed the probe before, and with
    it the quick checks that run first (``model._check_file``)."""
    return _known(_key(Path(path)))


def probe_model(path: str | os.PathLike, timeout: float = TIMEOUT) -> None:
    """Load ``path`` in a child process first (module doc); return when that did not crash or hang.

    Raises:
        GGUFError: the child died or hung on the file (naming it, with llama.cpp's last lines).
    """
    if os.environ.get("TFM_PROBE", "1") == "0":
        return
    path = Path(path)
    key = _key(path)
    if _known(key):
        return
    env = dict(os.environ, TFM_THREADS="1", TFM_VERBOSE="1", TFM_PROBE="0", CUDA_VISIBLE_DEVICES="")
    try:
        r = subprocess.run([sys.executable, "-m", "tfm_local.llama.probe_child", str(path)], capture_output=True,
                           text=True, errors="replace", timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise GGUFError(f"{path}: loading it did not finish within {timeout:.0f} s in a test process "
                        "(a damaged or unsupported GGUF)") from None
    if OK in r.stdout:
        _remember(key)
        return
    if r.returncode >= 0 and r.returncode != 0 and "LlamaError" in r.stderr:
        return  # llama.cpp's ordinary refusal: the engine's own load says why
    last = [x.strip() for x in (r.stderr or "").splitlines() if x.strip()]
    why = next((x for x in reversed(last) if "GGML_ASSERT" in x or "error" in x.lower()), last[-1] if last else "")
    raise GGUFError(f"{path}: llama.cpp aborts on this file (exit {r.returncode}: {why[:300]}); "
                    "a damaged or unsupported GGUF")
