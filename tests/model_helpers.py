"""Fake built-in models for the tests of tfm_local.files.models and tfm-models: registry entries, and
chunk wheels in a local folder that pip fetches from instead of the package index."""
from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from tfm_local.files import models
from tfm_local.files.models import BuiltinModel, Chunk

FAKE = "fake-tiny-model"


def register(monkeypatch, **fields) -> BuiltinModel:
    """Put a fake entry into the registry (undone after the test)."""
    base = dict(
        name=FAKE,
        description="fake",
        arch="llama",
        file_name="fake.gguf",
        size=0,
        sha256="0" * 64,
        chunks=(),
        requirements="requirements/fake.txt",
    )
    model = BuiltinModel(**{**base, **fields})
    monkeypatch.setitem(models.BUILTIN_MODELS, model.name, model)
    return model


def write_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal pure-Python wheel of ``dist`` ``version`` holding ``files`` (path in the wheel → bytes)."""
    module = dist.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tfm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    entries = {**files, **meta}
    record = "".join(f"{name},,\n" for name in entries) + f"{info}/RECORD,,\n"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in {**entries, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(name, data)
    return path


def make_chunk_wheels(folder: Path, payload: bytes, parts: int, prefix: str = "fake-tfm-wheel") -> tuple[Chunk, ...]:
    """Wheels ``{prefix}-1`` .. ``-{parts}`` (version 0.1.0) in ``folder``, each holding one chunk of ``payload``
    as ``<module>/data/partNN.bin``; their registry chunks, with the wheels' sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    size = -(-len(payload) // parts)
    chunks = []
    for i in range(parts):
        dist = f"{prefix}-{i + 1}"
        module = dist.replace("-", "_")
        file = f"data/part{i:02d}.bin"
        wheel = write_wheel(folder, dist, "0.1.0", {f"{module}/__init__.py": b"",
                                                    f"{module}/{file}": payload[i * size:(i + 1) * size]})
        chunks.append(Chunk(dist, "0.1.0", module, file, hashlib.sha256(wheel.read_bytes()).hexdigest()))
    return tuple(chunks)


def use_local_index(monkeypatch, folder: Path) -> None:
    """pip (run by the code under test) finds packages in ``folder`` only: no index is asked."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
