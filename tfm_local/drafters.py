"""Which drafter GGUF a target uses: an explicit spec, or ``"auto"`` (the target's default).

Until a trained drafter ships for a target, ``"auto"`` builds (once, cached)
a randomly initialised DFlash drafter for it with ``tfm_convert``'s
``--init-random`` path: speculation then runs end to end but accepts little.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from .paths import cache_dir

RANDOM_LAYERS = 1


def _target_key(target: Path) -> str:
    """Cheap identity of a target file: size + hash of its first and last MiB."""
    h = hashlib.sha256(str(target.stat().st_size).encode())
    with open(target, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, target.stat().st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def random_drafter_for(target: Path) -> Path:
    """Path of the cached random-init drafter for ``target``, created on first use."""
    out = cache_dir() / "drafters" / f"random-L{RANDOM_LAYERS}-{_target_key(target)}.gguf"
    if not out.exists():
        from tfm_convert.pipeline import init_random

        print(f"tfm-local: no trained drafter for {target.name}; creating a random-init DFlash drafter "
              f"(low acceptance) at {out}", file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        init_random(target, out, layers=RANDOM_LAYERS, seed=0)
    return out


def resolve_drafter(spec: str | os.PathLike, target: Path) -> Path:
    """Drafter GGUF path for ``spec`` (path, hub spec, built-in name, or "auto") and ``target``."""
    if str(spec) == "auto":
        return random_drafter_for(Path(target))
    from .models import resolve_model

    return resolve_model(spec)
