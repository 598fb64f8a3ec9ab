"""tfm_local.bench.provenance: every benchmark JSON says where it ran (commit, dirty flag, CPU or GPU,
the llama.cpp build, the files' SHA-256s). The tools' own JSON is checked in each tool's end-to-end
test (``problems(doc["provenance"], roles) == []``); here: the record's fields, a checkout without git,
the hash cache, and that no benchmark writes JSON without the record."""
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tfm_local.bench import provenance as prov

REPO = Path(__file__).resolve().parents[1]


def test_a_record_has_every_field_on_this_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    rec = json.loads(json.dumps(prov.provenance({"target": f, "drafter": None, "weaver": str(tmp_path / "none")})))
    assert prov.problems(rec, ["target"]) == []
    assert rec["files"]["target"] == {"path": str(f.resolve()), "bytes": f.stat().st_size,
                                      "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    assert "drafter" not in rec["files"]  # None: the role is not used
    assert rec["files"]["weaver"]["sha256"] is None and "not a local file" in rec["files"]["weaver"]["reason"]
    assert prov.problems(rec, ["weaver"]) == ["no sha256 of the weaver"]
    src = rec["source"]
    if shutil.which("git") and (REPO / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        assert src["commit"] == head and isinstance(src["dirty"], bool)
    lc = rec["llama_cpp"]
    # the build says which instruction sets its kernels use, and which patched build is installed
    assert "AVX2 = " in lc["system_info"] or "NEON = " in lc["system_info"]
    assert lc["sdist_version"] and lc["tfm_api_version"] and lc["tfm_weaver_api_version"]
    assert re.fullmatch(r"[0-9a-f]{16}", lc["build"]["key"])
    assert rec["cpu"]["model"] and rec["cpu"]["logical_cores"] >= 1
    assert (rec["gpu"] is None) == (not lc["gpu_offload"])


def test_without_git_the_commit_is_unknown_with_a_reason(tmp_path, monkeypatch):
    """A tarball, an installed copy inside another repository, or no git at all: "unknown" and why."""
    tarball = tmp_path / "tfm-local-0.1.0"
    tarball.mkdir()
    s = prov.source_info(tarball)
    assert s["commit"] == "unknown" and s["dirty"] is None and "not a git checkout" in s["reason"]
    if (REPO / ".git").exists():
        s = prov.source_info(REPO / "tfm_local")
        assert s["commit"] == "unknown" and "not the root of a git checkout" in s["reason"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    s = prov.source_info(REPO)
    assert s["commit"] == "unknown" and s["reason"] == "git is not installed"
    rec = {"schema": 1, "source": s, "host": prov.host_info(), "cpu": prov.cpu_info(), "gpu": None,
           "llama_cpp": {"sdist_version": "0.3.36", "system_info": "CPU : AVX2 = 1", "build": {"key": "k"}}}
    assert prov.problems(rec) == []  # an unknown commit with its reason is an answer, not a gap


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_dirty_flag_and_changed_files(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["-C", str(tmp_path), "add", "a.py"], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-qm", "a"], check=True)
    clean = prov.source_info(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", clean["commit"]) and clean["dirty"] is False
    (tmp_path / "new.json").write_text("{}")  # an untracked result file does not make the code dirty
    assert prov.source_info(tmp_path)["dirty"] is False
    (tmp_path / "a.py").write_text("x = 2\n")
    dirty = prov.source_info(tmp_path)
    assert dirty["dirty"] is True and dirty["changed"] == ["a.py"] and dirty["commit"] == clean["commit"]


def test_a_file_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    """The SHA-256 is remembered by (path, size, mtime, ...) across processes ($TFM_CACHE/sha256.json);
    a changed file is hashed again."""
    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    real, calls = prov._sha256, []
    monkeypatch.setattr(prov, "_sha256", lambda p: calls.append(p) or real(p))
    f = tmp_path / "big.gguf"
    f.write_bytes(b"a" * 1000)
    first = prov.file_sha256(f)
    monkeypatch.setattr(prov, "_memo", {})  # a new process: only the cache file remains
    assert prov.file_sha256(f) == first == hashlib.sha256(b"a" * 1000).hexdigest() and len(calls) == 1
    assert len(json.loads((tmp_path / "cache" / "sha256.json").read_text())) == 1
    f.write_bytes(b"b" * 1000)  # same size; a new mtime (and ctime)
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert prov.file_sha256(f) == hashlib.sha256(b"b" * 1000).hexdigest() and len(calls) == 2
    assert len(json.loads((tmp_path / "cache" / "sha256.json").read_text())) == 1  # the stale entry went


def test_cpu_model_and_flags_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2 fma\n")
    c = prov.cpu_info(cpuinfo)
    assert c["model"] == "AMD EPYC 7B13" and c["flags"] == ["avx2", "fma", "fpu", "sse"]
    c = prov.cpu_info(tmp_path / "missing")
    assert c["flags"] is None and "cannot read" in c["reason"] and c["model"]


def test_the_cmake_arguments_only_when_build_py_gives_the_installed_key(tmp_path):
    prefix = tmp_path / "venv"
    prefix.mkdir()
    b = prov.installed_build(prefix=prefix)
    assert b["key"] is None and "not installed by ggml_ops/build.py" in b["reason"]
    (prefix / "tfm-llama-build.key").write_text("0123456789abcdef\n")
    b = prov.installed_build(prefix=prefix)
    assert b["key"] == "0123456789abcdef" and b["cmake_args"] is None and "not the installed" in b["reason"]
    b = prov.installed_build(prefix=prefix, build_py=tmp_path / "none.py")
    assert b["cmake_args"] is None and "no source checkout" in b["reason"]
    here = subprocess.run([sys.executable, str(REPO / "ggml_ops" / "build.py"), "--print-key"],
                          capture_output=True, text=True).stdout.strip()
    (prefix / "tfm-llama-build.key").write_text(here + "\n")
    b = prov.installed_build(prefix=prefix)
    assert b["key"] == here and "-DLLAMA_BUILD_TESTS=OFF" in b["cmake_args"]


def test_a_gpu_build_must_name_its_card_driver_and_cuda():
    rec = prov.provenance()
    rec = {**rec, "llama_cpp": {**rec["llama_cpp"], "gpu_offload": True}, "gpu": None}
    assert prov.problems(rec) == ["no gpu name and driver on a GPU build", "no CUDA version on a GPU build"]
    rec["gpu"] = {"cards": [{"name": "NVIDIA H100 80GB HBM3", "driver": "570.86.15"}], "driver_cuda_version": "12.8"}
    assert prov.problems(rec) == []
    assert prov.problems(None) == ["no provenance record"]


def _writes_json(tree: ast.AST) -> bool:
    """A module that writes a JSON file: calls write_json (or tfm_bench's alias of it) or json.dump."""
    names = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
             for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return bool(names & {"write_json", "write_common_json", "dump"})


def test_every_benchmark_that_writes_json_records_provenance():
    """Each module of tfm_local/bench that writes JSON calls provenance(); each tfm-bench command (and the
    old tfm-bench-* console script of it) runs such a module or writes no JSON (``twin`` writes GGUFs)."""
    writers = []
    for path in sorted((REPO / "tfm_local" / "bench").glob("*.py")):
        tree = ast.parse(path.read_text())
        if path.name != "provenance.py" and _writes_json(tree):
            calls = {getattr(n.func, "id", None) for n in ast.walk(tree) if isinstance(n, ast.Call)}
            assert "provenance" in calls, f"{path.name} writes JSON without provenance()"
            writers.append(path.stem)
    from tfm_local.bench.commands import ALIASES, COMMANDS

    # the console scripts of pyproject.toml (a regex: tomllib is Python 3.11+, the project runs on 3.10):
    # tfm-bench is the dispatcher of the commands, each old name its command's module
    scripts = re.findall(r'^(tfm-bench[\w-]*) = "([\w.]+):\w+"$', (REPO / "pyproject.toml").read_text(), re.M)
    modules = {name: target.rsplit(".", 1)[1] for name, target in scripts}
    assert modules.pop("tfm-bench") == "commands"
    assert modules == {alias: COMMANDS[name].module for alias, name in ALIASES.items()}
    benches = {name: c.module for name, c in COMMANDS.items()}
    assert "run" in benches and len(benches) >= 10
    assert {n for n, m in benches.items() if m not in writers} == {"twin"}
    assert {"tfm_bench", "upstream", "profile_passes", "project", "trees", "load", "soak"} <= set(writers)


def test_upstream_json_records_the_program_and_models(tiny_pair, tmp_path):
    """bench.upstream's JSON (its program is built only on the GPU machine: its writer is called directly)."""
    from tfm_local.bench.upstream import write_result

    target, drafter = tiny_pair
    args = SimpleNamespace(json=str(tmp_path / "u.json"), binary=sys.executable, target=str(target),
                           drafter=str(drafter))
    write_result(args, [{"set": "gsm8k"}], [])
    doc = json.loads((tmp_path / "u.json").read_text())
    assert prov.problems(doc["provenance"], ["binary", "target", "drafter"]) == [] and doc["table"]
