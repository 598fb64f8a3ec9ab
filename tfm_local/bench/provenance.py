"""Where a benchmark result came from: the one record every benchmark JSON carries under ``"provenance"``.

``provenance(files)`` returns::

    source     tfm-local's version, git commit, dirty flag and changed tracked files (``commit`` is
               "unknown" with a ``reason`` outside a git checkout: a tarball, an installed copy, no git)
    host       host name, OS, Python, and the environment variables that steer a run (TFM_*, GGML_*,
               LLAMA_*, OMP_*, CUDA_VISIBLE_DEVICES)
    cpu        model name, flags (/proc/cpuinfo), logical and usable cores
    gpu        None when the llama.cpp build has no GPU backend; else name, driver, memory and CUDA
               version of each card (``nvidia-smi``) and the CUDA runtime the process loaded
    llama_cpp  the patched build: sdist version, llama.cpp and ggml versions, ggml's commit, the
               versions of our C APIs (tfm_api_version, tfm_weaver_api_version), the
               system_info string (the instruction sets compiled in, repacking), the build key
               installed (``ggml_ops/build.py``), the wheel it came from, and the CMake arguments when
               this checkout's build.py gives the installed key (else None, with the reason)
    files      per role ("target", "drafter", "weaver", ...): absolute path, bytes and SHA-256

Nothing here raises for a missing tool or file: what cannot be found is None with a reason, so a run
on a machine without git, nvidia-smi or a source checkout still writes its result.

SHA-256s of files are remembered by (resolved path, size, mtime, ctime, inode) in the process and in
``$TFM_CACHE/sha256.json``, so a 1 GB target is hashed once, not at every run. Everything but the
file hashes is gathered once a process (``_static``), at the first call: the state the run started
from.

``problems(record)`` lists what a record lacks (the test of every tool's JSON, and tfm-bench project's
check of its sources).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: bumped when a field changes meaning
SCHEMA = 1
#: the environment variables recorded (prefixes, and whole names)
ENV_PREFIXES = ("TFM_", "GGML_", "LLAMA_", "OMP_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES",)
#: changed tracked files listed by name (the count is always given)
MAX_CHANGED = 20
_GIT_TIMEOUT = 20.0
_REPO = Path(__file__).resolve().parents[2]


def provenance(files: dict | None = None) -> dict:
    """The provenance record of a result: see the module doc.

    Args:
        files: role -> a file path (str or Path), None (role not used: left out), or a list of paths
            (several files of one role, e.g. replay's drafters: hashed each).
    """
    return {"schema": SCHEMA, **_static(), "files": file_records(files or {})}


@functools.lru_cache(maxsize=1)
def _static() -> dict:
    return {"source": source_info(), "host": host_info(), "cpu": cpu_info(), "gpu": gpu_info(),
            "llama_cpp": llama_cpp_info()}


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = _GIT_TIMEOUT) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``cmd``; (-1, "", reason) when it cannot run."""
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return -1, "", str(e)
    return r.returncode, r.stdout, r.stderr


def _first_line(text: str) -> str:
    return next((s.strip() for s in text.splitlines() if s.strip()), "")


def source_info(root: str | os.PathLike | None = None) -> dict:
    """tfm-local's version and the git state of the checkout at ``root`` (default: the one this module
    lives in). ``commit`` is the full hash or "unknown", ``dirty`` True / False or None (unknown),
    ``changed`` the tracked files that differ from the commit (untracked files are not counted),
    ``reason`` why the commit is unknown."""
    from .. import __version__

    root = Path(root or _REPO).resolve()
    out = {"tfm_local_version": __version__, "root": str(root), "commit": "unknown", "dirty": None}
    git = shutil.which("git")
    if git is None:
        return {**out, "reason": "git is not installed"}
    rc, top, err = _run([git, "rev-parse", "--show-toplevel"], cwd=root)
    if rc != 0:
        return {**out, "reason": f"{root} is not a git checkout (a tarball or an installed copy): "
                                 f"{_first_line(err) or f'git exit status {rc}'}"}
    if Path(top.strip()).resolve() != root:  # an installed copy inside some other repository
        return {**out, "reason": f"{root} is not the root of a git checkout (it is inside {top.strip()})"}
    rc, head, err = _run([git, "rev-parse", "HEAD"], cwd=root)
    if rc != 0:
        return {**out, "reason": f"git rev-parse HEAD failed: {_first_line(err) or rc}"}
    out["commit"] = head.strip()
    rc, status, err = _run([git, "status", "--porcelain", "--untracked-files=no"], cwd=root)
    if rc != 0:
        return {**out, "reason": f"git status failed: {_first_line(err) or rc}"}
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    rc, branch, _ = _run([git, "rev-parse", "--abbrev-ref", "HEAD"], cwd=root)
    return {**out, "dirty": bool(changed), "n_changed": len(changed), "changed": changed[:MAX_CHANGED],
            "branch": branch.strip() if rc == 0 else None}


def host_info() -> dict:
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    return {"hostname": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
            "executable": sys.executable, "env": env}


def cpu_info(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> dict:
    """The CPU's model name and flags from ``cpuinfo`` (Linux; x86 "model name"/"flags", Arm
    "Features"), the logical cores and those this process may use. Elsewhere ``flags`` is None with a
    ``reason`` and the model is ``platform.processor()``."""
    out = {"model": None, "flags": None, "machine": platform.machine(), "logical_cores": os.cpu_count()}
    with contextlib.suppress(AttributeError, OSError):
        out["usable_cores"] = len(os.sched_getaffinity(0))
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError as e:
        return {**out, "model": platform.processor() or platform.machine(), "reason": f"cannot read {cpuinfo}: {e}"}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    out["model"] = fields.get("model name") or fields.get("hardware") or platform.processor() or platform.machine()
    flags = fields.get("flags", fields.get("features"))
    if flags is None:
        out["reason"] = f"no flags line in {cpuinfo}"
    else:
        out["flags"] = sorted(flags.split())
    return out


def _gpu_offload() -> bool | None:
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # noqa: BLE001 (no llama_cpp, a broken build: not a GPU build we can name)
        return None


def gpu_info() -> dict | None:
    """None for a llama.cpp build without a GPU backend; else the cards ``nvidia-smi`` lists (name,
    driver, memory, the driver's CUDA version) and the CUDA runtime loaded in this process."""
    if not _gpu_offload():
        return None
    out: dict = {"backend": "cuda", "cards": [], "driver_cuda_version": None, "cuda_runtime": _cuda_runtime()}
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {**out, "reason": "nvidia-smi is not installed"}
    rc, text, err = _run([smi, "--query-gpu=index,name,driver_version,memory.total,pci.bus_id",
                          "--format=csv,noheader"], timeout=30)
    if rc != 0:
        return {**out, "reason": f"nvidia-smi failed: {_first_line(err) or rc}"}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5:
            out["cards"].append(dict(zip(("index", "name", "driver", "memory", "bus_id"), parts)))
    rc, text, _ = _run([smi], timeout=30)
    m = re.search(r"CUDA Version:\s*([\d.]+)", text) if rc == 0 else None
    out["driver_cuda_version"] = m.group(1) if m else None
    return out


def _cuda_runtime() -> str | None:
    """The CUDA runtime version of the libcudart this process can open (e.g. "12.8"), or None."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        v = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{v.value % 1000 // 10}"
    return None


def _cstr(lib, name: str) -> str | None:
    try:
        fn = getattr(lib, name)
    except AttributeError:
        return None
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    v = fn()
    return v.decode(errors="replace") if v else None


def llama_cpp_info() -> dict:
    """What the loaded llama.cpp build says of itself, and which patched build is installed (module doc)."""
    try:
        import llama_cpp
    except Exception as e:  # noqa: BLE001 (not installed, or a library that does not load)
        return {"error": f"llama_cpp does not import: {e}"}
    out: dict = {"sdist_version": getattr(llama_cpp, "__version__", None)}
    try:
        out["llama_version"] = llama_cpp.llama_version().decode(errors="replace")
    except (AttributeError, OSError):
        out["llama_version"] = None
    out["system_info"] = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    out["gpu_offload"] = bool(llama_cpp.llama_supports_gpu_offload())
    try:
        ggml = ctypes.CDLL("libggml-base.so.0")  # already loaded by llama_cpp: the same copy
        out["ggml_version"], out["ggml_commit"] = _cstr(ggml, "ggml_version"), _cstr(ggml, "ggml_commit")
    except OSError:
        out["ggml_version"] = out["ggml_commit"] = None
    from ..llama import native, weaver_native

    for key, binding in (("tfm_api_version", native), ("tfm_weaver_api_version", weaver_native)):
        try:
            out[key] = int(getattr(binding.lib()[1], key)())
        except Exception as e:  # noqa: BLE001 (an unpatched build, or one of other sources)
            out[key] = None
            out[key.replace("_version", "_error")] = str(e)
    out["build"] = installed_build(out["gpu_offload"])
    return out


def installed_build(gpu_offload: bool = False, prefix: str | os.PathLike | None = None,
                    build_py: str | os.PathLike | None = None) -> dict:
    """The patched build installed in ``prefix`` (default ``sys.prefix``): the key ``ggml_ops/build.py``
    wrote (``tfm-llama-build.key``), the wheel pip installed (``direct_url.json``), and the CMake
    arguments: those ``build_py`` (default: this checkout's) gives for the current environment, or with
    TFM_CUDA=1 on a GPU build, when its key is the installed one; else None with the reason."""
    out: dict = {"key": None, "wheel": None, "wheel_sha256": None, "cmake_args": None}
    marker = Path(prefix or sys.prefix) / "tfm-llama-build.key"
    try:
        out["key"] = marker.read_text().strip() or None
    except OSError:
        pass
    with contextlib.suppress(Exception):
        from importlib.metadata import distribution

        url = json.loads(distribution("llama_cpp_python").read_text("direct_url.json") or "{}")
        out["wheel"] = url.get("url")
        out["wheel_sha256"] = (url.get("archive_info") or {}).get("hashes", {}).get("sha256")
    if out["key"] is None:
        return {**out, "reason": f"no build key at {marker}: not installed by ggml_ops/build.py"}
    build_py = Path(build_py or _REPO / "ggml_ops" / "build.py")
    if not build_py.is_file():
        return {**out, "reason": f"{build_py} is missing (no source checkout): the CMake arguments are not known"}
    try:
        spec = importlib.util.spec_from_file_location("_tfm_build_for_provenance", build_py)
        build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build)
        tries = [{}] + ([{"TFM_CUDA": "1"}] if gpu_offload and os.environ.get("TFM_CUDA", "0") in ("", "0") else [])
        keys = []
        for extra in tries:
            with _env(extra):
                key, args = build.build_key(), build.cmake_args()
            keys.append(key)
            if key == out["key"]:
                return {**out, "cmake_args": args, "cmake_args_from": f"{build_py} (its key is the installed one)"}
    except (Exception, SystemExit) as e:  # noqa: BLE001 (an old or broken build.py)
        return {**out, "reason": f"{build_py} could not compute a build key: {e}"}
    return {**out, "reason": f"this checkout's {build_py.name} gives key(s) {', '.join(keys)} here, not the installed "
                             f"{out['key']} (patches or options changed since the build): CMake arguments not known"}


@contextlib.contextmanager
def _env(extra: dict):
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ----------------------------------------------------------------------------------------- files

_memo: dict[str, str] = {}


def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


def _hash_cache() -> Path:
    from ..files.paths import cache_dir

    return cache_dir(create=False) / "sha256.json"


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, remembered by (path, size, mtime, ctime, inode) in the process and in
    ``$TFM_CACHE/sha256.json`` (a cache that cannot be read or written is skipped). Raises OSError when
    the file cannot be read."""
    path = Path(path)
    key = _file_key(path)
    if key in _memo:
        return _memo[key]
    cache = _hash_cache()
    try:
        known = json.loads(cache.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    digest = known.get(key)
    if not (isinstance(digest, str) and len(digest) == 64):
        digest = _sha256(path)
        if _file_key(path) == key:  # not changed while read: worth remembering
            known = {k: v for k, v in known.items() if not k.startswith(f"{path.resolve()}|")}
            known[key] = digest
            with contextlib.suppress(OSError, ValueError):
                from ..files.atomic import write_json

                cache.parent.mkdir(parents=True, exist_ok=True)
                write_json(cache, known)
    _memo[key] = digest
    return digest


def file_record(path) -> dict:
    """``{"path", "bytes", "sha256"}`` of a local file; for anything else (a hub spec, a built-in name,
    a missing or unreadable file) ``sha256`` is None and ``reason`` says why."""
    p = Path(os.fspath(path)).expanduser()
    if not p.is_file():
        return {"path": str(path), "bytes": None, "sha256": None,
                "reason": "not a local file (missing, or a hub spec or built-in name not resolved here)"}
    try:
        return {"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": file_sha256(p)}
    except OSError as e:
        return {"path": str(p.resolve()), "bytes": None, "sha256": None, "reason": f"cannot read it: {e}"}


def file_records(files: dict) -> dict:
    """``file_record`` of each role's file (a list of them for a list); roles whose value is None are left out."""
    out = {}
    for role, v in files.items():
        if v is None:
            continue
        out[role] = [file_record(x) for x in v] if isinstance(v, (list, tuple)) else file_record(v)
    return out


# --------------------------------------------------------------------------------------- checking

#: the fields a record must have (dotted paths); a GPU record when the build has a GPU backend
REQUIRED = ("schema", "source.commit", "source.dirty", "host.hostname", "host.platform", "cpu.model",
            "llama_cpp.sdist_version", "llama_cpp.system_info", "llama_cpp.build.key")


def problems(record, files: tuple[str, ...] | list[str] = ()) -> list[str]:
    """What a provenance record lacks: each field of ``REQUIRED`` (a ``reason`` beside it counts for
    ``source.commit``/``source.dirty`` and ``cpu.flags``), the CPU flags, the GPU's name, driver and
    CUDA version on a GPU build, and a SHA-256 for each role in ``files``. Empty when complete."""
    if not isinstance(record, dict):
        return ["no provenance record"]
    out = []
    for dotted in REQUIRED:
        v: object = record
        for part in dotted.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is None and not (dotted.startswith("source.") and (record.get("source") or {}).get("reason")):
            out.append(f"no {dotted}")
    cpu = record.get("cpu") or {}
    if not cpu.get("flags") and not cpu.get("reason"):
        out.append("no cpu.flags")
    if (record.get("llama_cpp") or {}).get("gpu_offload"):
        gpu = record.get("gpu") or {}
        if not gpu.get("cards") or not all(c.get("name") and c.get("driver") for c in gpu["cards"]):
            out.append("no gpu name and driver on a GPU build")
        if not (gpu.get("driver_cuda_version") or gpu.get("cuda_runtime")):
            out.append("no CUDA version on a GPU build")
    recs = record.get("files") or {}
    for role in files:
        rs = recs.get(role)
        for r in rs if isinstance(rs, list) else [rs]:
            if not (isinstance(r, dict) and isinstance(r.get("sha256"), str) and len(r["sha256"]) == 64):
                out.append(f"no sha256 of the {role}")
    return out
