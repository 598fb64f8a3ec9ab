"""Build and install the patched llama-cpp-python that tfm-local runs on.

Steps: fetch the pinned sdist from PyPI (sha256-checked), unpack it, copy our
own sources (``ggml_ops/src``) into its vendored llama.cpp, apply the numbered
patch series (``ggml_ops/patches/*.patch``, ``patch -p1``), build a wheel and
install it. The wheel is cached under ``$TFM_CACHE`` (default
``~/.cache/tfm-local``) keyed by the sdist version, a hash of the patch series
and sources, and the build options, so a second install takes seconds.

Options come from the environment:
  TFM_CUDA=1            build the CUDA backend (-DGGML_CUDA=ON)
  TFM_CUDA_ARCHS=90     CUDA architectures (default: native)
  TFM_CMAKE_ARGS="..."  extra CMake arguments
  TFM_BUILD_JOBS=N      parallel build jobs (default: CPU count)
  TFM_AMX=1             keep ggml's AMX kernels on a CPU that has AMX (default off: see NO_AMX_FLAGS)
  TFM_CPU_ISA=avx2      build for a narrower instruction set than this CPU's (see CPU_ISAS): the
                        kernels of an AVX2-only CPU on any x86-64 machine, so a test that only
                        passes with one CPU's kernels fails here too (``make test-narrow``)

Usage: python ggml_ops/build.py [--python PY] [--force] [--print-key]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

SDIST_VERSION = "0.3.36"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/"
    "llama_cpp_python-0.3.36.tar.gz"
)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# ggml's AMX backend (picked by the native build on CPUs that have AMX, e.g. Sapphire Rapids)
# repacks Q4_K/Q6_K weights and crashes in the first decode on such machines, with the pinned
# source here as upstream (llama.cpp issue #20824, "segfault in ggml_backend_amx_mul_mat");
# the AVX-512 and repack kernels are used instead. GCC and Clang let an explicit -mno-* win
# over -march=native whatever the order.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# Instruction sets a build can be narrowed to (TFM_CPU_ISA): ggml's own switches with its native
# detection off. "avx2" is what -march=native gives on an AVX2-only x86-64 server (AMD EPYC Zen 2/3,
# Intel before Skylake-SP): AVX2, FMA, F16C and BMI2, no AVX-512 and no AVX-VNNI.
CPU_ISAS = {
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF"],
}

HERE = Path(__file__).resolve().parent
PATCH_DIR = HERE / "patches"
SRC_DIR = HERE / "src"
# Parts of the package we never use: leaving them out halves the build.
BASE_CMAKE_ARGS = [
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
]


def cache_dir() -> Path:
    """Root of tfm-local's user cache (``$TFM_CACHE`` or ``~/.cache/tfm-local``)."""
    return Path(os.environ.get("TFM_CACHE", Path.home() / ".cache" / "tfm-local"))


def _cpu_has_amx() -> bool:
    """True on an x86-64 Linux machine whose CPU lists AMX (``amx_tile`` in /proc/cpuinfo)."""
    if os.uname().machine not in ("x86_64", "AMD64"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return False


def cmake_args() -> list[str]:
    """CMake arguments for this build, from the environment (see module doc).

    On a CPU with AMX (unless TFM_AMX=1) ``NO_AMX_FLAGS`` are appended to
    CMAKE_C_FLAGS / CMAKE_CXX_FLAGS, merged with those given in TFM_CMAKE_ARGS
    or else $CFLAGS / $CXXFLAGS (which CMake would otherwise read itself).
    TFM_CMAKE_ARGS is split like a shell command line (quotes group).
    """
    args = list(BASE_CMAKE_ARGS)
    if os.environ.get("TFM_CUDA", "0") not in ("", "0"):
        archs = os.environ.get("TFM_CUDA_ARCHS", "native")
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]
    isa = os.environ.get("TFM_CPU_ISA", "")
    if isa:
        if isa not in CPU_ISAS:
            raise SystemExit(f"[tfm-build] TFM_CPU_ISA={isa!r} is not one of {', '.join(sorted(CPU_ISAS))}")
        args += CPU_ISAS[isa]
    user = shlex.split(os.environ.get("TFM_CMAKE_ARGS", ""))
    if _cpu_has_amx() and os.environ.get("TFM_AMX", "0") in ("", "0"):
        for var, env in (("CMAKE_C_FLAGS", "CFLAGS"), ("CMAKE_CXX_FLAGS", "CXXFLAGS")):
            given = [a for a in user if a.startswith(f"-D{var}=") or a.startswith(f"-D{var}:STRING=")]
            base = given[-1].split("=", 1)[1] if given else os.environ.get(env, "")
            user = [a for a in user if a not in given]
            args.append(f"-D{var}={(base + ' ' + NO_AMX_FLAGS).strip()}")
    return args + user


def build_key() -> str:
    """Hash of everything that changes the built library: sdist, patches, sources, options."""
    h = hashlib.sha256()
    h.update(SDIST_SHA256.encode())
    for d in (PATCH_DIR, SRC_DIR):
        for f in sorted(d.iterdir()):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    h.update(" ".join(cmake_args()).encode())
    h.update(os.uname().machine.encode())
    return h.hexdigest()[:16]


def fetch_sdist() -> Path:
    """Return the pinned sdist, downloading it once; raises RuntimeError on a bad checksum."""
    dest = cache_dir() / "sdist" / SDIST_URL.rsplit("/", 1)[1]
    if dest.exists() and _sha256(dest) == SDIST_SHA256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"[tfm-build] downloading {SDIST_URL}", flush=True)
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(SDIST_URL, timeout=120) as r, open(tmp, "wb") as f:
        shutil.copyfileobj(r, f)
    if _sha256(tmp) != SDIST_SHA256:
        tmp.unlink()
        raise RuntimeError("llama-cpp-python sdist checksum mismatch; refusing to build")
    tmp.replace(dest)
    return dest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def variant_key() -> str:
    """Key of the persistent source and build folders: sdist, options and machine, not the patches.

    Keeping these folders across patch changes lets CMake/ninja rebuild only
    the files a patch touched.
    """
    h = hashlib.sha256()
    h.update(SDIST_SHA256.encode())
    h.update(" ".join(cmake_args()).encode())
    h.update(os.uname().machine.encode())
    return h.hexdigest()[:16]


def _fresh_tree(work: Path) -> Path:
    """Unpack the sdist into ``work``, add our sources, apply the patch series; returns the root."""
    with tarfile.open(fetch_sdist()) as tar:
        tar.extractall(work, filter="data")
    root = work / f"llama_cpp_python-{SDIST_VERSION}"
    dst = root / "vendor" / "llama.cpp" / "src"
    for f in sorted(SRC_DIR.iterdir()):
        shutil.copy2(f, dst / f.name)
    for p in sorted(PATCH_DIR.glob("*.patch")):
        print(f"[tfm-build] applying {p.name}", flush=True)
        subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(p)], cwd=root,
                       check=True, stdout=subprocess.DEVNULL)
    return root


def _sync_tree(src: Path, dst: Path) -> int:
    """Make ``dst`` equal to ``src``, touching only files whose bytes differ; returns files written."""
    n = 0
    seen = set()
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        seen.add(rel)
        g = dst / rel
        if f.is_dir():
            g.mkdir(parents=True, exist_ok=True)
        elif not g.is_file() or g.stat().st_size != f.stat().st_size or g.read_bytes() != f.read_bytes():
            g.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, g)
            os.utime(g)  # newer than any object built from the old version
            n += 1
    for g in sorted(dst.rglob("*"), reverse=True):
        if g.relative_to(dst) not in seen:
            shutil.rmtree(g) if g.is_dir() else g.unlink()
    return n


def prepare_source() -> Path:
    """The patched source tree in the cache, updated in place for the current patch series."""
    root = cache_dir() / "src" / variant_key() / f"llama_cpp_python-{SDIST_VERSION}"
    with tempfile.TemporaryDirectory(prefix="tfm-src-") as tmp:
        fresh = _fresh_tree(Path(tmp))
        root.mkdir(parents=True, exist_ok=True)
        print(f"[tfm-build] {_sync_tree(fresh, root)} source files changed", flush=True)
    return root


def build_wheel(key: str) -> Path:
    """Build (or reuse) the wheel for ``key``; returns its path.

    The CMake build folder persists under the cache, so an interrupted build
    resumes where it stopped. The build runs without isolation, with
    scikit-build-core, cmake and ninja installed into the building interpreter.
    """
    out = cache_dir() / "wheels" / key
    wheels = list(out.glob("*.whl")) if out.exists() else []
    if wheels:
        return wheels[0]
    t0 = time.time()
    root = prepare_source()
    _pip_install_missing(sys.executable, {"scikit_build_core": "scikit-build-core>=0.9.2",
                                          "cmake": "cmake>=3.21", "ninja": "ninja"})
    env = dict(os.environ)
    env["CMAKE_ARGS"] = shlex.join(cmake_args())
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = os.environ.get("TFM_BUILD_JOBS", str(os.cpu_count() or 2))
    env.pop("SOURCE_DATE_EPOCH", None)  # it would turn GGML_NATIVE off
    build_dir = cache_dir() / "build" / variant_key()
    with tempfile.TemporaryDirectory(prefix="tfm-wheel-") as stage:
        print(f"[tfm-build] building wheel ({env['CMAKE_ARGS']})", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--config-settings", f"build-dir={build_dir}", "-w", stage, str(root)],
                       check=True, env=env)
        built = next(Path(stage).glob("*.whl"))
        out.mkdir(parents=True, exist_ok=True)
        tmp_whl = out / (built.name + ".part")
        shutil.copy2(built, tmp_whl)
        tmp_whl.replace(out / built.name)
    print(f"[tfm-build] built in {time.time() - t0:.0f} s", flush=True)
    return out / built.name


def _pip_install_missing(python: str, wanted: dict[str, str]) -> None:
    """pip-install the requirements (values) whose module (keys) ``python`` cannot import.

    Nothing is asked of the package index when all are present, so the build
    also runs on a machine without one (e.g. the GPU machine, with the pinned
    sdist already in the cache).
    """
    probe = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"
    missing = subprocess.check_output([python, "-c", probe, *wanted], text=True).split()
    if missing:
        subprocess.run([python, "-m", "pip", "install", "-q", *(wanted[m] for m in missing)], check=True)


def install(python: str, force: bool = False) -> None:
    """Install the patched wheel into the interpreter ``python`` unless already there."""
    key = build_key()
    marker = Path(subprocess.check_output(
        [python, "-c", "import sys; print(sys.prefix)"], text=True).strip()) / "tfm-llama-build.key"
    if not force and marker.exists() and marker.read_text().strip() == key:
        print(f"[tfm-build] patched llama-cpp-python {key} already installed", flush=True)
        return
    wheel = build_wheel(key)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True)
    # llama-cpp-python's own runtime needs.
    _pip_install_missing(python, {"numpy": "numpy", "typing_extensions": "typing-extensions",
                                  "diskcache": "diskcache", "jinja2": "jinja2"})
    marker.write_text(key + "\n")
    print(f"[tfm-build] installed patched llama-cpp-python {key}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=sys.executable, help="interpreter to install into")
    ap.add_argument("--force", action="store_true", help="reinstall even if the key matches")
    ap.add_argument("--print-key", action="store_true", help="print the build key and exit")
    a = ap.parse_args()
    if a.print_key:
        print(build_key())
        return
    install(a.python, a.force)


if __name__ == "__main__":
    main()
