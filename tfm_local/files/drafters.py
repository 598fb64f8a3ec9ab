"""Which drafter GGUF a target uses: an explicit spec, or ``"auto"`` (the target's default).

``"auto"`` picks, in order:

1. a drafter shipped in ``tfm_local/assets`` for this target (matched by a
   cheap file identity), stored without its vocabulary; the target's
   tokenizer is attached once into the cache (``tfm_convert.vocab``);
2. otherwise a randomly initialised DFlash drafter built once for the target
   (``tfm_convert`` ``--init-random``): speculation runs end to end but
   accepts little.

The converter's library functions (attach a vocabulary, random init, a draft vocabulary) are
imported when a file has to be built, never at import time.

Draft vocabulary (``apply_draft_vocab``): a drafter file may come with the ids of its reduced
draft vocabulary next to it, ``<stem>.draft-vocab.npy`` (the shipped asset does: 65536 ids, every
response token of the default target's greedy corpus, then the lowest unseen ids; docs/training.md).
Its LM head over those rows only is then built from the target's once, into the cache
(``tfm_convert.draft_vocab``), named after the drafter's, the ids' and the target's identities.
``draft_vocab="full"`` (``--draft-vocab full``) or ``TFM_DRAFT_VOCAB=0`` keeps the full vocabulary;
a path to an ``.npy`` of ids uses those. On a GPU "auto" means "full" (``draft_vocab_on``): the
reduced head made no drafter step faster on the H200 and cost 1-3% of τ (docs/gpu.md).
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from .paths import cache_dir

RANDOM_LAYERS = 1
ASSETS = Path(__file__).resolve().parents[1] / "assets"  # tfm_local/assets: the shipped drafters

#: target identity (see ``_file_key``) → shipped vocabulary-less drafter (trained, see docs/training.md)
SHIPPED = {
    "d5cde8a7e219b5f2": "qwen2.5-coder-1.5b-instruct.dflash-L3-q4_0.novocab.gguf",
}
#: shipped drafter → the built-in target (``models.BUILTIN_MODELS``) it was trained for
SHIPPED_FOR = {
    "qwen2.5-coder-1.5b-instruct.dflash-L3-q4_0.novocab.gguf": "qwen2.5-coder-1.5b-instruct",
}


def drafter_name(asset: str) -> str:
    """The name of a shipped drafter (``tfm-models``): its file name without ``.gguf`` and ``.novocab``."""
    return asset.removesuffix(".gguf").removesuffix(".novocab")


def prepared_copies(name: str) -> list[Path]:
    """The files in the cache built from the drafter called ``name`` (``drafter_name``, or "random-L…" for
    the random-init ones): its copies with a vocabulary or a draft vocabulary attached, which are built
    again when needed."""
    folder = cache_dir("drafters", create=False)
    return sorted(p for p in folder.glob(f"{name}-*.gguf")) if folder.is_dir() else []


def _file_key(path: Path) -> str:
    """Cheap identity of a model file (a target, a shipped asset): size + hash of its first and last MiB."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def file_key(path: str | os.PathLike) -> str:
    """The cheap identity of a model file (``_file_key``: size and the hash of its first and last MiB);
    a Weaver GGUF records its target's (``weaver``)."""
    return _file_key(Path(path))


def shipped_drafter_for(target: Path, draft_vocab: str | os.PathLike = "auto") -> Path | None:
    """The shipped trained drafter of ``target`` with the target's vocabulary attached (and its draft
    vocabulary, see ``apply_draft_vocab``), or None.

    The cached file is named after the asset's content (``_file_key``, read on every call: a few ms
    where a full sha256 took ~0.1 s), so a newer asset shipped under the same name is attached afresh
    instead of reusing a stale cache.
    """
    name = SHIPPED.get(_file_key(target))
    if name is None:
        return None
    digest = _file_key(ASSETS / name)[:12]
    attached = _attached_once(ASSETS / name, target, name.replace(".novocab.gguf", f"-{digest}.gguf"))
    return apply_draft_vocab(ASSETS / name, attached, target, draft_vocab)


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
        init_random(target, out, layers=RANDOM_LAYERS, seed=0, mask_token=_random_mask_token(target))
    return out


def _random_mask_token(target: Path) -> int | None:
    """The MASK id of a random drafter for ``target``: None (the converter's pick: the first UNUSED token)
    when the vocabulary has an UNUSED token; else its last CONTROL token that is none of the tokenizer's
    named special tokens (BOS, EOS, padding...), as SmolLM2's vocabulary offers; else its last id. A random
    drafter's MASK only has to be a valid id: its drafts are rarely accepted whatever it is."""
    import gguf
    import numpy as np
    from tfm_convert.target_info import read_target_info

    info = read_target_info(target)
    if info.unused_token_ids():
        return None
    control = [int(i) for i in np.flatnonzero(info.token_types == int(gguf.TokenType.CONTROL))
               if int(i) not in info.special_ids]
    return control[-1] if control else info.n_vocab - 1


def with_vocab(drafter: Path, target: Path) -> Path:
    """``drafter`` itself, or, for a DFlash drafter stored without its vocabulary (``tfm-convert``'s
    vocabulary-less output, as the shipped assets are), a cached copy with ``target``'s tokenizer
    attached (``tfm_convert.vocab.attach_vocab``; named after both files' identities). A file that does
    not parse as GGUF is returned unchanged: loading it reports the problem."""
    from .gguf_meta import GGUFError, read_gguf_meta

    try:
        kv = read_gguf_meta(drafter).kv
    except GGUFError:
        return drafter
    arch = kv.get("general.architecture")
    if arch is None or arch.value != "dflash" or "tokenizer.ggml.model" in kv:
        return drafter
    stem = drafter.name.removesuffix(".gguf").removesuffix(".novocab")
    return _attached_once(drafter, target, f"{stem}-{_file_key(drafter)[:12]}-for-{_file_key(target)[:8]}.gguf")


DRAFT_VOCAB_SUFFIX = ".draft-vocab.npy"


def draft_vocab_file(drafter: Path) -> Path | None:
    """The draft vocabulary shipped next to ``drafter``: ``<stem>.draft-vocab.npy`` (stem without
    ``.gguf`` and ``.novocab``), or None when there is none."""
    stem = drafter.name.removesuffix(".gguf").removesuffix(".novocab")
    ids = drafter.with_name(stem + DRAFT_VOCAB_SUFFIX)
    return ids if ids.is_file() else None


def draft_vocab_on(mode: str | os.PathLike, on_gpu: bool) -> str | os.PathLike:
    """The draft-vocabulary mode to use where the drafter runs: "auto" on a GPU is "full" (the H200
    drafter step took 1.42-1.58 ms with the 65,536-id head and 1.45-1.55 ms with the full one, while
    chain τ fell 1-3%: the head is not what a GPU drafter step waits for); any other mode, or "auto" on
    the CPU (1.4x faster drafter step), is kept."""
    return "full" if on_gpu and str(mode) == "auto" else mode


def check_draft_vocab_mode(mode: str | os.PathLike) -> None:
    """Raise ValueError unless ``mode`` is "auto", "full" or an existing ``.npy`` file."""
    if str(mode) not in ("auto", "full") and not (str(mode).endswith(".npy") and Path(mode).is_file()):
        raise ValueError(f"draft vocabulary must be 'auto', 'full' or an existing .npy file of token ids, "
                         f"got {str(mode)!r}")


def apply_draft_vocab(source: Path, drafter: Path, target: Path, mode: str | os.PathLike = "auto") -> Path:
    """``drafter`` (the loadable form of ``source``) with a reduced draft vocabulary, or unchanged.

    ``mode``: "auto" uses the ids shipped next to ``source`` (``draft_vocab_file``) when there are
    some and ``$TFM_DRAFT_VOCAB`` is not "0" (a drafter that already has a draft vocabulary is then
    used as it is); "full" none; a path to an ``.npy`` file those ids. The reduced copy is written
    once into the cache (``tfm_convert.draft_vocab.reduce_drafter``).
    Raises ValueError for a bad mode, ``tfm_convert.ConvertError`` for bad ids.
    """
    check_draft_vocab_mode(mode)
    if str(mode) == "full" or (str(mode) == "auto" and os.environ.get("TFM_DRAFT_VOCAB", "1") == "0"):
        return drafter
    ids = draft_vocab_file(source) if str(mode) == "auto" else Path(mode)
    if ids is None:
        return drafter
    ids_key = hashlib.sha256(ids.read_bytes()).hexdigest()[:12]
    stem = drafter.name.removesuffix(".gguf")
    out = cache_dir() / "drafters" / f"{stem}-{_file_key(drafter)[:8]}-dv{ids_key}-for-{_file_key(target)[:8]}.gguf"
    if out.exists():
        return out
    from tfm_convert.draft_vocab import draft_vocab_size, load_draft_ids, reduce_drafter

    if str(mode) == "auto" and draft_vocab_size(drafter) is not None:
        return drafter
    out.parent.mkdir(parents=True, exist_ok=True)
    return reduce_drafter(drafter, target, load_draft_ids(ids), out)


def resolve_drafter(spec: str | os.PathLike, target: Path, draft_vocab: str | os.PathLike = "auto") -> Path:
    """Drafter GGUF path for ``spec`` (path, hub spec, built-in name, "auto" or "random") and ``target``;
    a vocabulary-less drafter gets the target's tokenizer (``with_vocab``), then its draft vocabulary
    (``apply_draft_vocab`` with mode ``draft_vocab``)."""
    check_draft_vocab_mode(draft_vocab)
    if str(spec) == "auto":
        shipped = shipped_drafter_for(Path(target), draft_vocab)
        if shipped is not None:
            return shipped
        spec = "random"
    if str(spec) == "random":
        source = random_drafter_for(Path(target))
        return apply_draft_vocab(source, source, Path(target), draft_vocab)
    from .models import resolve_model

    source = Path(resolve_model(spec))
    return apply_draft_vocab(source, with_vocab(source, Path(target)), Path(target), draft_vocab)
