"""One Engine behind an async server: generations one at a time, pieces pulled in a worker thread, SSE.

The Engine holds one KV cache, so two generations must never interleave.
``EngineRunner.generation`` takes an asyncio lock (FIFO: waiting requests are
served in the order they asked) for the whole life of one generation, and
hands out a ``Generation``, an async iterator whose every ``__anext__`` runs
one step of the Engine's blocking text iterator in the runner's one worker
thread (always the same thread: llama.cpp's CPU backend keeps an OpenMP
thread team per calling thread, and the teams of several callers spin
against each other: through anyio's thread pool, 500 tokens of the tiny
test model took 119 s instead of 0.8 s on a busy 2-core machine). Leaving
the ``async with`` block — at the end, on an error, or because the client
went away and the task was cancelled — closes the Engine's iterator and
releases the lock. A cancelled pull waits for the step running in the
thread to finish, so the Engine is idle whenever the lock is free.

``EngineRunner.stop`` (the server is shutting down) makes the running
generation end before its next piece, with a 503 APIError (an error event
when streaming), and every request still waiting for the Engine a 503.

``ClosingEventSourceResponse`` is the streaming response: when the client
disconnects, Starlette cancels the transfer with the body generator
suspended; this response closes the generator explicitly (shielded from the
cancellation), so the lock is released at once rather than whenever the
generator is garbage-collected.
"""
from __future__ import annotations

import asyncio
import json
from contextlib import aclosing, asynccontextmanager
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import AsyncIterator, Callable, Iterator, TypeVar

import anyio
import anyio.to_thread
from fastapi.sse import EventSourceResponse, format_sse_event

from ..decode.stats import GenerationStats
from ..decode.verify import ContextOverflowError
from .errors import APIError, internal_error, log

_END = object()
T = TypeVar("T")


def shutting_down() -> APIError:
    """The 503 for a generation stopped or refused because the server is shutting down."""
    return APIError(503, "The server is shutting down; this generation was stopped or not started.",
                    type="server_error", code="server_shutting_down")


class Generation:
    """The text pieces of one running generation, as an async iterator.

    ``stats`` is the Engine's GenerationStats once the iterator is exhausted
    (None before); ``stats.finish_reason`` is "stop" or "length". ``running``
    is the same object while the generation runs (read it between pieces).
    """

    def __init__(self, runner: "EngineRunner", engine, pieces: Iterator[str]):
        self._runner, self._engine, self._pieces = runner, engine, pieces
        self.stats: GenerationStats | None = None
        self._n_records = 0

    def new_records(self) -> list:
        """The per-token records (``Engine.logprobs``) given out since the last call: those of the
        tokens of the pieces pulled so far (empty unless the generation asked for log-probabilities)."""
        records = self._engine.logprobs
        out, self._n_records = records[self._n_records:], len(records)
        return out

    def __aiter__(self) -> "Generation":
        return self

    @property
    def running(self) -> GenerationStats:
        """The generation's statistics so far (the Engine's ``stats``; valid once a piece was pulled, and
        read while no step runs: between pieces)."""
        return self._engine.stats

    async def __anext__(self) -> str:
        if self._runner.stopping:
            raise shutting_down()
        piece = await self._runner.call(next, self._pieces, _END)
        if piece is _END:
            self.stats = self._engine.stats
            raise StopAsyncIteration
        return piece


class EngineRunner:
    """Serialises generations on one Engine (see the module docstring).

    Args:
        engine: a loaded ``tfm_local.engine.Engine``; this runner closes it in ``aclose``.
    """

    def __init__(self, engine):
        self.engine = engine
        self._lock = asyncio.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfm-engine")
        self.n_waiting = 0    # requests queued or running
        self.n_finished = 0   # generations that ran to their end (stop or length)
        self.n_cancelled = 0  # generations stopped early (client gone, error, shutdown)
        self.stopping = False

    async def call(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` in the Engine's worker thread.

        A cancellation is seen at once but re-raised only after ``fn`` returns, so the Engine is never
        left mid-step. (A wait shielded from the start would starve the cancellation: with the
        client gone, uvicorn's ``send`` returns without suspending, so the task would only ever
        suspend inside the shield.)
        """
        waiter = asyncio.wrap_future(self._thread.submit(fn, *args))
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            with anyio.CancelScope(shield=True):
                await asyncio.wait([waiter])
            if not waiter.cancelled() and waiter.exception() is not None:
                log.debug("engine call ended with %r after a cancellation", waiter.exception())
            raise

    @property
    def busy(self) -> bool:
        """True while a generation runs or waits."""
        return self.n_waiting > 0

    def stop(self) -> None:
        """Stop serving: the running generation ends before its next piece, waiting ones are refused
        (503 ``server_shutting_down``). It only sets a flag, so a signal handler may call it."""
        self.stopping = True

    def _live(self):
        if self.stopping or self.engine is None or self.engine.target is None:
            raise shutting_down()
        return self.engine

    async def prompt_tokens(self, prompt: str | list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of ``prompt`` (text, or messages rendered with the chat template, with ``tools`` when
        given: ``Engine.prompt_tokens``), in a worker thread.

        Tokenizing reads only the vocabulary, so it runs without the lock, beside a generation.
        Raises ValueError (ChatTemplateError) when the template rejects the messages.
        """
        return await anyio.to_thread.run_sync(self._live().prompt_tokens, prompt, tools)

    async def check_grammar(self, gbnf: str) -> None:
        """Compile ``gbnf`` against the target's vocabulary and free it, in a worker thread without the
        lock (it reads only the vocabulary). Raises ``decode.grammar.GrammarError`` when llama.cpp cannot
        parse it."""
        from ..decode.grammar import Grammar

        model = self._live().target.model
        await anyio.to_thread.run_sync(lambda: Grammar(model, gbnf).close())

    async def fit(self, messages: list[dict], reserve: int, tools: list[dict] | None = None):
        """``conversation.fit_conversation`` of ``messages`` (rendered with ``tools`` when given) in this
        Engine's context, leaving ``reserve`` tokens for the answer; in a worker thread, without the lock
        (it only tokenizes, as ``prompt_tokens``). Returns a ``conversation.Fitted``.

        Raises ConversationTooLong (the last turn alone does not fit), ValueError (ChatTemplateError).
        """
        from ..conversation import fit_conversation

        engine = self._live()
        return await anyio.to_thread.run_sync(fit_conversation, messages, lambda m: len(engine.prompt_tokens(m, tools)),
                                              engine.target.n_ctx, reserve)

    @asynccontextmanager
    async def generation(self, prompt: str | list[dict], max_tokens: int, **kwargs) -> AsyncIterator[Generation]:
        """Hold the Engine for one generation: ``async with runner.generation(...) as gen: async for piece in gen``.

        ``kwargs`` go to ``Engine.generate`` (temperature, top_p, top_k, min_p, seed, stop, penalties, logprobs,
        tools, grammar).
        Raises APIError: 400 for what ``Engine.generate`` refuses (ValueError, ContextOverflowError)
        before the first piece, 503 once the runner is stopped or closed (also from the iterator).
        """
        self.n_waiting += 1
        try:
            async with self._lock:
                engine = self._live()
                try:
                    pieces = await self.call(
                        partial(engine.generate, prompt, max_tokens=max_tokens, stream=True, **kwargs))
                except ValueError as e:  # bad sampling values, ContextOverflowError, template errors
                    overflow = isinstance(e, ContextOverflowError)
                    raise APIError(400, str(e), code="context_length_exceeded" if overflow else "invalid_value") \
                        from None
                gen = Generation(self, engine, pieces)
                try:
                    yield gen
                finally:
                    pieces.close()  # runs the Engine iterator's cleanup; no step is in flight here
                    if gen.stats is None:
                        self.n_cancelled += 1
                    else:
                        self.n_finished += 1
        finally:
            self.n_waiting -= 1

    async def aclose(self, timeout: float = 30.0) -> None:
        """Close the Engine once the running generation (if any) ends; give up after ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            async with self._lock:
                if self.engine is not None:
                    await self.call(self.engine.close)
                    self.engine = None
        self._thread.shutdown(wait=False)


def sse_event(data: dict | str) -> bytes:
    """One server-sent event: ``data: <JSON>`` (or the raw string, for ``[DONE]``) and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return format_sse_event(data_str=text)


async def sse_body(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """Encode ``chunks`` as server-sent events ending with ``data: [DONE]``.

    An error after the stream began (the status line is already sent) becomes one last
    ``data: {"error": {...}}`` event instead of ``[DONE]``; the ``openai`` client raises it.
    ``chunks`` is closed explicitly when this generator is, so its ``async with`` blocks exit at once.
    """
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                yield sse_event(chunk)
        except APIError as e:
            yield sse_event(e.body())
            return
        except Exception as e:  # an engine failure mid-stream: report it, keep serving
            log.exception("internal error while streaming")
            yield sse_event(internal_error(e).body())
            return
    yield sse_event("[DONE]")


class ClosingEventSourceResponse(EventSourceResponse):
    """``text/event-stream`` response whose body generator is always closed when the response ends."""

    def __init__(self, content: AsyncIterator[bytes], **kwargs):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **kwargs.pop("headers", {})}
        super().__init__(content, headers=headers, **kwargs)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
