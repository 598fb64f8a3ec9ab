"""TfM: the w-wide heap whose candidates a Weaver scores given each path, and the Weaver's state a
step needs.

Method: Trees from Marginals (arXiv 2607.06763; docs/design.md §5): the Weaver re-scores the drafter's
top-K candidates of the next depth given the path so far, from the draft's prefix (the target's final
hidden state at the last committed token, the drafter's block states) and the path's steps
(``decode.weaver``). The target's state is known after a verification: a generation's first step,
and any step of an engine without a loaded Weaver, drafts DDTree over the marginals instead.
``WeaverMethod`` holds that state for TfM and DARTree (``dartree.py``); ``load_weaver`` loads a
Weaver for the engine's pair.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from ..tree import Tree, build_ddtree
from .base import WEAVER_HOW, DraftMethod, marginal_tree

if TYPE_CHECKING:
    from ..weaver import TfmDrafter


class WeaverMethod(DraftMethod):
    """A method whose trees the Weaver scores (``weaver`` a ``weaver.TfmDrafter``; None: an engine whose
    drafter never drafts). ``h_target``: float32 ``[target_hidden]``, the target's final hidden state at
    the last committed token (``accept``), None at a generation's start."""

    def __init__(self, top_k: int = 8, width: int = 4, weaver: TfmDrafter | None = None):
        super().__init__(top_k, width, weaver)
        self.weaver = weaver
        self.h_target: np.ndarray | None = None

    def prepare(self, target) -> None:
        """The target keeps its final hidden states (the Weaver's prefix) while a Weaver is loaded."""
        target.set_final_hidden(self.weaver is not None)

    def begin(self) -> None:
        """The target's state is unknown until the first verification (its step drafts DDTree)."""
        self.h_target = None

    def accept(self, target, node: int) -> None:
        """The target's final hidden state at the committed ``node``: the next draft's prefix starts there."""
        if self.weaver is not None:
            self.h_target = target.final_hidden(node)

    def draft(self, drafter, last: int, pos: int, budget: int, clock, path_logp: bool = True) -> Tree:
        """The Weaver's tree (``weave``) from the drafter's top-K candidates of the whole block and its
        hidden states (``DFlashDrafter.top_k_hidden``, K the Weaver's); DDTree over the marginals
        ``[D, top_k]`` while the target's state is unknown."""
        if self.weaver is None or self.h_target is None:
            return marginal_tree(drafter, build_ddtree, self.top_k, last, pos, budget, clock)
        cand, logp, hidden = drafter.top_k_hidden(last, pos, drafter.block_size - 1, self.weaver.top_k)
        clock.mark("drafter")
        return self.weave(last, cand, logp, hidden, budget)

    def weave(self, last: int, cand: np.ndarray, logp: np.ndarray, hidden: np.ndarray, budget: int) -> Tree:
        """The tree of ``budget`` drafted nodes the Weaver scores: cand int64 ``[D, K]``, logp float64
        ``[D, K]`` (the drafter's log-probabilities), hidden float32 ``[D, drafter_hidden]``."""
        raise NotImplementedError


class TfM(WeaverMethod):
    """The TfM tree: the w-wide heap scored by the Weaver (``weaver.TfmDrafter.tree``; its own width)."""

    name = "tfm"

    @classmethod
    def check_options(cls, weaver: bool) -> None:
        """Raises ValueError without a Weaver."""
        if not weaver:
            raise ValueError(f'tree="{cls.name}" needs a Weaver: {WEAVER_HOW}')

    def weave(self, last, cand, logp, hidden, budget) -> Tree:
        return self.weaver.tree(last, self.h_target, cand, logp, hidden, budget)


def load_weaver(path: str | os.PathLike, target_path: str | os.PathLike, target, drafter, on_gpu: bool,
                n_threads: int | None, timing: dict) -> tuple[TfmDrafter, dict[str, float]]:
    """The ``weaver.TfmDrafter`` of a Weaver GGUF for ``target`` (a ``verify.Target`` of the GGUF
    ``target_path``) and ``drafter``, and
    the ms a tree took on each device tried (GPU machines: ``weaver.fastest_weaver`` with ``timing``,
    ``DraftMethod.weaver_timing``, keeps the faster device).

    Raises:
        ValueError: its sizes, target or vocabulary do not fit this pair (one line naming each mismatch).
        GGUFError: an unreadable file. NativeError: no device can load it.
    """
    from ...files.drafters import file_key
    from ..weaver import TargetEmbeddings, TfmDrafter, fastest_weaver

    # on a GPU machine the Weaver's small rounds may run faster on the host: the faster is kept; a
    # round's ops are too small for many threads (a round of 1 path on 2 cores: 0.23 ms on 1, 0.12 on 2;
    # 4 is a guess beyond that, unmeasured)
    threads = min(n_threads or os.cpu_count() or 1, 4)
    w, ms = fastest_weaver(path, ("gpu", "cpu") if on_gpu else ("cpu",), threads, **timing)
    n_vocab = target.model.n_vocab
    want = {"target_hidden": target.model.n_embd, "drafter_hidden": drafter.model.n_embd,
            "depth": drafter.block_size - 1}
    bad = [f"{k} {w.shape[k]} (here {v})" for k, v in want.items() if w.shape[k] != v]
    if w.identity.get("target_key"):
        other_target = w.identity["target_key"] != file_key(target_path)
    else:  # a file without the cheap key: the whole target's sha256 (seconds for a GB)
        from ...files.atomic import sha256_file

        other_target = w.identity["target_sha256"] != sha256_file(target_path)
    if other_target:
        bad.append(f"target {w.identity['target_name'] or '?'} (not {os.path.basename(str(target_path))})")
    if w.shape["top_k"] > n_vocab:
        bad.append(f"{w.shape['top_k']} candidates a position (the vocabulary has {n_vocab})")
    if w.identity["n_vocab"] != n_vocab:
        bad.append(f"a vocabulary of {w.identity['n_vocab']} (here {n_vocab})")
    if bad:
        w.close()
        raise ValueError(f"the Weaver {path} was trained for another pair: {', '.join(bad)}")
    return TfmDrafter(w, TargetEmbeddings(target_path)), ms
