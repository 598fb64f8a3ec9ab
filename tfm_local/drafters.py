"""Which drafter GGUF a target uses: an explicit spec, or ``"auto"`` (the target's default).

``"auto"`` picks, in order:

1. a drafter shipped in ``tfm_local/assets`` for this target (matched by a
   cheap file identity), stored without its vocabulary; the target's
   tokenizer is attached once into the cache (``tfm_convert.vocab``);
2. otherwise a randomly initialised DFlash drafter built once for the target
   (``tfm_convert`` ``--init-random``): speculation runs end to end but
   accepts little.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from .paths import cache_dir

RANDOM_LAYERS = 1
ASSETS = Path(__file__).resolve().parent / "assets"

#: target identity (see ``_file_key``) → shipped vocabulary-less drafter (trained, see docs/training.md)
SHIPPED = {
    "d5cde8a7e219b5f2": "qwen2.5-coder-1.5b-instruct.dflash-L3-q4_0.novocab.gguf",
}


def _file_key(path: Path) -> str:
    """Cheap identity of a model file (a target, a shipped asset): size + hash of its first and last MiB."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def shipped_drafter_for(target: Path) -> Path | None:
    """The shipped trained drafter of ``target`` with the target's vocabulary attached, or None.

    The cached file is named after the asset's content (``_file_key``, read on every call: a few ms
    where a full sha256 took ~0.1 s), so a newer asset shipped under the same name is attached afresh
    instead of reusing a stale cache.
    """
    name = SHIPPED.get(_file_key(target))
    if name is None:
        return None
    digest = _file_key(ASSETS / name)[:12]
    return _attached_once(ASSETS / name, target, name.replace(".novocab.gguf", f"-{digest}.gguf"))


def _attached_once(weights: Path, target: Path, name: str) -> Path:
    """``cache_dir()/drafters/name``: ``weights`` with ``target``'s tokenizer attached
    (``tfm_convert.vocab.attach_vocab``), written on the first call only."""
    out = cache_dir() / "drafters" / name
    if not out.exists():
        from tfm_convert.vocab import attach_vocab

        out.parent.mkdir(parents=True, exist_ok=True)
        attach_vocab(weights, target, out)
    return out


def random_drafter_for(target: Path) -> Path:
    """Path of the cached random-init drafter for ``target``, created on first use."""
    out = cache_dir() / "drafters" / f"random-L{RANDOM_LAYERS}-{_file_key(target)}.gguf"
    if not out.exists():
        from tfm_convert.pipeline import init_random

        print(f"tfm-local: no trained drafter for {target.name}; creating a random-init DFlash drafter "
              f"(low acceptance) at {out}", file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        init_random(target, out, layers=RANDOM_LAYERS, seed=0)
    return out


def with_vocab(drafter: Path, target: Path) -> Path:
    """``drafter`` itself, or, for a DFlash drafter stored without its vocabulary (``tfm-convert``'s
    vocabulary-less output, as the shipped assets are), a cached copy with ``target``'s tokenizer
    attached (``tfm_convert.vocab.attach_vocab``; named after both files' identities). A file that does
    not parse as GGUF is returned unchanged: loading it reports the problem."""
    from .llm import gguf_kv

    kv = gguf_kv(drafter)
    if kv is None:
        return drafter
    arch = kv.get("general.architecture")
    if arch is None or arch.value != "dflash" or "tokenizer.ggml.model" in kv:
        return drafter
    stem = drafter.name.removesuffix(".gguf").removesuffix(".novocab")
    return _attached_once(drafter, target, f"{stem}-{_file_key(drafter)[:12]}-for-{_file_key(target)[:8]}.gguf")


def resolve_drafter(spec: str | os.PathLike, target: Path) -> Path:
    """Drafter GGUF path for ``spec`` (path, hub spec, built-in name, "auto" or "random") and ``target``;
    a vocabulary-less drafter gets the target's tokenizer (``with_vocab``)."""
    if str(spec) == "auto":
        return shipped_drafter_for(Path(target)) or random_drafter_for(Path(target))
    if str(spec) == "random":
        return random_drafter_for(Path(target))
    from .models import resolve_model

    return with_vocab(Path(resolve_model(spec)), Path(target))
