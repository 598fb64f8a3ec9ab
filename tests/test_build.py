"""ggml_ops/build.py: the CMake arguments it derives from the environment (no build is run)."""
import shlex
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ggml_ops"))
import build  # noqa: E402

NO_AMX = build.NO_AMX_FLAGS


@pytest.fixture
def env(monkeypatch):
    for k in ("TFM_CUDA", "TFM_CUDA_ARCHS", "TFM_CMAKE_ARGS", "TFM_AMX", "TFM_CPU_ISA", "CFLAGS", "CXXFLAGS"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def _flags(args, var):
    return [a.split("=", 1)[1] for a in args if a.startswith(f"-D{var}=")]


def test_amx_flags_only_on_an_amx_cpu_and_not_when_asked_to_keep_amx(env):
    env.setattr(build, "_cpu_has_amx", lambda: True)
    args = build.cmake_args()
    assert _flags(args, "CMAKE_C_FLAGS") == [NO_AMX] and _flags(args, "CMAKE_CXX_FLAGS") == [NO_AMX]
    env.setenv("TFM_AMX", "1")
    assert not _flags(build.cmake_args(), "CMAKE_C_FLAGS")
    env.delenv("TFM_AMX")
    env.setattr(build, "_cpu_has_amx", lambda: False)
    assert not _flags(build.cmake_args(), "CMAKE_C_FLAGS")


def test_a_narrowed_build_turns_native_detection_and_avx512_off(env):
    """TFM_CPU_ISA=avx2 (``make test-narrow``): ggml's own switches for an AVX2-only CPU, native detection
    off, so the build key differs from the native build's; an unknown set is refused before any build."""
    native_key = build.variant_key()
    env.setenv("TFM_CPU_ISA", "avx2")
    args = build.cmake_args()
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF"} <= set(args)
    assert build.variant_key() != native_key
    env.setenv("TFM_CPU_ISA", "avx9")
    with pytest.raises(SystemExit, match="TFM_CPU_ISA='avx9' is not one of avx2"):
        build.cmake_args()


def test_user_flags_are_merged_not_replaced(env):
    env.setattr(build, "_cpu_has_amx", lambda: True)
    env.setenv("TFM_CMAKE_ARGS", '-DCMAKE_C_FLAGS="-O2 -g" -DGGML_FOO=ON')
    env.setenv("CXXFLAGS", "-fno-plt")
    args = build.cmake_args()
    assert _flags(args, "CMAKE_C_FLAGS") == [f"-O2 -g {NO_AMX}"]  # one definition: the user's plus ours
    assert _flags(args, "CMAKE_CXX_FLAGS") == [f"-fno-plt {NO_AMX}"]  # $CXXFLAGS kept (CMake ignores it now)
    assert args[-1] == "-DGGML_FOO=ON"
    # CMAKE_ARGS reaches scikit-build-core as one shell-quoted string: each argument survives whole
    assert shlex.split(shlex.join(args)) == args


def test_quoted_user_arguments_stay_whole_without_amx(env):
    env.setattr(build, "_cpu_has_amx", lambda: False)
    env.setenv("TFM_CMAKE_ARGS", "-DCMAKE_C_FLAGS='-O2 -g'")
    assert build.cmake_args()[-1] == "-DCMAKE_C_FLAGS=-O2 -g"


# -- the patch series itself (ggml_ops/patches, ggml_ops/src) ------------------------------------

PATCHES = sorted(build.PATCH_DIR.glob("*.patch"))


def _header_and_files(p: Path) -> tuple[list[str], list[tuple[str, bool]]]:
    """A patch's header lines (before its first ``--- a/``) and the files it changes as (path, created)."""
    lines = p.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("--- a/"))
    files = []
    for i in range(first, len(lines) - 2):
        if lines[i].startswith("--- a/") and lines[i + 1].startswith("+++ b/"):
            files.append((lines[i + 1][6:].split("\t")[0], lines[i + 2].startswith("@@ -0,0 ")))
    return lines[:first], files


def test_patches_are_numbered_without_gaps():
    assert [p.name[:5] for p in PATCHES] == [f"{i:04d}-" for i in range(1, len(PATCHES) + 1)]


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name[:4])
def test_every_patch_has_a_header_that_patch_ignores(patch):
    """What, why, the measured effect (with the doc), and the files: plain text before the first hunk,
    no line that patch(1) would take for a diff header."""
    head, files = _header_and_files(patch)
    text = "\n".join(head)
    assert len(head) >= 5 and files
    for word in ("What:", "Why:", "Measured effect", "Files:"):
        assert word in text, word
    assert not [h for h in head if h.startswith(("---", "+++", "diff ", "@@", "Index:", "***"))]
    for path, _ in files:
        assert path in text.replace("\n", " "), path


def test_no_patch_modifies_a_file_another_patch_creates():
    created = {}
    for p in PATCHES:
        for path, new in _header_and_files(p)[1]:
            if new:
                created[path] = p.name
            else:
                assert path not in created, f"{p.name} modifies {path}, created by {created.get(path)}"


def test_no_runtime_switches_or_timing_code_ship():
    """The A/B switches that chose the shipped kernels live in ggml_ops/dev, never in the built sources."""
    for f in [*PATCHES, *sorted(build.SRC_DIR.iterdir())]:
        text = f.read_text()
        for word in ("TFM_CUDA_", "TFM_GDN_TWICE", "TREE_TWICE", "getenv"):
            assert word not in text, (f.name, word)


def test_dev_experiments_stay_out_of_the_build_key(tmp_path, monkeypatch):
    """build_key (and the applied series) cover patches/ and src/ only: ggml_ops/dev never reaches the wheel."""
    assert (build.HERE / "dev" / "README.md").is_file()
    root = tmp_path / "ggml_ops"
    shutil.copytree(build.HERE, root, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(build, "PATCH_DIR", root / "patches")
    monkeypatch.setattr(build, "SRC_DIR", root / "src")
    key = build.build_key()
    (root / "dev" / "0011-experiment.patch").write_text("changed\n")
    assert build.build_key() == key
    (root / "patches" / PATCHES[-1].name).write_text(PATCHES[-1].read_text() + "\n")
    assert build.build_key() != key


def test_no_repack_turns_llama_cpps_weight_repacking_off(monkeypatch):
    """TFM_NO_REPACK=1 (``make test-narrow``) loads every model without llama.cpp's extra buffer types
    (the repacked Q4_0/Q4_K GEMM weights), so batches run the plain per-row kernels; on by default."""
    from tfm_local.llama.model import model_params

    monkeypatch.delenv("TFM_NO_REPACK", raising=False)
    assert model_params(0).use_extra_bufts
    monkeypatch.setenv("TFM_NO_REPACK", "1")
    p = model_params(0)
    assert not p.use_extra_bufts and p.n_gpu_layers == 0
