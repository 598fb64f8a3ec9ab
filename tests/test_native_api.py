"""Our C APIs and their Python bindings, one binding module per C header: tfm-ext.h (``native``, the
runtime), tfm-weaver.h (``weaver_native``, the Weaver and DARTree, versioned on their own) and
tfm-op-harness.h (``tfm_local.testing.op_harness``, tests and benchmarks only). Each module declares
exactly its header's functions, each version in Python is the one in C, and a library of another
version or without our API is refused with one clear error."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tfm_local.llama import native, weaver_native
from tfm_local.testing import op_harness

SRC = Path(__file__).resolve().parents[1] / "ggml_ops" / "src"

BINDINGS = [("tfm-ext.h", native), ("tfm-weaver.h", weaver_native), ("tfm-op-harness.h", op_harness)]


def _declared(text: str, api: str) -> set[str]:
    """Names of the functions declared in C text (``api`` marks each declaration: ``LLAMA_API`` in a
    header, nothing in a cdef)."""
    return set(re.findall(api + r"[A-Za-z_][\w \t*]*?\b(tfm_\w+)\s*\(", text))


@pytest.mark.parametrize("header, module", BINDINGS, ids=[h for h, _ in BINDINGS])
def test_each_binding_declares_exactly_its_headers_functions(header, module):
    in_header = _declared((SRC / header).read_text(), r"LLAMA_API\s+")
    in_cdef = _declared(module._CDEF, r"(?m)^")
    if module is op_harness:
        in_header |= {"tfm_api_version"}  # tfm-ext.h's version covers the harness: checked at load
    assert in_header and in_cdef == in_header, (sorted(in_cdef - in_header), sorted(in_header - in_cdef))


def test_the_python_versions_are_the_c_ones():
    forward = (SRC / "tfm-forward.cpp").read_text()
    ext = re.search(r"int32_t tfm_api_version\(void\) \{\s*return (\d+);", forward)
    weaver = re.search(r"#define TFM_WEAVER_API_VERSION (\d+)", (SRC / "tfm-weaver.h").read_text())
    assert ext and int(ext.group(1)) == native.API_VERSION
    assert weaver and int(weaver.group(1)) == weaver_native.WEAVER_API_VERSION
    assert "return TFM_WEAVER_API_VERSION;" in (SRC / "tfm-weaver.cpp").read_text()


def test_the_installed_library_has_both_versions():
    """The patched build answers both version checks (each binding's ``lib()`` loads)."""
    try:
        _, h = native.lib()
    except native.NativeError as e:
        pytest.skip(f"patched llama.cpp not built: {e}")
    assert h.tfm_api_version() == native.API_VERSION
    assert weaver_native.lib()[1].tfm_weaver_api_version() == weaver_native.WEAVER_API_VERSION
    assert op_harness.lib()[1].tfm_api_version() == native.API_VERSION


def test_another_version_or_a_missing_api_is_refused():
    try:
        native.lib()
    except native.NativeError as e:
        pytest.skip(f"patched llama.cpp not built: {e}")
    v = weaver_native.WEAVER_API_VERSION
    with pytest.raises(native.NativeError, match=rf"tfm_weaver_api_version\(\) is {v}, this tfm-local needs {v + 1}"):
        native.open_library(weaver_native._CDEF, "tfm_weaver_api_version", v + 1)
    with pytest.raises(native.NativeError, match="not the tfm-local patched build .tfm_no_such_version missing"):
        native.open_library("int32_t tfm_no_such_version(void);", "tfm_no_such_version", 1)
