"""The Weaver at run time (Trees from Marginals, arXiv 2607.06763): a Weaver GGUF
(``tfm_local.files.weaver``) computed on the ggml backend through our C API (``tfm_weaver_q``), and the
candidates' scores from its codes table on the host.

One call scores the candidates of the next depth for a batch of paths (a round of the w-wide heap):
the backend computes q ``[n_paths, rank]`` from the draft's prefix (the target's final hidden state,
the drafter's block states; its keys and values computed once a tree and kept on the backend) and each
path's steps (the target's embeddings of the root and the path's tokens; each path's keys and values
kept too, so that a round computes one row a new path: ``Weaver.nodes_add``); the host adds ``codes[c] · q``
to the drafter's logit of each candidate c (K rows of the table).
``TfmDrafter`` is what the "tfm" and "dartree" methods hold (``methods.tfm``). The reference model,
its training and the trees it drives: ``tfm_local/train/weaver.py``, ``weaver_fit.py``, ``weaver_eval.py``.
"""
from __future__ import annotations

import os
import weakref

import numpy as np

from ..files.gguf_meta import GGUFError, read_gguf_meta
from ..files.weaver import read_weaver_codes
from ..llama import weaver_native
from .tree import Tree, build_dartree, build_tfm, dartree_from_rounds


class Weaver:
    """A loaded Weaver.

    Args:
        path: Weaver GGUF. device: ``"cpu"`` or ``"gpu"`` (the first GPU). n_threads: CPU threads
            (default: all cores).
    Attributes:
        shape: its sizes (``WeaverConfig`` names). codes: float32 ``[n_vocab, rank]`` (host). device: as given.
        identity: the pair it was trained for (``WeaverFile.identity``).
    Raises:
        GGUFError: not a readable Weaver GGUF. NativeError: the backend cannot load it.
    """

    def __init__(self, path: str | os.PathLike, device: str = "cpu", n_threads: int | None = None):
        if device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
        self.codes, self.identity = read_weaver_codes(path)
        self.device = device
        self._w = weaver_native.weaver_load(str(path), 0 if device == "cpu" else 1, n_threads or os.cpu_count() or 1)
        self.shape = weaver_native.weaver_shape(self._w)
        self._owner: weakref.ref | None = None  # whose prefix the backend keeps (``steps``)
        self._tree: weakref.ref | None = None   # whose node store it keeps (``nodes_begin``)

    def q(self, h_target: np.ndarray, h_drafter: np.ndarray, path_draft: np.ndarray, path_len: np.ndarray,
          step_emb: np.ndarray) -> np.ndarray:
        """q of each path's last step, float32 ``[n_paths, rank]``.

        Args:
            h_target: ``[n_drafts, target_hidden]``; h_drafter: ``[n_drafts, depth, drafter_hidden]``.
            path_draft / path_len: int ``[n_paths]`` (draft index; steps, 1..depth).
            step_emb: ``[sum(path_len), target_hidden]``, the paths' steps one path after another.
        Raises:
            ValueError: shapes that do not fit the Weaver or each other.
        """
        self._owner = self._tree = None
        return weaver_native.weaver_q(self._w, self.shape, h_target, h_drafter, path_draft, path_len, step_emb)

    def steps(self, owner: object, h_target: np.ndarray, h_drafter: np.ndarray, path_len: np.ndarray,
              step_emb: np.ndarray) -> np.ndarray:
        """q of each path's last step for paths of one draft, float32 ``[n_paths, rank]``: the draft's prefix
        (h_target ``[target_hidden]``, h_drafter ``[depth, drafter_hidden]``) is computed on the backend
        once and kept while the same ``owner`` (one tree's scorer) calls again; each call then computes
        only its paths' steps (``tfm_weaver_prefix`` / ``tfm_weaver_steps``). path_len and step_emb as
        in ``q``. Raises ValueError for shapes that do not fit."""
        if self._owner is None or self._owner() is not owner:
            self._owner = self._tree = None
            weaver_native.weaver_prefix(self._w, self.shape, np.asarray(h_target)[None], np.asarray(h_drafter)[None])
            self._owner = weakref.ref(owner)  # not a strong reference: no cycle through the owner's .w
        return weaver_native.weaver_steps(self._w, self.shape, np.zeros(len(path_len), np.int32), path_len, step_emb)

    def nodes_begin(self, owner: object, h_target: np.ndarray, h_drafter: np.ndarray, max_nodes: int) -> None:
        """Begin one draft's tree node by node for ``owner`` (its scorer): the prefix (h_target
        ``[target_hidden]``, h_drafter ``[depth, drafter_hidden]``) and an empty store of ``max_nodes``
        nodes on the backend (``tfm_weaver_nodes_begin``). Raises ValueError for shapes that do not fit."""
        self._owner = self._tree = None
        weaver_native.weaver_nodes_begin(self._w, self.shape, h_target, h_drafter, max_nodes)
        self._tree = weakref.ref(owner)

    def nodes_add(self, owner: object, parent: np.ndarray, step_emb: np.ndarray) -> np.ndarray:
        """q ``[n, rank]`` float32 of ``n`` new nodes of ``owner``'s tree: parent int ``[n]`` (an earlier node
        index, these included, -1 for the root step), step_emb ``[n, target_hidden]`` (``tfm_weaver_nodes_add``:
        each node's keys and values are kept, so a round computes its new nodes only).
        Raises RuntimeError when another tree (or ``q`` / ``steps``) took the backend since ``owner``'s
        ``nodes_begin``, ValueError for inputs that do not fit or a full store."""
        if self._tree is None or self._tree() is not owner:
            raise RuntimeError("the Weaver's node store belongs to another tree: call nodes_begin first")
        return weaver_native.weaver_nodes_add(self._w, self.shape, parent, step_emb)

    def scores(self, q: np.ndarray, cand: np.ndarray, cand_logit: np.ndarray) -> np.ndarray:
        """Corrected logits ``[n_paths, K]``: ``cand_logit + codes[cand] · q`` (cand int ``[n_paths, K]``)."""
        return np.asarray(cand_logit, np.float32) + np.einsum("pkr,pr->pk", self.codes[cand], q)

    def attach_target(self, target: str | os.PathLike) -> None:
        """Make ``dartree`` ready: the codes table onto the backend and every token's step input from the target
        GGUF's embeddings into a table there (``tfm_weaver_attach_target``; a vocabulary's rows at load, not
        per tree). Raises ValueError when the target does not fit the Weaver, NativeError when the backend fails."""
        self.attached = None  # a failed attach frees what an earlier one made
        weaver_native.weaver_attach_target(self._w, str(target))
        self.attached = str(target)

    attached: str | None = None  #: the target ``attach_target`` read, None before

    def dartree(self, root: int, h_target: np.ndarray, h_drafter: np.ndarray, cand: np.ndarray,
                cand_logit: np.ndarray, budget: int, width: int = 12, beta: float = -0.2) -> Tree | None:
        """One draft's DARTree built on the backend in one call (``tfm_weaver_dartree``: the supertree, its
        scores and the global top-B stay there; the host renumbers the B selected nodes,
        ``tree.dartree_from_rounds``). The tree ``tree.build_dartree`` builds with ``WeaverPaths`` on the same
        inputs, up to float32 rounding (ties between candidates whose scores are equal in float32 may go
        either way). Arguments as ``TfmDrafter.dartree``; needs ``attach_target``.

        Returns:
            the tree, or None when the selection is not prefix-closed (an exact parent-child tie at beta 0).
        Raises:
            ValueError: no target attached, or inputs that do not fit. NativeError: the backend fails.
        """
        if self.attached is None:
            raise ValueError("Weaver.dartree needs attach_target(target) first")
        cand = np.asarray(cand)
        live, live_score, sel, sel_score = weaver_native.weaver_dartree(self._w, self.shape, h_target, h_drafter, root,
                                                                        cand, cand_logit, width, budget, beta)
        rows = weaver_native.dartree_rows(cand.shape[0], cand.shape[1], width)
        return dartree_from_rounds(int(root), cand, rows, live, live_score, sel, sel_score)

    def close(self) -> None:
        """Free the backend's copy (idempotent)."""
        self._w = self._owner = self._tree = None


class TargetEmbeddings:
    """Rows of the target's token embedding table (``token_embd.weight``), dequantized on demand from the
    memory-mapped GGUF and kept: a Weaver step is the target's embedding of its token.

    Raises:
        GGUFError: an unreadable GGUF or one without ``token_embd.weight``.
    """

    def __init__(self, target: str | os.PathLike):
        import mmap

        import gguf

        meta = read_gguf_meta(target)
        e = next((t for t in meta.tensors if t.name == "token_embd.weight"), None)
        if e is None:
            raise GGUFError(f"{target} has no token_embd.weight")
        self.path = str(target)
        self.n_embd, self.n_vocab = int(e.ne[0]), int(e.ne[1])
        self._qt = gguf.GGMLQuantizationType(e.ggml_type)
        self._row = e.nbytes // self.n_vocab
        self._begin = e.begin
        self._file = open(target, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._rows: dict[int, np.ndarray] = {}

    def __call__(self, ids) -> np.ndarray:
        """float32 ``[len(ids), n_embd]``. Raises IndexError for an id outside the vocabulary."""
        import gguf

        out = np.empty((len(ids), self.n_embd), dtype=np.float32)
        for i, t in enumerate(ids):
            t = int(t)
            row = self._rows.get(t)
            if row is None:
                if not 0 <= t < self.n_vocab:
                    raise IndexError(f"token {t} outside the vocabulary of {self.n_vocab}")
                raw = np.frombuffer(self._map, dtype=np.uint8, count=self._row, offset=self._begin + t * self._row)
                row = self._rows[t] = np.asarray(gguf.quants.dequantize(raw[None], self._qt), np.float32).reshape(-1)
            out[i] = row
        return out


class WeaverPaths:
    """The ``tree.PathScorer`` of one draft: the Weaver's log-probabilities of the next depth's K
    candidates for each path, in one backend call per round (the draft's prefix computed at the first).

    Args:
        weaver: the loaded Weaver. embed: ``TargetEmbeddings`` of its target. root: the last emitted token.
        h_target: float32 ``[target_hidden]``; h_drafter: ``[depth, drafter_hidden]`` (module doc).
        cand: int ``[depth, K]`` the drafter's candidates; cand_logit: float ``[depth, K]`` their logits.
        capacity: the most paths (the root's included) the tree will score: each becomes a node whose keys
            and values the backend keeps, so a round computes one row a new path
            (``Weaver.nodes_add``); None, or more paths than that, computes every path's steps each round
            (``Weaver.steps``).
    """

    def __init__(self, weaver: Weaver, embed: TargetEmbeddings, root: int, h_target: np.ndarray,
                 h_drafter: np.ndarray, cand: np.ndarray, cand_logit: np.ndarray, capacity: int | None = None):
        self.w, self.embed, self.root = weaver, embed, int(root)
        self.ht, self.hd = np.asarray(h_target, np.float32), np.asarray(h_drafter, np.float32)
        self.cand, self.logit = np.asarray(cand), np.asarray(cand_logit, np.float32)
        self.capacity = capacity
        self._node: dict[tuple[int, ...], int] | None = None  # path -> node index in the backend's store
        self._q: list[np.ndarray] = []                        # q of each node

    def _token(self, path: tuple[int, ...]) -> int:
        """The token of a path's last step: the root's for ``()``, else its last candidate's."""
        return self.root if not path else int(self.cand[len(path) - 1, path[-1]])

    def _node_q(self, paths: list[tuple[int, ...]]) -> np.ndarray | None:
        """q ``[n_paths, rank]`` from the node store (the paths and their prefixes added as nodes, parents
        first), or None when they would not fit its capacity (the caller then computes steps)."""
        if self._node is None:
            self.w.nodes_begin(self, self.ht, self.hd, self.capacity)
            self._node = {}
        new = sorted({p[:j] for p in paths for j in range(len(p) + 1)} - self._node.keys(), key=len)
        if len(self._node) + len(new) > self.capacity:
            return None
        if new:
            index = {p: len(self._node) + i for i, p in enumerate(new)}
            parent = [-1 if not p else self._node.get(p[:-1], index.get(p[:-1])) for p in new]
            self._q.extend(self.w.nodes_add(self, np.array(parent), self.embed([self._token(p) for p in new])))
            self._node.update(index)
        return np.stack([self._q[self._node[p]] for p in paths])

    def __call__(self, paths: list[tuple[int, ...]]) -> np.ndarray:
        q = self._node_q(paths) if self.capacity else None
        if q is None:
            self.capacity = None  # past the store's capacity: every path's steps from here on
            ids = [self._token(p[:j]) for p in paths for j in range(len(p) + 1)]
            q = self.w.steps(self, self.ht, self.hd, np.array([len(p) + 1 for p in paths]), self.embed(ids))
        depth = np.array([len(p) for p in paths])
        z = self.w.scores(q, self.cand[depth], self.logit[depth]).astype(np.float64)
        m = z.max(1, keepdims=True)
        return z - (m + np.log(np.exp(z - m).sum(1, keepdims=True)))


def tfm_tree(weaver: Weaver, embed: TargetEmbeddings, root: int, h_target: np.ndarray, h_drafter: np.ndarray,
             cand: np.ndarray, cand_logit: np.ndarray, budget: int, width: int | None = None,
             children: int = 8) -> Tree:
    """A TfM tree of ``budget`` drafted nodes for one draft (``tree.build_tfm`` with ``WeaverPaths``);
    ``width`` None = ⌈budget/16⌉ (the paper's)."""
    score = WeaverPaths(weaver, embed, root, h_target, h_drafter, cand, cand_logit, capacity=budget + 1)
    return build_tfm(root, np.asarray(cand), budget, score, width or -(-budget // 16), children)


def _tree_ms(w: Weaver, budget: int, repeats: int, target: str | None = None) -> float:
    """Median milliseconds of a tree of ``budget`` nodes over random drafts of ``w``'s shape (one warm-up):
    a TfM tree, or with ``target`` a DARTree built on the backend (``Weaver.dartree``, after
    ``attach_target``: the table of step inputs is built first, untimed)."""
    import time

    s, rng = w.shape, np.random.default_rng(0)
    D, K = s["depth"], s["top_k"]
    cand = np.stack([rng.choice(w.codes.shape[0], K, replace=False) for _ in range(D)])
    logit = -np.sort(rng.exponential(size=(D, K)), 1)
    ht = rng.standard_normal(s["target_hidden"]).astype(np.float32)
    hd = rng.standard_normal((D, s["drafter_hidden"])).astype(np.float32)
    emb = lambda ids: np.ones((len(ids), s["target_hidden"]), np.float32)  # noqa: E731 (timing only)
    if target is not None:
        try:
            w.attach_target(target)
        except ValueError:  # a target this Weaver does not fit: time TfM, the pair check names the mismatch
            target = None
    runs = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        if target is not None:
            w.dartree(0, ht, hd, cand, logit, budget)
        else:
            tfm_tree(w, emb, 0, ht, hd, cand, logit, budget)
        runs.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(runs[1:]))


def fastest_weaver(path: str | os.PathLike, devices: tuple[str, ...], n_threads: int | None = None,
                   budget: int = 16, repeats: int = 3, dartree_target: str | None = None) -> tuple[Weaver, dict[str, float]]:
    """The Weaver loaded on whichever of ``devices`` ("cpu", "gpu") builds a TfM tree of ``budget`` nodes
    fastest (with ``dartree_target``, the target GGUF: a DARTree of ``budget`` nodes built on the backend,
    ``Weaver.dartree``), and the median milliseconds a tree on each (random drafts of the Weaver's shape,
    one warm-up tree, then ``repeats``). A heap round is a small graph whose fixed costs (launches, a synchronisation,
    copies) can outweigh its arithmetic on a GPU: the first default-pair Weaver took 6-13 ms a tree on an
    H200 (docs/gpu.md). The others are closed; a device that cannot load it is skipped.

    Raises:
        ValueError: no device given. GGUFError / NativeError: as ``Weaver``, when no device
        can load it.
    """
    if not devices:
        raise ValueError("no device to load the Weaver on")
    if len(devices) == 1:
        return Weaver(path, devices[0], n_threads), {}
    times: dict[str, float] = {}
    loaded: dict[str, Weaver] = {}
    failed: Exception | None = None
    try:
        for dev in devices:
            try:
                w = loaded[dev] = Weaver(path, dev, n_threads)
            except Exception as e:  # e.g. no GPU backend for it: the other devices serve
                failed = e
                continue
            times[dev] = _tree_ms(w, budget, repeats, dartree_target)
    except BaseException:
        for w in loaded.values():
            w.close()
        raise
    if not times:
        raise failed
    best = min(times, key=times.get)
    for dev, w in loaded.items():
        if dev != best:
            w.close()
    return loaded[best], times


class TfmDrafter:
    """The Weaver's side of a TfM or DARTree step (``methods.tfm.WeaverMethod``, which keeps the target's
    state): the Weaver and the target's embedding rows.

    Args:
        weaver: the loaded Weaver. embed: the target's ``TargetEmbeddings``. width: entries popped a
            round (None = ⌈B/16⌉, the paper's). children: candidates a new node offers (the paper's 8).
    """

    def __init__(self, weaver: Weaver, embed: TargetEmbeddings, width: int | None = None, children: int = 8):
        self.weaver, self.embed, self.width, self.children = weaver, embed, width, children

    def attach(self) -> None:
        """Build DARTree trees on the Weaver's backend from here on (``Weaver.attach_target`` with this
        target; once). Raises as ``Weaver.attach_target``."""
        if self.weaver.attached is None:
            self.weaver.attach_target(self.embed.path)

    @property
    def top_k(self) -> int:
        """K, the drafter's candidates per block position the Weaver scores."""
        return self.weaver.shape["top_k"]

    def tree(self, root: int, h_target: np.ndarray, cand: np.ndarray, cand_logp: np.ndarray, hidden: np.ndarray,
             budget: int) -> Tree:
        """The TfM tree of ``budget`` drafted nodes (``tfm_tree``) given the target's final hidden state at
        the last committed token ``h_target`` float32 ``[target_hidden]``, from the drafter's candidates
        ``[D, K]`` (log-probabilities serve as its logits: the softmax over K is the same) and its hidden
        states ``[D, drafter_hidden]``."""
        return tfm_tree(self.weaver, self.embed, root, h_target, hidden, cand, cand_logp, budget,
                        self.width, self.children)

    def dartree(self, root: int, h_target: np.ndarray, cand: np.ndarray, cand_logp: np.ndarray, hidden: np.ndarray,
                budget: int, width: int = 12, beta: float = -0.2) -> Tree:
        """The DARTree tree of ``budget`` drafted nodes with the Weaver as its correction head
        (``tree.build_dartree``: ``width`` live branches a depth, depth bonus ``beta``; the paper's defaults):
        built on the Weaver's backend in one call once ``attach`` has run (``Weaver.dartree``), else on the
        host with one Weaver call a depth (``WeaverPaths``), as also on an exact parent-child tie. Raises
        ValueError for a width (or K) beyond the backend's limits (``weaver_native.check_dartree_size``), either way."""
        weaver_native.check_dartree_size(int(width), np.shape(cand)[1], len(cand))
        if self.weaver.attached is not None:
            tree = self.weaver.dartree(root, h_target, hidden, cand, cand_logp, budget, width, beta)
            if tree is not None:
                return tree
        score = WeaverPaths(self.weaver, self.embed, root, h_target, hidden, cand, cand_logp,
                            capacity=1 + width * len(cand))
        return build_dartree(root, np.asarray(cand), budget, score, width, beta)
