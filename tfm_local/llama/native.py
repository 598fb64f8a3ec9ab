"""cffi bindings (ABI mode) for the C API that our patch series adds to llama.cpp.

llama-cpp-python binds the public llama.h API and part of llama-ext.h; the
rest of what the driver needs is exported with C linkage by
``ggml_ops/src/tfm-ext.h`` (and, for tests and benchmarks, the op harness of
``ggml_ops/src/tfm-op-harness.h``) and bound here. The library is opened by soname
(``libllama.so.0``) *after* ``llama_cpp`` has loaded it, so the process holds
one copy of llama.cpp and ggml (opening by file path would load a second one;
see docs/design.md §2).
"""
from __future__ import annotations

import ctypes
import functools

import cffi
import numpy as np

API_VERSION = 18

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
void tfm_test_op_set_fparams(const float * p, int32_t n);
int32_t tfm_test_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                    const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                    float * out, int64_t out_n);
int32_t tfm_bench_op(int32_t op, int32_t n_src, const void * const * src, const int64_t * ne,
                     const int32_t * types, int32_t iparam, int32_t device, int32_t n_threads,
                     int32_t n_repeat, int32_t n_warmup, int32_t n_iter, float * ms_out);
"""


class NativeError(RuntimeError):
    """The patched llama.cpp library is missing or was built from another patch series."""


@functools.lru_cache(maxsize=1)
def lib():
    """Return ``(ffi, lib)`` for the patched libllama; raises NativeError when unusable."""
    import llama_cpp  # noqa: F401  (loads libllama into the process first)

    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    try:
        handle = ffi.dlopen("libllama.so.0")
        version = handle.tfm_api_version()
    except (OSError, AttributeError) as e:
        raise NativeError(
            "llama-cpp-python is not the tfm-local patched build (tfm_api_version missing): "
            "run `python ggml_ops/build.py` (or `make install`)") from e
    if version != API_VERSION:
        raise NativeError(f"patched llama.cpp API version {version}, this tfm-local needs {API_VERSION}: "
                          "rebuild with `python ggml_ops/build.py`")
    return ffi, handle


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


# op ids of tfm_test_op (tfm-op-harness.h)
TEST_OPS = {"gdn": 0, "gdn_tree": 1, "gdn_commit": 2, "conv": 3, "conv_tree": 4, "conv_commit": 5, "top_k": 6, "argmax": 7,
            "sample_tokens": 8}


def set_op_fparams(*params: float) -> None:
    """The float parameters of the next ``run_op`` / ``bench_op`` calls of ops that take some
    (``sample_tokens``: temp, top_p, min_p; its top_k is ``iparam``)."""
    ffi, h = lib()
    h.tfm_test_op_set_fparams(ffi.new("float[]", [float(p) for p in params]), len(params))


class OpUnavailable(NativeError):
    """The requested device is absent, or it does not support the op with these shapes."""


def _op_args(ffi, op: str, srcs, device: str):
    """The C arguments shared by tfm_test_op and tfm_bench_op: (op id, keep-alive arrays, src pointers,
    ne, types, device id). Raises ValueError on an unknown op or device or a bad source array."""
    if op not in TEST_OPS:
        raise ValueError(f"op must be one of {sorted(TEST_OPS)}, got {op!r}")
    dev = {"cpu": 0, "gpu": 1}.get(device)
    if dev is None:
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    arrays, ne, types = [], [], []
    for a in srcs:
        a = np.asarray(a)
        if a.dtype not in (np.float32, np.int32) or a.ndim > 4:
            raise ValueError(f"test_op sources must be float32/int32 with <= 4 dims, got {a.dtype} {a.shape}")
        arrays.append(np.ascontiguousarray(a))
        ne += list(a.shape[::-1]) + [1] * (4 - a.ndim)
        types.append(0 if a.dtype == np.float32 else 1)
    if not arrays:
        raise ValueError("test_op needs at least one source array")
    ptrs = ffi.new("void *[]", [ffi.from_buffer(a) for a in arrays])
    return TEST_OPS[op], arrays, ptrs, ffi.new("int64_t[]", ne), ffi.new("int32_t[]", types), dev


def _check_rc(rc: int, op: str, device: str, what: str) -> None:
    if rc == -2:
        raise OpUnavailable(f"no {device} device in this build")
    if rc == -3:
        raise OpUnavailable(f"the {device} device does not support {op} with these shapes")
    if rc != 0:
        raise ValueError(f"{what}({op}) failed: bad arguments (source count or shapes for the op)")


def run_op(op: str, srcs, out_size: int, iparam: int = 0, device: str = "cpu", n_threads: int = 2) -> np.ndarray:
    """Run one ggml op (``TEST_OPS``) on host arrays through ``tfm_test_op``; returns float32 ``[out_size]``.

    ``srcs`` are numpy arrays in the op's argument order (see tfm-op-harness.h), float32 or int32,
    of at most 4 dimensions; numpy shape ``(d3, d2, d1, d0)`` is ggml's ``ne = [d0, d1, d2, d3]``.
    ``out_size`` must be the result's element count. The result tensor is NaN-filled before the
    run. ``device``: ``"cpu"`` (``n_threads`` threads) or ``"gpu"`` (the first GPU device).
    Raises OpUnavailable when the device is absent or cannot run the op, ValueError on bad arguments
    (also a wrong ``out_size``). An op with an int32 result (``top_k``, ``argmax``) comes back bit for bit in the
    float32 array: read it with ``.view(np.int32)`` (an unwritten element then reads 0x7FC00000).
    """
    ffi, h = lib()
    op_id, arrays, ptrs, ne, types, dev = _op_args(ffi, op, srcs, device)
    out = np.full(out_size, np.nan, dtype=np.float32)
    rc = h.tfm_test_op(op_id, len(arrays), ptrs, ne, types, int(iparam), dev, int(n_threads),
                       ffi.from_buffer("float[]", out), out_size)
    _check_rc(rc, op, device, f"tfm_test_op (output size {out_size})")
    return out


BENCH_MAX_REPEAT = 64  # TFM_BENCH_MAX_REPEAT of tfm-op-harness.h


def op_time(ms_1: np.ndarray, ms_r: np.ndarray, n_repeat: int) -> float:
    """The op's own time in ms, without the per-computation launch + synchronize: the difference of the
    median wall times of a graph of ``n_repeat`` copies (``ms_r``) and of one copy (``ms_1``), per extra
    copy (:func:`bench_op` with ``n_repeat`` and 1). Raises ValueError for ``n_repeat`` < 2."""
    if n_repeat < 2:
        raise ValueError(f"op_time needs n_repeat >= 2, got {n_repeat}")
    return float((np.median(ms_r) - np.median(ms_1)) / (n_repeat - 1))


def bench_op(op: str, srcs, iparam: int = 0, device: str = "cpu", n_threads: int = 2,
             n_warmup: int = 3, n_iter: int = 10, n_repeat: int = 1) -> np.ndarray:
    """Time one ggml op (``TEST_OPS``) through ``tfm_bench_op``: float32 ``[n_iter]`` wall times in ms.

    Sources, ``iparam``, ``device`` and ``n_threads`` as :func:`run_op`. The sources are uploaded
    once; a graph of ``n_repeat`` independent copies of the op over them (1..BENCH_MAX_REPEAT) is
    then computed ``n_warmup`` times untimed and ``n_iter`` times timed, each computation followed
    by a backend synchronize (a time covers compute + synchronize of all copies, not the upload).
    Nothing is copied back. :func:`op_time` turns two repeat counts into the op's own time.
    Raises ValueError for ``n_warmup`` < 0, ``n_iter`` < 1, ``n_repeat`` outside 1..BENCH_MAX_REPEAT
    or bad sources, OpUnavailable as :func:`run_op`.
    """
    if int(n_warmup) < 0 or int(n_iter) < 1 or not 1 <= int(n_repeat) <= BENCH_MAX_REPEAT:
        raise ValueError(f"bench_op needs n_warmup >= 0, n_iter >= 1 and n_repeat in 1..{BENCH_MAX_REPEAT}, "
                         f"got {n_warmup}, {n_iter}, {n_repeat}")
    ffi, h = lib()
    op_id, arrays, ptrs, ne, types, dev = _op_args(ffi, op, srcs, device)
    ms = np.full(int(n_iter), np.nan, dtype=np.float32)
    rc = h.tfm_bench_op(op_id, len(arrays), ptrs, ne, types, int(iparam), dev, int(n_threads),
                        int(n_repeat), int(n_warmup), int(n_iter), ffi.from_buffer("float[]", ms))
    _check_rc(rc, op, device, "tfm_bench_op")
    return ms


# -- the Weaver (tfm_weaver_*, API versions 12-14, 17, 18) ------------------------------------------------

#: tfm-ext.h's limits of one DARTree on the backend (``tfm_weaver_dartree`` returns -4 beyond them): its live
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
    """q ``[n_paths, rank]`` float32 of each path's last step (tfm-ext.h, ``tfm_weaver_q``: the prefix, kept
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
        as tfm-ext.h describes; ``dartree_rows`` gives each round's share of ``live``.
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
