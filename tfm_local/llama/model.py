"""Thin, owned wrappers over llama-cpp-python's low-level API: model, context, batch.

Everything here forwards to functions llama-cpp-python already binds
(``llama_cpp.llama_cpp``); nothing re-implements llama.cpp. The wrappers add
clear errors, lifetime management and numpy views of outputs.
"""
from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Protocol

import llama_cpp as lc
import numpy as np

from . import native
from .probe import passed, probe_model

KV_TYPES = {"f16": 1, "f32": 0, "q8_0": 8, "bf16": 30}

_backend_ready = False


class LlamaError(RuntimeError):
    """A llama.cpp call failed (model load, context creation, decode)."""


#: llama.cpp's latest warning and error lines (when its log is silenced): the reason a load failed
_LOG_ERRORS: list[str] = []
_WARN, _CONT = 3, 5  # ggml_log_level: GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_CONT


def _quiet_logs() -> None:
    """Silence llama.cpp's logging unless TFM_VERBOSE is set (errors still raise); its warnings and
    errors are kept (the last 8 lines) so that a refusal can say why (``_log_reason``)."""
    if os.environ.get("TFM_VERBOSE"):
        return

    @lc.llama_log_callback
    def _sink(level, text, user_data):  # pragma: no cover - C callback
        if level >= _WARN:
            line = text.decode("utf-8", "replace") if text else ""
            if level == _CONT and _LOG_ERRORS:
                _LOG_ERRORS[-1] += line
            elif level != _CONT:
                _LOG_ERRORS.append(line)
            del _LOG_ERRORS[:-8]
        return None

    _quiet_logs.cb = _sink  # keep alive
    lc.llama_log_set(_sink, ctypes.c_void_p(0))


def backend_init() -> None:
    """Initialise llama.cpp once per process."""
    global _backend_ready
    if not _backend_ready:
        _quiet_logs()
        lc.llama_backend_init()
        _backend_ready = True


def default_threads() -> int:
    """Threads for decoding: ``$TFM_THREADS`` or the CPU count."""
    return int(os.environ.get("TFM_THREADS", os.cpu_count() or 1))


def repacked_weights() -> bool:
    """Whether llama.cpp may repack weights for its CPU GEMM kernels (its "extra buffer types":
    Q4_0/Q4_K/IQ4_NL rearranged for 4- and 8-row products). On by default; ``TFM_NO_REPACK=1`` turns
    it off, so a batch of any size runs the plain per-row dot products (``make test-narrow``: results
    must not depend on which kernels a CPU gets)."""
    return os.environ.get("TFM_NO_REPACK", "0") in ("", "0")


def model_params(n_gpu_layers: int = 0):
    """llama.cpp's default model parameters with ``n_gpu_layers`` and the repacking switch
    (``repacked_weights``) applied."""
    params = lc.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    params.use_extra_bufts = repacked_weights()
    return params


def gpu_available() -> bool:
    """True when the loaded llama.cpp has a GPU backend (a CUDA build on a GPU machine)."""
    return bool(lc.llama_supports_gpu_offload())


def gguf_kv(path: str | os.PathLike) -> dict | None:
    """The metadata key/values of a GGUF file (``tfm_local.files.gguf_meta``: key -> entry with ``.value``);
    None when the file does not parse (llama.cpp is the judge of what loads)."""
    from ..files.gguf_meta import GGUFError, read_gguf_meta

    try:
        return read_gguf_meta(path).kv
    except GGUFError:
        return None


def gguf_architecture(path: str | os.PathLike) -> str | None:
    """``general.architecture`` of a GGUF file; None when the file does not parse or has none (``gguf_kv``)."""
    arch = (gguf_kv(path) or {}).get("general.architecture")
    return None if arch is None else arch.value


def _check_file(path: Path) -> None:
    """Refuse, before llama.cpp sees it in this process, a GGUF that would abort the process: the quick
    checks of ``gguf_meta.check_hparams`` (when our reader parses the header; llama.cpp refuses damaged
    headers on its own and may know types the ``gguf`` package does not), then a load in a child
    process (``probe.probe_model``, once per file). A file that passed both before is not read again."""
    from ..files.gguf_meta import GGUFError, check_hparams, read_gguf_meta

    if passed(path):
        return
    try:
        meta = read_gguf_meta(path)
    except GGUFError:
        meta = None  # llama.cpp refuses damaged headers on its own; the probe still runs
    if meta is not None:
        check_hparams(meta, path)
    probe_model(path)


def _log_reason() -> str:
    """llama.cpp's error lines since the last call, joined (its warnings when no error was logged)."""
    lines = [" ".join(x.split()) for x in _LOG_ERRORS if x.strip()]
    _LOG_ERRORS.clear()
    errors = [x for x in lines if "error" in x.lower() or "failed" in x.lower()]
    specific = [x for x in errors if "failed to load model" not in x]  # not the loaders' wrapper lines
    return "; ".join(specific or errors or lines[-2:])[:600]


def _load_hint(path: Path) -> str:
    """Why llama.cpp may have refused ``path``, read from its GGUF metadata: a file without vocabulary;
    '' otherwise."""
    kv = gguf_kv(path)
    return "" if kv is None or "tokenizer.ggml.model" in kv else \
        ": it has no vocabulary (no tokenizer.ggml.model in its metadata)"


class Model:
    """A GGUF model loaded by llama.cpp.

    Args:
        path: GGUF file.
        n_gpu_layers: layers to offload (-1 = all when a GPU backend exists, 0 = CPU).
    Raises:
        FileNotFoundError: the file does not exist.
        GGUFError: hyperparameters llama.cpp would abort on (``gguf_meta.check_hparams``).
        LlamaError: llama.cpp refused the file (corrupt, truncated, unknown arch), with its reason.
    """

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int = -1):
        backend_init()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"model file not found: {self.path}")
        params = model_params(n_gpu_layers if gpu_available() else 0)
        #: whether layers run on a GPU (the numerics of batched passes differ per backend: tfm_local.lossless)
        self.on_gpu = params.n_gpu_layers != 0
        _check_file(self.path)
        _log_reason()  # forget older lines
        self.ptr = lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.ptr:
            why = _log_reason()
            raise LlamaError(f"llama.cpp could not load {self.path}" + (_load_hint(self.path) or
                             " (corrupt, truncated or unsupported GGUF" + (f": {why}" if why else
                                                                           "; set TFM_VERBOSE=1 for its log") + ")"))
        self.vocab = lc.llama_model_get_vocab(self.ptr)
        self.n_embd = lc.llama_model_n_embd(self.ptr)
        self.n_layer = lc.llama_model_n_layer(self.ptr)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self.ptr)
        self.arch = self.meta("general.architecture") or "?"

    def meta(self, key: str) -> str | None:
        """GGUF metadata value of ``key`` as a string, or None when absent."""
        buf = ctypes.create_string_buffer(4096)
        n = lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def close(self) -> None:
        """Free the model (idempotent)."""
        if getattr(self, "ptr", None):
            lc.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self):
        self.close()


class DecodeObserver(Protocol):
    """What ``Context.observer`` is told of each llama.cpp decode of its context (tools: timers, traces).

    ``what`` is "tokens" or "embeddings", ``n`` the batch's rows; ``seconds`` the wall time of the
    ``llama_process`` call (``time.perf_counter``; on a GPU the launch, not the work: synchronize in
    ``before``/``after`` to time the work). ``after`` is called also when the decode failed, before the
    LlamaError is raised."""

    def before(self, ctx: "Context", what: str, n: int) -> None: ...

    def after(self, ctx: "Context", what: str, n: int, seconds: float) -> None: ...


#: the first word of llama.cpp's state of a sequence (llama-context.cpp, ``io_magic``)
_STATE_MAGIC = 0xAF143CD8


class Context:
    """A llama.cpp context: one sequence (id 0), its KV cache and its outputs.

    Args:
        model: the loaded model.
        n_ctx: context length in tokens.
        n_batch / n_ubatch: logical / physical batch sizes (tokens).
        kv_type: KV cache type, one of ``KV_TYPES`` ("f16", "q8_0", ...).
        ctx_other: another context whose model shares tensors (DFlash drafter → target).
        n_seq_max: sequences the memory holds (ids 0..n_seq_max-1); kv_unified: one KV stream for all
            sequences (a ``seq_cp`` of a prefix then shares its cells instead of copying them).
        n_rs_seq: recurrent-state snapshots per sequence for upstream's rollback of a recurrent
            (hybrid) memory by ``truncate`` (0 = none; llama.cpp clamps it to 0 for other archs).
        swa_full: a sliding-window model's window caches hold every position (llama.cpp's default);
            False = about one window and one batch, whose cells are reused once out of the window.
    Raises:
        ValueError: unknown kv_type. LlamaError: llama.cpp refused the parameters.
    """

    def __init__(self, model: Model, n_ctx: int, n_batch: int = 512, n_ubatch: int = 512,
                 kv_type: str = "f16", n_threads: int | None = None, ctx_other: "Context | None" = None,
                 n_seq_max: int = 1, kv_unified: bool = False, n_rs_seq: int = 0, swa_full: bool = True):
        if kv_type not in KV_TYPES:
            raise ValueError(f"unknown KV cache type {kv_type!r}; choose one of {sorted(KV_TYPES)}")
        self.model = model
        p = lc.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = n_ctx, n_batch, n_ubatch
        p.n_seq_max = n_seq_max
        p.kv_unified = kv_unified
        p.n_rs_seq = n_rs_seq
        p.swa_full = swa_full
        threads = n_threads or default_threads()
        p.n_threads = p.n_threads_batch = threads
        p.type_k = p.type_v = KV_TYPES[kv_type]
        p.no_perf = True
        if ctx_other is not None:
            p.ctx_other = ctx_other.ptr
        self.ptr = lc.llama_init_from_model(model.ptr, p)
        if not self.ptr:
            hint = " (a quantized KV cache needs head sizes divisible by 32)" if kv_type.startswith("q") else ""
            raise LlamaError(f"llama.cpp could not create a context (n_ctx={n_ctx}, kv={kv_type}) for "
                             f"{model.path.name}{hint}; set TFM_VERBOSE=1 for llama.cpp's log")
        self.n_ctx = lc.llama_n_ctx(self.ptr)
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.mem = lc.llama_get_memory(self.ptr)
        #: the sliding window of the model's SWA layers in tokens (0: none; ``resumable_at``)
        self.n_swa = int(lc.llama_model_n_swa(model.ptr))
        #: calls through this object that changed the memory (decodes, truncations, clears): a user of
        #: the cache (the engine's prompt cache) tells from it whether anyone wrote since it looked
        self.writes = 0
        self._batch = lc.llama_batch_ext_init(self.ptr)
        self._batch_c = native.batch_handle(self._batch)
        #: None, or a ``DecodeObserver`` told of each decode of this context, right before and after
        #: llama.cpp's call (unset, a decode costs one test of this attribute)
        self.observer: DecodeObserver | None = None

    # -- batches -------------------------------------------------------------------------
    def decode_tokens(self, tokens, pos0: int, outputs, positions=None, seq_ids=None) -> int:
        """Decode ``tokens`` at positions ``pos0 + i`` (or ``positions[i]``) in sequence 0 (or
        ``seq_ids[i]``); ``outputs`` = per-token bools or "all"/"last".

        Returns the number of tokens decoded. Raises LlamaError on a failed decode or a token the
        batch refuses (an id outside the vocabulary, more tokens than the batch holds), ValueError
        for another ``outputs`` string or ``positions`` / ``seq_ids`` / ``outputs`` of another length.
        """
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        n = toks.shape[0]
        pos = (np.arange(pos0, pos0 + n, dtype=np.int32) if positions is None
               else np.ascontiguousarray(positions, dtype=np.int32))
        seq = None if seq_ids is None else np.ascontiguousarray(seq_ids, dtype=np.int32)
        out = None
        if isinstance(outputs, str):
            if outputs not in ("all", "last"):
                raise ValueError(f'outputs must be "all", "last" or per-token bools, got {outputs!r}')
            if outputs == "last":
                out = np.zeros(n, np.int8)
                out[-1:] = 1
        else:
            out = np.ascontiguousarray(outputs, dtype=np.int8)
        rc = native.batch_tokens(self._batch_c, toks, pos, seq, out)
        if rc < 0:
            raise LlamaError(f"a token of {toks[:8].tolist()}{'...' if n > 8 else ''} was refused by llama.cpp's "
                             f"batch (code {rc}: -1 batch full, -2 invalid token id, -3 invalid sequence, -4 bad position)")
        return self._process(n, "tokens")

    def decode_embd(self, rows: np.ndarray, pos0: int) -> None:
        """Decode embedding rows ``[n, width]`` float32 at positions ``pos0 + i`` (no outputs)."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        rc = native.batch_embd(self._batch_c, rows, pos0)
        if rc < 0:
            raise LlamaError(f"embedding rows refused by llama.cpp's batch (code {rc})")
        self._process(rows.shape[0], "embeddings")

    def _process(self, n: int, what: str) -> int:
        self.writes += 1
        obs = self.observer
        if obs is None:
            rc = lc.llama_process(self.ptr, lc.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        else:
            obs.before(self, what, n)
            t0 = time.perf_counter()
            rc = lc.llama_process(self.ptr, lc.LLAMA_PROCESS_TYPE_DECODE, self._batch)
            obs.after(self, what, n, time.perf_counter() - t0)
        if rc != 0:
            raise LlamaError(f"llama.cpp decode of {n} {what} failed (code {rc})")
        return n

    def logits(self, n_rows: int) -> np.ndarray:
        """Logits of the last batch's output rows: float32 view ``[n_rows, n_vocab]``."""
        p = lc.llama_get_logits(self.ptr)
        nv = self.model.n_vocab
        return np.ctypeslib.as_array(p, shape=(n_rows * nv,)).reshape(n_rows, nv)

    def set_embeddings(self, on: bool) -> None:
        """Keep (or stop keeping) the final hidden state, after the output norm, of the output rows of the
        following passes (llama.cpp's embeddings; while on, every token of a batch is an output)."""
        lc.llama_set_embeddings(self.ptr, bool(on))

    def embeddings(self, n_rows: int) -> np.ndarray:
        """The last batch's output rows' final hidden states: float32 view ``[n_rows, n_embd]`` (valid
        until the next decode); raises LlamaError when ``set_embeddings`` was off for it."""
        p = lc.llama_get_embeddings(self.ptr)
        if not p:
            raise LlamaError("no hidden states: set_embeddings(True) before the decode")
        n = self.model.n_embd
        return np.ctypeslib.as_array(p, shape=(n_rows * n,)).reshape(n_rows, n)

    def synchronize(self) -> None:
        """Wait until the backend has finished this context's computations (a no-op on the CPU)."""
        lc.llama_synchronize(self.ptr)

    # -- KV cache ------------------------------------------------------------------------
    def truncate(self, pos: int) -> None:
        """Drop every cell at position >= ``pos`` from sequence 0."""
        self.writes += 1
        lc.llama_memory_seq_rm(self.mem, 0, pos, -1)

    def clear(self) -> None:
        """Empty the KV cache."""
        self.writes += 1
        lc.llama_memory_clear(self.mem, True)

    def pos_max(self) -> int:
        """Largest position held for sequence 0 (-1 when empty)."""
        return lc.llama_memory_seq_pos_max(self.mem, 0)

    def pos_min(self) -> int:
        """Smallest position held for sequence 0 (-1 when empty; a sliding-window cache's, the window's
        oldest: llama.cpp drops the cells that fall out of it)."""
        return lc.llama_memory_seq_pos_min(self.mem, 0)

    def resumable_at(self, pos: int) -> bool:
        """Whether sequence 0 cut back to positions ``0 .. pos - 1`` can be continued at ``pos`` as if they
        had just been decoded: every cell a token at ``pos`` attends to is still held. Always true of a
        full-attention cache holding those positions; a sliding-window (SWA) cache must still hold the
        window before ``pos`` (its oldest cell at most ``pos - n_swa``, llama.cpp's server's rule). A
        recurrent state is not judged here (it cannot be cut back at all: ``Target.recurrent``). With
        ``swa_full`` (the default) every cut of a held sequence is resumable."""
        if pos <= 0:
            return True
        if self.pos_max() < pos - 1:
            return False
        return self.pos_min() <= max(0, pos - self.n_swa) if self.n_swa > 0 else self.pos_min() <= 0

    def n_cells(self) -> int | None:
        """Cells sequence 0 holds in the (first) attention cache, or None when the memory does not say.

        Read from the head of llama.cpp's state of the sequence (``llama_state_seq_get_data``): its magic,
        the sequence id, the stream count, then stream 0's cell count (sequence 0 lives in stream 0; an
        iSWA cache writes its full-attention part first, a hybrid memory its attention cache before the
        recurrent one). Copies the sequence's cache to the host: for checks and debugging, not per step.
        Holes mid-sequence show here: positions ``pos_min() .. pos_max()`` in fewer cells."""
        size = lc.llama_state_seq_get_size(self.ptr, 0)
        if size < 16:  # nothing after the sequence id: a cache sharing another's cells writes none
            return None
        buf = (ctypes.c_uint8 * size)()
        if lc.llama_state_seq_get_data(self.ptr, buf, size, 0) < 16:
            return None
        magic, seq, n_stream, count = np.frombuffer(buf, dtype=np.uint32, count=4).tolist()
        return count if magic == _STATE_MAGIC and seq == 0 and n_stream >= 1 else None

    def hole_problems(self, who: str) -> list[str]:
        """Sequence 0 must hold each position 0 .. ``pos_max()`` in one cell: [] when it does (or the
        memory does not say, ``n_cells``), else one line saying how many are missing (a hole at the start
        or mid-sequence, which ``pos_max`` alone does not show) or held twice; ``who`` starts the line."""
        hi, n = self.pos_max(), self.n_cells()
        if n is None or n == hi + 1:
            return []
        what = f"{hi + 1 - n} missing (a hole mid-sequence)" if n < hi + 1 else f"{n - hi - 1} held twice"
        return [f"{who}: cache holds {n} cells for positions 0 .. {hi}: {what}"]

    def close(self) -> None:
        """Free the context (idempotent)."""
        if getattr(self, "ptr", None):
            lc.llama_batch_ext_free(self._batch)
            lc.llama_free(self.ptr)
            self.ptr = None

    def __del__(self):
        self.close()
