"""cffi bindings (ABI mode) for the runtime C API that our patch series adds to llama.cpp.

llama-cpp-python binds the public llama.h API and part of llama-ext.h; the rest of what the driver
needs is exported with C linkage by ``ggml_ops/src/tfm-ext.h`` and bound here: layer-input features,
the DFlash drafter's target layers and lattice, batch filling, tree mode, the backend top-k and token
samplers, graph keeping. The Weaver and DARTree (``tfm-weaver.h``) are bound in ``weaver_native``, the
op test/bench harness (``tfm-op-harness.h``) in ``tfm_local.testing.op_harness``; both open the library
through :func:`open_library`. The library is opened by soname (``libllama.so.0``) *after* ``llama_cpp``
has loaded it, so the process holds one copy of llama.cpp and ggml (opening by file path would load a
second one; see docs/design.md §2).
"""
from __future__ import annotations

import ctypes
import functools

import cffi
import numpy as np

#: tfm_api_version() of the library this module binds (tfm-ext.h; it covers the op harness too).
API_VERSION = 19

_CDEF = """
int32_t tfm_api_version(void);
void tfm_set_layer_inp(void * ctx, uint32_t il, bool value);
const float * tfm_get_layer_inp(void * ctx, uint32_t il);
const int32_t * tfm_model_target_layers(const void * model, uint32_t * n);
int32_t tfm_model_selector_top_k(const void * model);
void tfm_lattice_enable(void * ctx, bool on);
const float * tfm_lattice_get(void * ctx);
int32_t tfm_batch_tokens(void * batch, int32_t n, const int32_t * tokens, const int32_t * pos,
                         const int32_t * seq_ids, const int8_t * outputs);
int32_t tfm_batch_embd(void * batch, int32_t n, const float * rows, int32_t width, int32_t pos0);
bool tfm_tree_set(void * ctx, const int32_t * parents, uint32_t n_nodes);
bool tfm_tree_commit(void * ctx, const int32_t * keep, uint32_t n_keep);
int32_t tfm_topk_attach(void * ctx, int32_t k, int32_t n_rows);
int32_t tfm_topk_get(void * ctx, int32_t i0, int32_t n, int32_t k, int32_t * ids, float * logp);
bool tfm_context_keep_graphs(void * ctx, bool on);
int32_t tfm_sample_attach(void * ctx, float temp, int32_t top_k, float top_p, float min_p, uint64_t seed,
                          int32_t n_rows);
int32_t tfm_sample_set_seed(void * ctx, uint64_t seed);
int32_t tfm_sample_set_positions(void * ctx, const int64_t * pos, int32_t n);
int32_t tfm_sample_get(void * ctx, int32_t i0, int32_t n, int32_t * ids, int32_t * n_kept);
uint64_t tfm_sample_key(uint64_t seed, int64_t pos);
"""


class NativeError(RuntimeError):
    """The patched llama.cpp library is missing or was built from another patch series."""


def open_library(cdef: str, version_fn: str, version: int):
    """``(ffi, lib)``: the patched libllama with the C declarations ``cdef`` (which must declare
    ``int32_t version_fn(void)``), once ``version_fn()`` returned ``version``.

    ``llama_cpp`` is imported first, so the library is the one it loaded. Raises NativeError when the
    library is not the patched build (``version_fn`` missing) or was built from other sources (another
    version).
    """
    import llama_cpp  # noqa: F401  (loads libllama into the process first)

    ffi = cffi.FFI()
    ffi.cdef(cdef)
    try:
        handle = ffi.dlopen("libllama.so.0")
        got = getattr(handle, version_fn)()
    except (OSError, AttributeError) as e:
        raise NativeError(
            f"llama-cpp-python is not the tfm-local patched build ({version_fn} missing): "
            "run `python ggml_ops/build.py` (or `make install`)") from e
    if got != version:
        raise NativeError(f"patched llama.cpp {version_fn}() is {got}, this tfm-local needs {version}: "
                          "rebuild with `python ggml_ops/build.py`")
    return ffi, handle


@functools.lru_cache(maxsize=1)
def lib():
    """Return ``(ffi, lib)`` for the patched libllama's tfm-ext.h API; raises NativeError when unusable."""
    return open_library(_CDEF, "tfm_api_version", API_VERSION)


def _ptr(obj) -> int:
    """Address of a ctypes pointer returned by llama_cpp (context or model)."""
    return ctypes.cast(obj, ctypes.c_void_p).value or 0


def set_layer_inp(ctx, il: int, value: bool = True) -> None:
    """Enable/disable extraction of the input features of target layer ``il`` for ``ctx``."""
    ffi, h = lib()
    h.tfm_set_layer_inp(ffi.cast("void *", _ptr(ctx)), il, value)


def get_layer_inp(ctx, il: int, n_tokens: int, n_embd: int) -> np.ndarray:
    """Input features of layer ``il`` for the last batch: a float32 view ``[n_tokens, n_embd]``.

    The view aliases llama.cpp's buffer and is valid until the next decode;
    raises NativeError when extraction of ``il`` is off.
    """
    ffi, h = lib()
    p = h.tfm_get_layer_inp(ffi.cast("void *", _ptr(ctx)), il)
    if p == ffi.NULL:
        raise NativeError(f"layer {il} input features were not extracted")
    buf = ffi.buffer(p, n_tokens * n_embd * 4)
    return np.frombuffer(buf, dtype=np.float32).reshape(n_tokens, n_embd)


def model_target_layers(model) -> list[int]:
    """Layer-input indices a DFlash drafter reads from its target (``dflash.target_layers``)."""
    ffi, h = lib()
    n = ffi.new("uint32_t *")
    p = h.tfm_model_target_layers(ffi.cast("void *", _ptr(model)), n)
    return [] if p == ffi.NULL else [int(p[i]) for i in range(n[0])]


def model_selector_top_k(model) -> int:
    """DFlash2 path-selector top-k of a drafter model (0 for plain DFlash)."""
    ffi, h = lib()
    return int(h.tfm_model_selector_top_k(ffi.cast("void *", _ptr(model))))


def lattice_enable(ctx, on: bool) -> None:
    """Copy a DFlash2 drafter's selector lattice of every following token batch to the host (``on``),
    or stop (``tfm_lattice_enable``)."""
    ffi, h = lib()
    h.tfm_lattice_enable(ffi.cast("void *", _ptr(ctx)), bool(on))


def lattice_rows(ctx, i0: int, n: int, n_embd: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The lattice rows ``i0 .. i0+n-1`` of the last token batch of a DFlash2 drafter (block positions,
    ``tfm-ext.h``): candidates int64 ``[n, top_k]`` and scores float32 ``[n, top_k, top_k]``
    (``[j, p, s]``: candidate s of row j after candidate p of row j-1), copies.

    Raises:
        NativeError: the lattice copy is off (:func:`lattice_enable`).
        ValueError: ``top_k·(top_k+1) > n_embd`` or a negative range.
    """
    if top_k < 1 or top_k * (top_k + 1) > n_embd or i0 < 0 or n < 0:
        raise ValueError(f"lattice rows {i0}..{i0 + n} of top-{top_k} do not fit rows of {n_embd}")
    ffi, h = lib()
    p = h.tfm_lattice_get(ffi.cast("void *", _ptr(ctx)))
    if p == ffi.NULL:
        raise NativeError("the DFlash2 lattice was not copied (lattice_enable first)")
    rows = np.frombuffer(ffi.buffer(p, (i0 + n) * n_embd * 4), dtype=np.float32).reshape(i0 + n, n_embd)[i0:]
    cand = rows[:, :top_k].astype(np.int64)
    scores = rows[:, top_k:top_k * (top_k + 1)].reshape(n, top_k, top_k).copy()
    return cand, scores


def batch_handle(batch):
    """A cffi pointer to a llama_batch_ext (a ctypes pointer from ``llama_batch_ext_init``), for
    :func:`batch_tokens` / :func:`batch_embd`; keep the batch alive while it is used."""
    ffi, _ = lib()
    return ffi.cast("void *", _ptr(batch))


def batch_tokens(batch, tokens: np.ndarray, pos: np.ndarray, seq_ids: np.ndarray | None,
                 outputs: np.ndarray | None) -> int:
    """Fill ``batch`` (a :func:`batch_handle`) with ``tokens`` int32 ``[n]`` at positions ``pos`` int32
    ``[n]``, sequences ``seq_ids`` int32 ``[n]`` (None: 0), output rows where ``outputs`` int8 ``[n]``
    is non-zero (None: all), in one call (``tfm_batch_tokens``). Returns n, or llama.cpp's negative
    code for the first refused token (-1 batch full, -2 invalid token, -3 invalid sequence, -4 bad
    position or arguments). Raises ValueError unless every array is a C-contiguous 1-D array of its
    dtype and length n (the C side reads n entries of each)."""
    for name, arr, dt in (("tokens", tokens, np.int32), ("pos", pos, np.int32), ("seq_ids", seq_ids, np.int32),
                          ("outputs", outputs, np.int8)):
        if arr is not None and (arr.dtype != dt or arr.ndim != 1 or arr.shape[0] != tokens.shape[0]
                                or not arr.flags.c_contiguous):
            raise ValueError(f"batch_tokens: {name} must be a contiguous {np.dtype(dt)} array of "
                             f"{tokens.shape[0]} entries, got {arr.dtype} {arr.shape}")
    ffi, h = lib()
    return h.tfm_batch_tokens(batch, tokens.shape[0], ffi.from_buffer("int32_t[]", tokens),
                              ffi.from_buffer("int32_t[]", pos),
                              ffi.NULL if seq_ids is None else ffi.from_buffer("int32_t[]", seq_ids),
                              ffi.NULL if outputs is None else ffi.from_buffer("int8_t[]", outputs))


def batch_embd(batch, rows: np.ndarray, pos0: int) -> int:
    """Fill ``batch`` (a :func:`batch_handle`) with the embedding rows of ``rows`` float32 ``[n, width]``
    (copied into the batch) at positions ``pos0 ..`` of sequence 0 (``tfm_batch_embd``). Returns n or
    llama.cpp's negative code (see :func:`batch_tokens`). Raises ValueError unless ``rows`` is a
    C-contiguous float32 matrix."""
    if rows.dtype != np.float32 or rows.ndim != 2 or not rows.flags.c_contiguous:
        raise ValueError(f"batch_embd: rows must be a contiguous float32 matrix, got {rows.dtype} {rows.shape}")
    ffi, h = lib()
    return h.tfm_batch_embd(batch, rows.shape[0], ffi.from_buffer("float[]", rows), rows.shape[1], int(pos0))


def tree_set(ctx, parents) -> None:
    """Declare the next decode of ``ctx`` a draft tree; ``parents`` int ``[N]`` (-1 = root), or None to clear.

    Raises NativeError when the context has no attention KV cache (e.g. a recurrent model), its recurrent
    state has no tree mode, or ``parents`` is not in topological order (``-1 <= parents[i] < i``).
    """
    ffi, h = lib()
    if parents is None:
        ok = h.tfm_tree_set(ffi.cast("void *", _ptr(ctx)), ffi.NULL, 0)
    else:
        arr = np.ascontiguousarray(parents, dtype=np.int32)
        ok = h.tfm_tree_set(ffi.cast("void *", _ptr(ctx)), ffi.from_buffer("int32_t[]", arr), arr.shape[0])
    if not ok:
        raise NativeError("tree mode refused: it needs an attention KV cache (and, on a hybrid, a recurrent "
                          "state with tree mode) and parents in topological order (-1 <= parents[i] < i)")


def tree_commit(ctx, keep) -> None:
    """Keep the KV cells of tree nodes ``keep`` (int ``[n]``) and free the other nodes' cells.

    Raises NativeError on a node index outside the last tree.
    """
    ffi, h = lib()
    arr = np.ascontiguousarray(keep, dtype=np.int32)
    if not h.tfm_tree_commit(ffi.cast("void *", _ptr(ctx)), ffi.from_buffer("int32_t[]", arr), arr.shape[0]):
        raise NativeError(f"tree commit failed for nodes {arr.tolist()} (in tree_set's order)")


def topk_attach(ctx, k: int, n_rows: int = 1) -> bool:
    """Attach (``k`` >= 1) or detach (``k`` = 0) the backend top-k sampler on sequence 0 of ``ctx``.

    While attached, every output row of a token batch (at most ``n_rows`` of them) yields its
    ``k`` most likely tokens and their log-probabilities (log-softmax over the full
    vocabulary), computed in the ggml graph on the logits' device; the raw logits are no
    longer copied to the host. Returns True when attached, False when the backend cannot run
    the ops (nothing attached). Raises ValueError for ``k`` outside 0..n_vocab or ``n_rows`` < 1.
    """
    ffi, h = lib()
    rc = h.tfm_topk_attach(ffi.cast("void *", _ptr(ctx)), int(k), int(n_rows))
    if rc < 0:
        raise ValueError(f"top-k must be in 0..n_vocab and n_rows >= 1, got k={k}, n_rows={n_rows}")
    return rc > 0


class TopKAttachment:
    """The backend top-k sampler of one context, attached on demand and kept while it is big enough.

    ``k`` / ``n_rows``: the attached sampler's candidates and output-row limit (0 / 0: none attached);
    ``unsupported``: the backend refused it once (remembered: callers use their host path from then on).
    Shared by the drafter (top-K per block row) and the target (greedy top-1 per verified row).
    """

    def __init__(self, ctx):
        self.ctx, self.k, self.n_rows, self.unsupported = ctx, 0, 0, False

    def ensure(self, k: int, n_rows: int) -> bool:
        """Attach with at least ``k`` candidates and ``n_rows`` rows, re-attaching (a scheduler reserve at
        the next decode) only when the attached sampler is smaller. False when the backend cannot run it."""
        if self.unsupported:
            return False
        if self.k < k or self.n_rows < n_rows:
            k, n_rows = max(self.k, k), max(self.n_rows, n_rows)
            if not topk_attach(self.ctx.ptr, k, n_rows):
                self.unsupported, self.k, self.n_rows = True, 0, 0
                return False
            self.k, self.n_rows = k, n_rows
        return True

    def detach(self) -> None:
        """Detach (a no-op when none is attached): raw logits are copied to the host again."""
        if self.k:
            topk_attach(self.ctx.ptr, 0)
            self.k, self.n_rows = 0, 0

    def forget(self) -> None:
        """Record that the sampler is gone (another one was attached to the sequence in its place)."""
        self.k, self.n_rows = 0, 0


def sample_attach(ctx, temp: float, top_k: int, top_p: float, min_p: float, seed: int, n_rows: int) -> bool:
    """Attach the backend token sampler (``tfm_sample_attach``, patch 0011's ``ggml_sample_tokens``) on
    sequence 0 of ``ctx``, replacing an attached top-k sampler: every output row of a token batch (at
    most ``n_rows``) yields one token drawn in the graph from its processed distribution (top-k, top-p,
    min-p, then ``temp``; ``top_k`` 0, ``top_p`` 1, ``min_p`` 0 are off) with noise keyed by
    ``sample_key(seed, position)``. Returns False when the backend cannot run the op (nothing attached).
    Raises ValueError for ``temp`` not finite and > 0, NaN filters, ``seed`` outside 0..2**64-1 or
    ``n_rows`` < 1. Detach with ``topk_attach(ctx, 0)``."""
    if not 0 <= int(seed) < 2 ** 64:
        raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    ffi, h = lib()
    rc = h.tfm_sample_attach(ffi.cast("void *", _ptr(ctx)), float(temp), int(top_k), float(top_p), float(min_p),
                             int(seed), int(n_rows))
    if rc < 0:
        raise ValueError(f"backend sampling needs a finite temperature > 0, filters that are numbers and "
                         f"n_rows >= 1; got temp={temp}, top_p={top_p}, min_p={min_p}, n_rows={n_rows}")
    return rc > 0


def sample_set_seed(ctx, seed: int) -> None:
    """The attached token sampler's seed from the next batch on (``tfm_sample_set_seed``): the draws'
    keys are a graph input, so this changes no graph (``sample_attach`` would cost a scheduler reserve).
    Raises ValueError for ``seed`` outside 0..2**64-1, NativeError when no token sampler is attached."""
    if not 0 <= int(seed) < 2 ** 64:
        raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    ffi, h = lib()
    if h.tfm_sample_set_seed(ffi.cast("void *", _ptr(ctx)), int(seed)) < 0:
        raise NativeError("no backend token sampler is attached")


def sample_set_positions(ctx, positions: np.ndarray) -> None:
    """The positions the next batch's output rows draw their tokens for (row r: ``positions[r]``, int
    ``[n]``). Raises NativeError when no token sampler is attached."""
    ffi, h = lib()
    arr = np.ascontiguousarray(positions, dtype=np.int64)
    if h.tfm_sample_set_positions(ffi.cast("void *", _ptr(ctx)), ffi.from_buffer("int64_t[]", arr), arr.shape[0]) < 0:
        raise NativeError("no backend token sampler is attached")


def sample_get(ctx, i0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of the last batch's output rows ``i0 .. i0+n-1`` (the batch's outputs in order, not its token
    indices) drawn by the backend token sampler: ids
    int32 ``[n]`` and kept-set sizes int32 ``[n]`` (waits for the batch). Raises NativeError when no
    token sampler is attached, nothing was decoded with it or the rows are out of range."""
    ffi, h = lib()
    ids = np.empty(n, dtype=np.int32)
    kept = np.empty(n, dtype=np.int32)
    got = h.tfm_sample_get(ffi.cast("void *", _ptr(ctx)), int(i0), int(n), ffi.from_buffer("int32_t[]", ids),
                           ffi.from_buffer("int32_t[]", kept))
    if got != n:
        raise NativeError(f"no backend sample for rows {i0}..{i0 + n - 1} (got {got})")
    return ids, kept


def sample_key(seed: int, position: int) -> int:
    """The 64-bit key of the draw at ``position`` under ``seed`` (``tfm_sample_key``)."""
    _, h = lib()
    return int(h.tfm_sample_key(int(seed), int(position)))


class SampleAttachment:
    """The backend token sampler of one context (``sample_attach``), re-attached only when its settings
    change or it needs more rows. ``params``: (temp, top_k, top_p, min_p, seed) attached, or None;
    ``unsupported``: the backend refused it once (callers use their host path from then on)."""

    def __init__(self, ctx):
        self.ctx, self.params, self.n_rows, self.unsupported = ctx, None, 0, False

    def ensure(self, params: tuple, n_rows: int) -> bool:
        """Attach with ``params`` = (temp, top_k, top_p, min_p, seed) for at least ``n_rows`` rows; a new
        seed alone is set in place (``sample_set_seed``: no graph change, no scheduler reserve)."""
        if self.unsupported:
            return False
        if (self.params is not None and self.params[:4] == params[:4] and self.params[4] != params[4]
                and self.n_rows >= n_rows):
            try:
                sample_set_seed(self.ctx.ptr, params[4])
                self.params = params
            except NativeError:  # replaced behind this object's back (a direct topk_attach): attach anew
                self.params, self.n_rows = None, 0
        if self.params != params or self.n_rows < n_rows:
            n_rows = max(n_rows, self.n_rows if self.params == params else 0)
            if not sample_attach(self.ctx.ptr, *params, n_rows):
                self.unsupported, self.params, self.n_rows = True, None, 0
                return False
            self.params, self.n_rows = params, n_rows
        return True

    def detach(self) -> None:
        """Detach (a no-op when none is attached)."""
        if self.params is not None:
            topk_attach(self.ctx.ptr, 0)
            self.params, self.n_rows = None, 0

    def forget(self) -> None:
        """Record that the sampler is gone (another one was attached to the sequence in its place)."""
        self.params, self.n_rows = None, 0


def keep_graphs(ctx, on: bool = True) -> bool:
    """Give the graphs of ``ctx``'s batches without outputs a scheduler of their own (``on``), or drop it.

    Patch 0010: llama.cpp reuses a kept graph only if its scheduler allocated nothing since, so a
    context that alternates batches without outputs and batches with outputs (the drafter's KV
    injection and block pass) rebuilds both graphs every step; with the switch on each kind keeps
    its own allocation and is reused while its shape holds (``graphs_reused`` counts), at the cost
    of a second compute buffer. Returns whether the switch is now as asked (False: no backends).
    """
    ffi, h = lib()
    return bool(h.tfm_context_keep_graphs(ffi.cast("void *", _ptr(ctx)), bool(on)))


def graphs_reused(ctx) -> int:
    """How many decodes (ubatches) of ``ctx`` reused a kept graph (llama.cpp's ``n_reused`` perf counter)."""
    import llama_cpp as lc

    return int(lc.llama_perf_context(ctx).n_reused)


def topk_get(ctx, i0: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k of the last batch's rows ``i0 .. i0+n-1``: ids int32 ``[n, k]`` and log-probs float32 ``[n, k]``,
    each row sorted by descending log-prob (ties by ascending id). For k = 1 (the greedy argmax) the
    second array holds the argmax's raw logit instead (tfm-ext computes no softmax then).

    ``k`` must be the attached sampler's. Raises NativeError when no sampler with this ``k`` is
    attached or a row has no result (not an output row, or another batch was decoded since).
    """
    ffi, h = lib()
    ids = np.empty((n, k), dtype=np.int32)
    logp = np.empty((n, k), dtype=np.float32)
    got = h.tfm_topk_get(ffi.cast("void *", _ptr(ctx)), int(i0), int(n), int(k),
                         ffi.from_buffer("int32_t[]", ids), ffi.from_buffer("float[]", logp))
    if got != k:
        raise NativeError(f"no backend top-{k} result for rows {i0}..{i0 + n - 1} (got {got})")
    return ids, logp
