"""ggml_ops/build.py: the CMake arguments it derives from the environment (no build is run)."""
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ggml_ops"))
import build  # noqa: E402

NO_AMX = build.NO_AMX_FLAGS


@pytest.fixture
def env(monkeypatch):
    for k in ("TFM_CUDA", "TFM_CUDA_ARCHS", "TFM_CMAKE_ARGS", "TFM_AMX", "CFLAGS", "CXXFLAGS"):
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
