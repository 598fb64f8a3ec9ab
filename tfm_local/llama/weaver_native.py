"""cffi bindings (ABI mode) for the Weaver and DARTree C API (``ggml_ops/src/tfm-weaver.h``).

The Weaver is a unit of its own in the patched libllama, with its own version
(``tfm_weaver_api_version``, checked at load against :data:`WEAVER_API_VERSION`): its GGUF loader, q
for batches of paths over a kept prefix, the node store, and DARTree built on its backend. The library
is opened as :mod:`.native` opens it (:func:`.native.open_library`); a failure raises
:class:`.native.NativeError`.
"""
from __future__ import annotations

import functools

import numpy as np

from .native import NativeError, open_library

#: tfm_weaver_api_version() of the library this module binds (TFM_WEAVER_API_VERSION of tfm-weaver.h).
WEAVER_API_VERSION = 1

_CDEF = """
int32_t tfm_weaver_api_version(void);
void * tfm_weaver_load(const char * path, int32_t device, int32_t n_threads);
void tfm_weaver_free(void * w);
int32_t tfm_weaver_shape(const void * w, int32_t * out);
int32_t tfm_weaver_q(void * w, int32_t n_drafts, const float * h_target, const float * h_drafter, int32_t n_paths,
                     const int32_t * path_draft, const int32_t * path_len, const float * step_emb, float * q_out);
int32_t tfm_weaver_prefix(void * w, int32_t n_drafts, const float * h_target, const float * h_drafter);
int32_t tfm_weaver_steps(void * w, int32_t n_paths, const int32_t * path_draft, const int32_t * path_len,
                         const float * step_emb, float * q_out);
int32_t tfm_weaver_nodes_begin(void * w, const float * h_target, const float * h_drafter, int32_t max_nodes);
int32_t tfm_weaver_nodes_add(void * w, int32_t n, const int32_t * parent, const float * step_emb, float * q_out);
int32_t tfm_weaver_attach_target(void * w, const char * target_path);
int32_t tfm_weaver_dartree(void * w, const float * h_target, const float * h_drafter, int32_t n_depth, int32_t top_k,
                           const int32_t * cand, const float * cand_logit, int32_t root, int32_t width, int32_t budget,
                           float beta, int32_t * live, float * live_score, int32_t * sel, float * sel_score);
int32_t tfm_weaver_dartree_graphs(const void * w);
"""


@functools.lru_cache(maxsize=1)
def lib():
    """Return ``(ffi, lib)`` for the patched libllama's tfm-weaver.h API; raises NativeError when unusable."""
    return open_library(_CDEF, "tfm_weaver_api_version", WEAVER_API_VERSION)


#: tfm-weaver.h's limits of one DARTree on the backend (``tfm_weaver_dartree`` returns -4 beyond them): its live
#: branches a depth (the graph's masks grow as width², a depth), candidates a branch, children in all; and
#: how many graphs (one per shape) a Weaver keeps, the least recently used freed first.
DARTREE_MAX_WIDTH = 256
DARTREE_MAX_TOP_K = 1024
DARTREE_MAX_NODES = 1 << 22
DARTREE_GRAPHS = 8

def weaver_load(path: str, device: int, n_threads: int):
    """A loaded Weaver GGUF on the CPU (``device`` 0) or the first GPU (1): a cffi handle freed when
    collected; raises NativeError when the file or device cannot be used."""
    ffi, h = lib()
    w = h.tfm_weaver_load(str(path).encode(), int(device), int(n_threads))
    if w == ffi.NULL:
        raise NativeError(f"cannot load the Weaver {path} on {'the CPU' if device == 0 else 'the GPU'} "
                          "(not a tfm-weaver GGUF, a tensor missing, or no such device)")
    return ffi.gc(w, h.tfm_weaver_free)


def weaver_shape(w) -> dict:
    """The sizes of a loaded Weaver (``WeaverConfig`` names)."""
    ffi, h = lib()
    out = ffi.new("int32_t[9]")
    h.tfm_weaver_shape(w, out)
    names = ("target_hidden", "drafter_hidden", "depth", "top_k", "width", "layers", "heads", "ffn", "rank")
    return dict(zip(names, (int(v) for v in out)))


def weaver_q(w, shape: dict, h_target: np.ndarray, h_drafter: np.ndarray, path_draft: np.ndarray,
             path_len: np.ndarray, step_emb: np.ndarray) -> np.ndarray:
    """q ``[n_paths, rank]`` float32 of each path's last step (tfm-weaver.h, ``tfm_weaver_q``: the prefix, kept
    for ``weaver_steps``, then the steps); ``shape`` the Weaver's (``weaver_shape``). Raises ValueError for
    inputs that do not fit (checked before the kept prefix is replaced) or that the library refuses,
    NativeError when the backend fails."""
    ht, hd = _prefix_inputs(shape, h_target, h_drafter)
    _steps_inputs(shape, path_draft, path_len, step_emb, ht.shape[0])
    weaver_prefix(w, shape, ht, hd)
    return weaver_steps(w, shape, path_draft, path_len, step_emb)


def _prefix_inputs(shape: dict, h_target, h_drafter) -> tuple[np.ndarray, np.ndarray]:
    """h_target ``[n_drafts, target_hidden]`` and h_drafter ``[n_drafts, depth, drafter_hidden]`` as
    contiguous float32; ValueError when they do not fit the Weaver ``shape`` or each other."""
    ht = np.ascontiguousarray(h_target, dtype=np.float32)
    hd = np.ascontiguousarray(h_drafter, dtype=np.float32)
    n = ht.shape[0] if ht.ndim == 2 else -1
    if ht.shape != (n, shape["target_hidden"]) or hd.shape != (n, shape["depth"], shape["drafter_hidden"]):
        raise ValueError(f"Weaver prefix of shapes {ht.shape}, {hd.shape} does not fit a Weaver of target_hidden "
                         f"{shape['target_hidden']}, depth {shape['depth']}, drafter_hidden {shape['drafter_hidden']}")
    return ht, hd


def _steps_inputs(shape: dict, path_draft, path_len, step_emb, n_drafts: int | None = None):
    """path_draft, path_len (int32 ``[n_paths]``) and step_emb (float32 ``[sum(path_len), target_hidden]``),
    contiguous; ValueError when they do not fit each other, the Weaver ``shape`` or ``n_drafts`` drafts."""
    pd = np.ascontiguousarray(path_draft, dtype=np.int32)
    pl = np.ascontiguousarray(path_len, dtype=np.int32)
    se = np.ascontiguousarray(step_emb, dtype=np.float32)
    if (len(pd) != len(pl) or len(pd) < 1 or se.ndim != 2 or se.shape[0] != int(pl.sum())
            or se.shape[1] != shape["target_hidden"]):
        raise ValueError(f"{len(pd)} paths, {len(pl)} lengths summing to {int(pl.sum())}, step rows of shape {se.shape}")
    if n_drafts is not None and (pd.min() < 0 or pd.max() >= n_drafts):
        raise ValueError(f"paths of drafts {pd.min()}..{pd.max()}, {n_drafts} drafts given")
    return pd, pl, se


def weaver_prefix(w, shape: dict, h_target: np.ndarray, h_drafter: np.ndarray) -> None:
    """Compute and keep the drafts' prefix keys and values (``tfm_weaver_prefix``): h_target
    ``[n_drafts, target_hidden]``, h_drafter ``[n_drafts, depth, drafter_hidden]`` float32; ``shape`` the
    Weaver's. ValueError for inputs that do not fit, NativeError when the backend fails."""
    ffi, h = lib()
    ht, hd = _prefix_inputs(shape, h_target, h_drafter)
    r = h.tfm_weaver_prefix(w, ht.shape[0], ffi.cast("float *", ht.ctypes.data), ffi.cast("float *", hd.ctypes.data))
    if r == -1:
        raise ValueError("tfm_weaver_prefix refused its inputs")
    if r < 0:
        raise NativeError(f"tfm_weaver_prefix failed ({r})")


def weaver_steps(w, shape: dict, path_draft: np.ndarray, path_len: np.ndarray, step_emb: np.ndarray) -> np.ndarray:
    """q ``[n_paths, rank]`` float32 of each path's last step over the kept prefix (``tfm_weaver_steps``);
    ``shape`` the Weaver's. Raises ValueError for inputs that do not fit or that the library refuses (no
    prefix kept, a draft beyond it, a length out of range), NativeError when the backend fails."""
    ffi, h = lib()
    pd, pl, se = _steps_inputs(shape, path_draft, path_len, step_emb)
    out = np.empty((len(pd), shape["rank"]), dtype=np.float32)
    f = lambda a, t: ffi.cast(t, a.ctypes.data)  # noqa: E731
    r = h.tfm_weaver_steps(w, len(pd), f(pd, "int32_t *"), f(pl, "int32_t *"), f(se, "float *"), f(out, "float *"))
    if r == -1:
        raise ValueError("tfm_weaver_steps refused its inputs (no prefix kept, or a path's draft or length out of range)")
    if r < 0:
        raise NativeError(f"tfm_weaver_steps failed ({r})")
    return out


def weaver_nodes_begin(w, shape: dict, h_target: np.ndarray, h_drafter: np.ndarray, max_nodes: int) -> None:
    """Begin one draft's tree node by node (``tfm_weaver_nodes_begin``): its prefix (h_target
    ``[target_hidden]``, h_drafter ``[depth, drafter_hidden]`` float32) computed and kept, and a store of
    ``max_nodes`` nodes emptied; ``shape`` the Weaver's. ValueError for inputs that do not fit,
    NativeError when the backend fails."""
    ffi, h = lib()
    ht, hd = _prefix_inputs(shape, np.asarray(h_target)[None], np.asarray(h_drafter)[None])
    if int(max_nodes) < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    r = h.tfm_weaver_nodes_begin(w, ffi.cast("float *", ht.ctypes.data), ffi.cast("float *", hd.ctypes.data),
                                 int(max_nodes))
    if r == -1:
        raise ValueError("tfm_weaver_nodes_begin refused its inputs")
    if r < 0:
        raise NativeError(f"tfm_weaver_nodes_begin failed ({r})")


def weaver_nodes_add(w, shape: dict, parent: np.ndarray, step_emb: np.ndarray) -> np.ndarray:
    """q ``[n, rank]`` float32 of ``n`` new nodes of the tree begun by ``weaver_nodes_begin``
    (``tfm_weaver_nodes_add``): parent int ``[n]`` (an earlier node, these included, or -1 for the root
    step), step_emb float32 ``[n, target_hidden]``. Raises ValueError for inputs that do not fit or that
    the library refuses (no tree begun or its prefix replaced, the store full, a parent out of range, a
    path longer than the depth), NativeError when the backend fails."""
    ffi, h = lib()
    par = np.ascontiguousarray(parent, dtype=np.int32)
    se = np.ascontiguousarray(step_emb, dtype=np.float32)
    if par.ndim != 1 or len(par) < 1 or se.shape != (len(par), shape["target_hidden"]):
        raise ValueError(f"{par.shape} parents and step rows of shape {se.shape} (want [n, {shape['target_hidden']}])")
    out = np.empty((len(par), shape["rank"]), dtype=np.float32)
    r = h.tfm_weaver_nodes_add(w, len(par), ffi.cast("int32_t *", par.ctypes.data), ffi.cast("float *", se.ctypes.data),
                               ffi.cast("float *", out.ctypes.data))
    if r == -1:
        raise ValueError("tfm_weaver_nodes_add refused its inputs (no tree begun or its prefix replaced, the store "
                         "full, a parent out of range, or a path longer than the depth)")
    if r < 0:
        raise NativeError(f"tfm_weaver_nodes_add failed ({r})")
    return out


def weaver_attach_target(w, target: str) -> None:
    """Load the codes table onto the Weaver's backend and compute every token's step input from the target
    GGUF's token embeddings into a table kept there (``tfm_weaver_attach_target``), for ``weaver_dartree``.
    Raises ValueError when the target's embeddings do not fit the Weaver (width, vocabulary) or cannot be
    read, NativeError when the backend fails."""
    _, h = lib()
    r = h.tfm_weaver_attach_target(w, str(target).encode())
    if r == -1:
        raise ValueError(f"the Weaver cannot use the embeddings of {target} (no token_embd.weight of its width "
                         "and vocabulary, or an unreadable file)")
    if r < 0:
        raise NativeError(f"tfm_weaver_attach_target failed ({r})")


def dartree_rows(n_depth: int, top_k: int, width: int) -> list[int]:
    """Live branches of each DARTree round on the backend: 1 (the root), then min(width, top_k × the last)."""
    rows = [1]
    for _ in range(1, n_depth):
        rows.append(min(width, top_k * rows[-1]))
    return rows[:n_depth]


def weaver_dartree(w, shape: dict, h_target: np.ndarray, h_drafter: np.ndarray, root: int, cand: np.ndarray,
                   cand_logit: np.ndarray, width: int, budget: int, beta: float):
    """One draft's DARTree built on the Weaver's backend in one call (``tfm_weaver_dartree``; needs
    ``weaver_attach_target``). h_target ``[target_hidden]``, h_drafter ``[depth, drafter_hidden]``,
    cand int ``[n_depth, top_k]`` (target ids), cand_logit float ``[n_depth, top_k]``.

    Returns:
        (live int32 ``[n_live]``, live_score float32 ``[n_live]``, sel int32 ``[B]``, sel_score float32 ``[B]``):
        as tfm-weaver.h describes; ``dartree_rows`` gives each round's share of ``live``.
    Raises:
        ValueError: inputs that do not fit the Weaver or that the library refuses (no target attached, a token
        out of range, beta > 0). NativeError: the backend fails.
    """
    ffi, h = lib()
    ht, hd = _prefix_inputs(shape, np.asarray(h_target)[None], np.asarray(h_drafter)[None])
    c = np.ascontiguousarray(cand, dtype=np.int32)
    cl = np.ascontiguousarray(cand_logit, dtype=np.float32)
    if c.ndim != 2 or c.shape != cl.shape or not 1 <= c.shape[0] <= shape["depth"] or c.shape[1] < 1:
        raise ValueError(f"candidates of shape {c.shape} and logits of shape {cl.shape} (want [n_depth <= "
                         f"{shape['depth']}, top_k], both)")
    if int(width) < 1 or int(budget) < 1 or not float(beta) <= 0:
        raise ValueError(f"width {width} and budget {budget} must be >= 1, beta {beta} <= 0")
    D, K = c.shape
    check_dartree_size(int(width), K, D)
    n_live = sum(dartree_rows(D, K, int(width))[1:])
    n_total = K * sum(dartree_rows(D, K, int(width)))
    B = min(int(budget), n_total)
    live, live_score = np.empty(n_live, np.int32), np.empty(n_live, np.float32)
    sel, sel_score = np.empty(B, np.int32), np.empty(B, np.float32)
    f = lambda a, t: ffi.cast(t, a.ctypes.data)  # noqa: E731
    r = h.tfm_weaver_dartree(w, f(ht, "float *"), f(hd, "float *"), D, K, f(c, "int32_t *"), f(cl, "float *"),
                             int(root), int(width), int(budget), float(beta), f(live, "int32_t *"),
                             f(live_score, "float *"), f(sel, "int32_t *"), f(sel_score, "float *"))
    if r == -1:
        raise ValueError("tfm_weaver_dartree refused its inputs (no target attached, a token out of range, or beta > 0)")
    if r == -4:
        raise ValueError(f"tfm_weaver_dartree refused a tree above its limits (width {width} <= {DARTREE_MAX_WIDTH}, "
                         f"top_k {K} <= {DARTREE_MAX_TOP_K}, {n_total} children <= {DARTREE_MAX_NODES})")
    if r < 0:
        raise NativeError(f"tfm_weaver_dartree failed ({r})")
    return live, live_score, sel, sel_score


def check_dartree_size(width: int, top_k: int, n_depth: int) -> None:
    """ValueError naming the limit when a DARTree of ``width`` live branches a depth, ``top_k`` candidates a
    branch and ``n_depth`` depths is beyond what the backend builds (``DARTREE_MAX_WIDTH`` and the others)."""
    if not 1 <= width <= DARTREE_MAX_WIDTH:
        raise ValueError(f"DARTree width {width} is outside 1..{DARTREE_MAX_WIDTH} (its backend graph's masks grow "
                         "as width squared)")
    if not 1 <= top_k <= DARTREE_MAX_TOP_K:
        raise ValueError(f"DARTree top_k {top_k} is outside 1..{DARTREE_MAX_TOP_K}")
    n_total = top_k * sum(dartree_rows(n_depth, top_k, width))
    if n_total > DARTREE_MAX_NODES:
        raise ValueError(f"a DARTree of {n_total} children (depth {n_depth}, top_k {top_k}, width {width}) is above "
                         f"the backend's {DARTREE_MAX_NODES}")


def weaver_dartree_graphs(w) -> int:
    """How many DARTree graphs (one per shape) the Weaver keeps on its backend: at most ``DARTREE_GRAPHS``."""
    _, h = lib()
    return int(h.tfm_weaver_dartree_graphs(w))
