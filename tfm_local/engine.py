"""The generate loop: prefill, then one decode step after another until done (gpt-fast style).

``Engine`` holds the target, the optional drafter and the draft settings; ``_token_stream`` prefills
the prompt (what the prompt cache does not hold of it: ``decode.prompt_cache``) and calls
``decode.step.run_step`` (draft → tree → verify → accept → commit) until ``max_tokens`` or the end of
the context, feeding each step's record to the statistics and the automatic budget. With no drafter or ``budget=0`` the same loop is plain decoding. The stages live in
``tfm_local/decode/`` (one module each); the method and its sources in docs/design.md §1.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

from .decode.budget import CPU, GPU, BudgetPolicy, PassCosts
from .decode.draft import DFlashDrafter
from .decode.host_choice import HostChooser
from .decode.logprobs import TokenLogprob, check_top_logprobs
from .decode.sampling import SamplingParams, TokenChooser
from .decode.stats import GenerationStats
from .decode.methods import DraftMethod, check_method_options, make_method
from .decode.prompt_cache import PromptCache
from .decode.step import run_step, set_capture
from .decode.verify import Target
from .decode.warmup import warm_drafter, warm_up
from .llama.tokenizer import StreamDecoder, encode_chat
from .stops import StopMatcher
from .token_text import TokenSpans


#: How greedy steps read the target's choice: "backend" = each verified row's argmax computed in the
#: target's graph (Target.attach_argmax, one int per row reaches the host), "host" = full logits
#: copied to the host and np.argmax. "auto" = GPU_ARGMAX on a GPU, CPU_ARGMAX on the CPU; the
#: environment variable TFM_GREEDY_ARGMAX (backend|host) overrides "auto". From measurements: on the
#: 2-core CPU equal within noise (docs/cpu.md), so "host"; on the H200 the backend argmax (one
#: ggml_argmax over all rows, patch 0007's multi-block kernel) made a 16-token verify 4.33 ms and a
#: 64-token one 7.24 ms against 4.86 and 10.5 with the logits copied (docs/gpu.md).
ARGMAX_MODES = ("auto", "backend", "host")
CPU_ARGMAX = "host"
GPU_ARGMAX = "backend"


def backend_argmax_wanted(mode: str, on_gpu: bool) -> bool:
    """Whether greedy decoding should use the backend argmax, for an ``ARGMAX_MODES`` value.

    Raises ValueError for an unknown mode (also from TFM_GREEDY_ARGMAX).
    """
    if mode == "auto":
        mode = os.environ.get("TFM_GREEDY_ARGMAX") or (GPU_ARGMAX if on_gpu else CPU_ARGMAX)
    if mode not in ARGMAX_MODES[1:]:
        raise ValueError(f"greedy argmax must be one of {', '.join(ARGMAX_MODES)} "
                         f"(also TFM_GREEDY_ARGMAX: backend or host), got {mode!r}")
    return mode == "backend"


def _check_budget(budget) -> None:
    """ValueError unless ``budget`` is ``"auto"``, None or an integer >= 0."""
    if isinstance(budget, str):
        if budget != "auto":
            raise ValueError(f"budget must be an integer >= 0, None or 'auto', got {budget!r}")
    elif budget is not None:
        if isinstance(budget, bool) or int(budget) != budget:
            raise ValueError(f"budget must be an integer >= 0, None or 'auto', got {budget!r}")
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")


class Engine:
    """Speculative decoding engine over a GGUF target and an optional DFlash drafter.

    Args:
        target: model spec of the target (path, ``hf://owner/repo/file.gguf`` or a built-in name).
        drafter: drafter spec, ``"auto"`` (the default drafter for the target) or None (plain decoding).
        n_ctx: context length in tokens.
        budget: draft tokens verified per step: ``"auto"`` (default; chosen per step from measured costs and
            acceptance, plain where speculation does not pay; decode/budget/), an int (0 = plain decoding),
            or None (block size - 1 for the chain, 63 for trees).
        kv_type / drafter_kv_type: KV cache types ("f16", "q8_0").
        n_threads: CPU threads (default: all cores). n_gpu_layers: -1 = all on the GPU when there is one.
        tree: "chain" (the DFlash chain), "ddtree" (best-first tree over the marginals), "wide" (w-wide
            heap), "tfm" (the w-wide heap scored by the Weaver; needs ``weaver``), "dartree" (DARTree with
            the Weaver as correction head, or a DFlash2 drafter's path selector) or "lattice" (a DFlash2
            drafter's best-first tree over its selector's lattice); for trees ``budget`` counts drafted
            nodes. A DFlash2 drafter's chain is its lattice's greedy walk (``decode.lattice``).
            tree_top_k: candidates per block position (of the marginals).
        tree_width: heap entries expanded together by "wide".
        greedy_argmax: at temperature 0, "backend" reads each verified row's argmax computed on
            the target's backend, "host" copies the logits and takes np.argmax, "auto" (default)
            chooses (ARGMAX_MODES). Plain and speculative decoding use the same rule.
        draft_vocab: the drafter's draft vocabulary (``drafters.apply_draft_vocab``): "auto" (default;
            the ids shipped with the drafter, unless ``$TFM_DRAFT_VOCAB=0``; on a GPU the full
            vocabulary, ``drafters.draft_vocab_on``), "full" (none), or an ``.npy`` file of target token ids.
        weaver: a Weaver GGUF for ``tree="tfm"`` / ``"dartree"`` (``tfm-train weaver``, ``tfm-convert --weaver``), trained
            for this target; None = none.
        warm_up: run every pass shape the budget can take once at load, and again for new shapes at
            ``set_budget`` (``decode.warmup``: a GPU's first pass of a shape loads its kernels, 10-50 ms
            on the H200, which would otherwise fall inside a generation); None (default) = on a GPU.
        prompt_cache: keep the target's and the drafter's caches after a generation and prefill only what a
            new prompt does not share with the cached tokens (``decode.prompt_cache``: its rules, and a
            recurrent target's exact-prefix case); False = every prompt from position 0. Switch it later
            with ``engine.prompt_cache.enabled``; ``stats.n_cached`` counts the tokens kept.
    Raises:
        ValueError: a bad option (checked before any model is loaded, but ``tree_top_k`` above the
            target's vocabulary, checked once it is).
        ModelNotFoundError / FileNotFoundError: a model cannot be found.
        DrafterMismatchError: the drafter does not fit the target.
    """

    def __init__(self, target: str | os.PathLike | None = None, drafter: str | os.PathLike | None = "auto", *,
                 n_ctx: int = 4096, budget: int | str | None = "auto", kv_type: str = "f16",
                 drafter_kv_type: str = "f16", n_threads: int | None = None, n_gpu_layers: int = -1,
                 tree: str = "chain", tree_top_k: int = 8, tree_width: int = 4, greedy_argmax: str = "auto",
                 draft_vocab: str | os.PathLike = "auto", warm_up: bool | None = None,
                 weaver: str | os.PathLike | None = None, prompt_cache: bool = True):
        from .files.drafters import check_draft_vocab_mode, draft_vocab_on, resolve_drafter
        from .llama.model import gpu_available
        from .files.models import DEFAULT_TARGET, resolve_model

        # bad options fail before any model is loaded
        backend_argmax_wanted(greedy_argmax, False)
        check_draft_vocab_mode(draft_vocab)
        _check_budget(budget)
        method = check_method_options(tree, tree_top_k, tree_width, weaver is not None)
        target_path = resolve_model(target or DEFAULT_TARGET)
        self.target = Target(target_path, n_ctx=n_ctx, kv_type=kv_type, n_threads=n_threads,
                             n_gpu_layers=n_gpu_layers)
        on_gpu = gpu_available() and n_gpu_layers != 0
        self.backend_argmax = backend_argmax_wanted(greedy_argmax, on_gpu)
        self.drafter: DFlashDrafter | None = None
        if drafter is not None and budget != 0:
            dpath = resolve_drafter(drafter, target_path, draft_vocab_on(draft_vocab, on_gpu))
            self.drafter = DFlashDrafter(dpath, self.target, kv_type=drafter_kv_type, n_threads=n_threads,
                                         n_gpu_layers=n_gpu_layers)
        n_vocab = self.target.model.n_vocab
        if int(tree_top_k) > n_vocab:
            self.close()
            raise ValueError(f"tree_top_k must be at most the vocabulary size {n_vocab} (got {tree_top_k})")
        self.tree_top_k, self.tree_width = int(tree_top_k), int(tree_width)
        self.tfm = None  # the loaded Weaver's side of TfM and DARTree steps (decode.weaver.TfmDrafter)
        self.weaver_ms: dict[str, float] = {}  # ms a TfM tree on each device tried at load (GPU machines)
        try:  # what the drafter cannot draft is refused before the Weaver loads
            method.check_models(self.drafter, weaver is not None)
            if weaver is not None and self.drafter is not None:
                from .decode.methods.tfm import load_weaver

                self.tfm, self.weaver_ms = load_weaver(weaver, target_path, self.target, self.drafter, on_gpu,
                                                       n_threads, method.weaver_timing(target_path))
            #: the drafting method (decode.methods): turns each step's drafter pass into its tree
            self.method: DraftMethod = make_method(tree, self.tree_top_k, self.tree_width, drafter=self.drafter,
                                                   weaver=self.tfm, weaver_given=weaver is not None)
            self.method.prepare(self.target)
        except Exception:
            self.close()
            raise
        self.budget = 0
        self.auto: BudgetPolicy | None = None  # the chooser while budget="auto"
        self._pass_costs = PassCosts()       # target pass costs: one machine, shared by every draft shape
        self._auto_states: dict[str, BudgetPolicy] = {}  # per drafting method, kept across set_budget calls
        self.budget_config = GPU if on_gpu else CPU  # the automatic budget's tuning (``decode.budget.config``)
        self._warm = on_gpu if warm_up is None else bool(warm_up)
        self._warmed: set[int] = set()       # verification sizes warmed up (``_warm_up``)
        self._drafter_warmed = False
        #: what the caches hold after the last generation, and what the next may keep (decode.prompt_cache)
        self.prompt_cache = PromptCache(prompt_cache)
        self._generation = 0  # serial of the latest generation started (only it may leave the record)
        self.set_budget(budget)
        self.tok = self.target.tok
        self.stats = GenerationStats()
        #: None, or ``fn(record, stretch)`` after each decode step (timers, traces): ``record`` its ``decode.step.
        #: StepRecord`` (after the statistics and the budget took it); ``stretch``: a plain stretch's step.
        self.on_step = None
        #: the last generation's per-token records when it asked for them (``generate``'s ``logprobs``)
        self.logprobs: list[TokenLogprob] = []
        self._records: list[TokenLogprob] | None = None  # every choice's record (HostChooser.records)

    # -- public API ----------------------------------------------------------------------
    def set_budget(self, budget: int | str | None) -> None:
        """Draft tokens verified per step: None = the default (block size - 1 for the chain,
        ``methods.DEFAULT_TREE_BUDGET`` nodes for trees), 0 = plain decoding (drafter idle), ``"auto"`` =
        chosen per step up to the default (``BudgetPolicy``; its measurements are kept).

        Raises ValueError for a negative budget or an unknown string.
        """
        if self.target is None:
            raise RuntimeError("this Engine is closed")
        _check_budget(budget)
        if isinstance(budget, str):
            self.set_budget(None)
            self.auto = self.budget_policy() if self.drafter is not None else None
            if self._warm:
                self._warm_up(auto=True)
            elif self.drafter is not None and not self._drafter_warmed:  # its first probe's cost must be warm
                self.prompt_cache.forget()  # warm_drafter empties the drafter's cache
                self._drafter_warmed = warm_drafter(self.target, self.drafter, self.auto.draft_costs)
            return
        self.auto = None
        default, max_budget = (self.method.budget_bounds(self.drafter.block_size, self.target.n_batch)
                               if self.drafter is not None else (0, 0))
        b = min(default if budget is None else int(budget), max_budget)
        if self.drafter is not None and (b > 0) != (self.budget > 0):
            self.target.set_features(self.drafter.layers if b > 0 else [])
        self.budget = b
        if self._warm:
            self._warm_up(auto=False)

    def _warm_up(self, auto: bool) -> None:
        """Warm up the verification sizes this budget can use and have not been (every size the
        automatic budget may choose, ``BudgetConfig.budgets``, else one token and the budget's tree) and,
        once, the drafter's passes (``decode.warmup``); the sizes' warm costs go to the automatic
        budget's pass costs."""
        n_max = self.budget + 1 if self.active_drafter is not None else 1
        sizes = {1, n_max}
        if auto and self.auto is not None:  # every size the budget may choose
            sizes |= {int(b) + 1 for b in self.auto.config.budgets(n_max - 1)}
        new = sorted(sizes - self._warmed)
        dft = self.active_drafter if not self._drafter_warmed else None
        if not new and dft is None:
            return
        window = self.budget_config.window if dft is not None else 0
        self.prompt_cache.forget()  # warm_up empties both caches
        warm_up(self.target, dft, new, self._pass_costs, self.backend_argmax,
                inject_rows=window + dft.block_size if dft is not None else 0,
                sampler_rows=n_max if new else 0, top_k=self.tree_top_k)
        self._warmed |= set(new)
        self._drafter_warmed = self._drafter_warmed or dft is not None

    @property
    def tree_mode(self) -> str:
        """The drafting method's name (``Engine(tree=...)``)."""
        return self.method.name

    def set_draft(self, tree: str, budget: int | str | None) -> None:
        """Switch the drafting method (one of ``methods.TREE_SHAPES``, made by ``methods.make_method`` with
        this engine's drafter, Weaver, ``tree_top_k`` and ``tree_width``) and the budget (as ``set_budget``).

        Raises ValueError for an unknown method or one this engine cannot draft (nothing changed) or a bad
        budget (as ``set_budget``; the previous method is restored).
        """
        method = make_method(tree, self.tree_top_k, self.tree_width, drafter=self.drafter, weaver=self.tfm)
        old, self.method = self.method, method
        try:
            self.set_budget(budget)
        except ValueError:
            self.method = old
            raise
        self.method.prepare(self.target)

    def budget_policy(self, method: str | None = None) -> BudgetPolicy:
        """The automatic budget's policy of a drafting method (default: the current one), made at first use and
        kept across ``set_budget`` / ``set_draft`` (gain curves and draft times differ by method; the target's
        pass costs are shared). ``self.auto`` is the current method's while the budget is "auto"."""
        method = self.tree_mode if method is None else method
        if method not in self._auto_states:
            self._auto_states[method] = BudgetPolicy(self.budget_config, costs=self._pass_costs)
        return self._auto_states[method]

    @property
    def active_drafter(self) -> DFlashDrafter | None:
        """The drafter when speculation is on (budget > 0), else None."""
        return self.drafter if self.budget > 0 else None

    @property
    def pass_costs(self) -> PassCosts:
        """The target's measured pass costs (seconds by token count; warm-up and budget steps fill it). Read-only."""
        return self._pass_costs

    def prompt_tokens(self, prompt: str | list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a raw prompt string (special-token text parsed), or of chat ``messages`` rendered
        with the target's template (``encode_chat``: control-token text typed inside a message stays plain
        text) and ``tools`` (OpenAI-style tool definitions, chat only; ValueError with a string)."""
        if isinstance(prompt, str):
            if tools is not None:
                raise ValueError("tools need chat messages, not a plain prompt string")
            return self.tok.encode(prompt, add_special=True)
        return encode_chat(self.target.model, self.tok, list(prompt), tools=tools)

    def generate(self, prompt: str | list[dict], max_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, seed: int | None = None,
                 stop: list[str] | str | None = None, stream: bool = False, *, frequency_penalty: float = 0.0,
                 presence_penalty: float = 0.0, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 logprobs: int | None = None, tools: list[dict] | None = None,
                 grammar: str | None = None) -> Iterator[str] | str:
        """Generate text after ``prompt`` (a string or OpenAI-style chat messages, with ``tools``).

        Returns the text, or with ``stream=True`` an iterator of text pieces. ``self.stats`` holds the
        statistics of the last generation (``n_cached``: prompt tokens the prompt cache kept).
        Penalties, ``grammar`` (GBNF): as ``SamplingParams``'s. ``logprobs``: None = none; n in 0..20 =
        ``self.logprobs`` gets a ``TokenLogprob`` (decode.logprobs) for each token of the text, with its
        ``text_offset`` and its n most likely alternatives, each before the piece that completes its text
        is yielded (the end-of-generation token and tokens after a stop string have none).
        Raises ContextOverflowError (before any work) when the prompt does not fit, ValueError
        for an empty prompt or bad arguments.
        """
        if self.target is None:
            raise RuntimeError("this Engine is closed")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if stop is not None and not isinstance(stop, (str, list, tuple)):
            raise ValueError("stop must be a string or a list of strings")
        sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, grammar=grammar)
        if logprobs is not None:
            check_top_logprobs(logprobs)
        ids = self.prompt_tokens(prompt, tools)
        if not ids:
            raise ValueError("the prompt is empty (no tokens): give some text or a message")
        self.target.check_fits(len(ids))
        stops = [stop] if isinstance(stop, str) else stop
        it = self._text_stream(ids, max_tokens, sp, stops, logprobs)
        return it if stream else "".join(it)

    def generate_ids(self, prompt_ids: list[int], max_tokens: int, sp: SamplingParams,
                     logprobs: int | None = None) -> Iterator[int]:
        """Token ids generated after ``prompt_ids`` (stops after an end-of-generation token, with
        ``stats.finish_reason`` "stop"; "length" when ``max_tokens`` or the context ended it).
        ``logprobs`` (None or 0..20): ``self.logprobs`` gets each yielded token's ``TokenLogprob`` before
        it is yielded (``text_offset`` None). Raises ValueError for bad arguments."""
        out = self.logprobs = []
        for i, t in enumerate(self._ids(prompt_ids, max_tokens, sp, logprobs)):
            if logprobs is not None:
                out.append(self._records[i])
            yield t

    # -- internals -----------------------------------------------------------------------
    def _ids(self, prompt_ids, max_tokens, sp, logprobs) -> Iterator[int]:
        """``generate_ids`` without the records."""
        for t in self._token_stream(prompt_ids, max_tokens, sp, logprobs):
            eog = self.tok.is_eog(t)
            if eog:  # before the yield: a consumer may stop at this token
                self.stats.finish_reason = "stop"
            yield t
            if eog:
                return

    def _text_stream(self, ids, max_tokens, sp, stops, logprobs=None) -> Iterator[str]:
        dec, matcher = StreamDecoder(self.tok), StopMatcher(stops)
        spans, n_out = None, 0  # TokenSpans of the records (logprobs), characters given out
        self.logprobs = []
        for t in self._ids(ids, max_tokens, sp, logprobs):
            if spans is None:  # the records exist from the first token on
                spans = TokenSpans(self._records)
                self.logprobs = spans.out
            if self.tok.is_eog(t):
                self.stats.finish_reason = "stop"
                break
            piece = dec.feed(t)
            spans.decoded(len(piece))
            text, hit = matcher.feed(piece)
            n_out += len(text)
            spans.given_out(n_out, final=hit)
            if text:
                yield text
            if hit:
                self.stats.finish_reason = "stop"
                return
        last = dec.flush()
        tail = matcher.feed(last)[0] + matcher.flush()
        if spans is not None:
            spans.flushed(len(last))
            spans.given_out(n_out + len(tail), final=True)
        if tail:
            yield tail

    def _token_stream(self, prompt_ids: list[int], max_tokens: int, sp: SamplingParams,
                      logprobs: int | None = None) -> Iterator[int]:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if len(prompt_ids) == 0:
            raise ValueError("the prompt is empty (no tokens)")
        self._generation += 1
        serial = self._generation
        st = self.stats = GenerationStats(n_prompt=len(prompt_ids), finish_reason="length")
        t0 = time.perf_counter()
        # penalties, a grammar and log-probabilities need each chosen row on the host (decode.host_choice)
        host = sp.penalised or sp.grammar is not None or logprobs is not None
        choose = HostChooser(sp, prompt_ids, logprobs, self.target.model) if host else TokenChooser(sp)
        self._records = choose.records if logprobs is not None else None
        tgt, dft = self.target, self.active_drafter
        auto = self.auto if dft is not None else None
        captured = False
        if dft is not None:
            # the prompt's features only when this generation may draft (BudgetPolicy.start): the capture
            # is off through a plain stretch, and a probe comes with its own warm-up
            captured = auto.start(max_tokens, self.budget) if auto is not None else True
            set_capture(tgt, dft, captured)
        # what the caches keep of the last generation's tokens (decode.prompt_cache); the drafter, idle or
        # not, keeps only features of tokens the target's cache holds
        reuse = self.prompt_cache.plan(tgt, self.drafter, prompt_ids, captured)
        if self.drafter is not None:
            self.drafter.keep(reuse.drafter)
        st.n_cached = reuse.target
        on_chunk, captured_s = None, [0.0]
        if dft is not None and tgt.feature_layers:
            def on_chunk(s: int, n: int) -> None:
                """The prompt's features into the drafter; timed for the automatic budget
                (BudgetPolicy.observe_prompt) without the target's own pass, while a fixed budget's
                injection is left to overlap the first token's return."""
                if auto is None:
                    dft.inject(tgt.features(slice(0, n), n), s)
                    return
                tgt.ctx.synchronize()
                t = time.perf_counter()
                dft.inject(tgt.features(slice(0, n), n), s)
                dft.ctx.synchronize()
                captured_s[0] += time.perf_counter() - t
        # the target's choice per row in its graph: the argmax (greedy_argmax) or the seeded draw
        if host:
            backend = False
        elif sp.greedy:
            backend = self.backend_argmax and tgt.attach_argmax(self._max_rows())
        else:
            backend = tgt.attach_sampler(sp, choose.seed, self._max_rows())
        seq = list(prompt_ids)  # the prompt and the tokens emitted: the target's cache holds seq[:n_past]
        clean = False           # the caches are consistent where the generation stopped (at a yield)
        left, done, t_verify, t_step = 0, 0, 0.0, 0.0
        try:
            last = (tgt.prefill_choice(prompt_ids, on_chunk, reuse.target) if backend
                    else choose(tgt.prefill(prompt_ids, on_chunk, reuse.target), len(prompt_ids)))
            st.t_prefill = time.perf_counter() - t0
            if on_chunk is not None and auto is not None:
                auto.observe_prompt(captured_s[0])
            st.n_generated = 1
            st.t_total = time.perf_counter() - t0
            seq.append(last)
            clean = True
            yield last
            shape = self.method  # the drafting method; TfM's target state is known after the first verification
            shape.begin()
            # a plain stretch of the automatic budget (BudgetPolicy.stretch) runs plain decoding's own steps
            while st.n_generated < max_tokens and tgt.n_past + 1 <= tgt.n_ctx:
                remaining = max_tokens - st.n_generated
                clean = False
                stretch = left > 0
                if stretch:
                    rec = run_step(tgt, None, shape, 0, None, last, remaining, choose, backend)
                    left, done, t_verify, t_step = left - 1, done + 1, t_verify + rec.t_verify, t_step + rec.t_step
                    if not left:
                        auto.observe_stretch(done, t_verify, t_step)
                        done, t_verify, t_step = 0, 0.0, 0.0
                else:
                    rec = run_step(tgt, dft, shape, self.budget, auto, last, remaining, choose, backend)
                    if auto is not None:
                        left = auto.observe(rec)
                seq.extend(rec.tokens)
                clean = True
                st.add_step(rec)
                if self.on_step is not None:
                    self.on_step(rec, stretch)
                for t in rec.tokens:
                    st.n_generated += 1
                    st.t_total = time.perf_counter() - t0
                    yield t
                    last = t
        finally:  # the generation ended (or its consumer stopped) inside a stretch
            if done:
                auto.observe_stretch(done, t_verify, t_step)
            if serial == self._generation and self.target is not None:
                if clean and tgt.n_past <= len(seq):  # a failure midway leaves the caches unknown
                    self.prompt_cache.remember(tgt, self.drafter, seq[:tgt.n_past])
                else:
                    self.prompt_cache.forget()

    def state_problems(self) -> list[str]:
        """What is inconsistent between the engine's caches after a generation ([] when nothing): the
        target's KV cache must hold exactly its committed positions 0 .. n_past - 1, each once (no hole
        mid-sequence: ``Context.hole_problems``), and the drafter's rows must not run past them and leave
        no hole either (``DFlashDrafter.state_problems``). For soak tests and debugging: it copies the
        caches' state to the host."""
        if self.target is None:
            raise RuntimeError("this Engine is closed")
        tgt, out = self.target, []
        if tgt.ctx.pos_max() != tgt.n_past - 1:
            out.append(f"target: cache holds positions up to {tgt.ctx.pos_max()}, {tgt.n_past} committed")
        out += tgt.ctx.hole_problems("target")
        if self.drafter is not None:
            out += self.drafter.state_problems(tgt.n_past)
        return out

    def _max_rows(self) -> int:
        """The most rows one verification of this generation can have (root + budget drafts)."""
        return min(self.budget + 1, self.target.n_batch) if self.active_drafter is not None else 1

    def close(self) -> None:
        """Free both models and contexts; later calls raise RuntimeError (idempotent)."""
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        if getattr(self, "tfm", None) is not None:
            self.tfm.weaver.close()
            self.tfm = None
        if self.target is not None:
            self.target.close()
            self.target = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
