"""The OpenAI-compatible HTTP API on one speculative Engine (FastAPI routes).

Endpoints: ``GET /health``, ``GET /v1/models``, ``GET /v1/models/{id}``,
``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed as
server-sent events (``stream: true``, ending with ``data: [DONE]``) or not.
Every request is checked before it queues for the Engine (model id, fields,
prompt length against the context), so bad requests are 4xx JSON errors
even when streaming; generations then run one at a time (stream.py).

Chat completions take ``tools`` and ``tool_choice`` when the target's chat template renders tools
(``messages.template_takes_tools``; else they are a 400 unless ``tool_choice`` is "none"): the tools
are rendered into the prompt, and the calls in the answer become ``message.tool_calls``
(tool_calls.py; streamed as ``delta.tool_calls``), with finish_reason "tool_calls". "required" and a
named function are forced: the answer is generated under ``tool_calls.forced_call_grammar``, exactly
one call of that function (or of one of the tools) whose arguments follow its ``parameters`` schema.

``response_format`` (``json_object``, ``json_schema``) and the extension ``grammar`` (GBNF) constrain
the answer of either endpoint with the decode loop's grammar (``SamplingParams.grammar``;
docs/structured-outputs.md); ``Service.answer_grammar`` compiles it before the request queues, so a
bad schema or grammar is a 400 before a stream's first chunk.

``logprobs`` / ``top_logprobs`` (chat) and ``logprobs`` (text completions) add each
token's log-probability under the target in OpenAI's shapes (logprobs.py).
``usage`` carries OpenAI's three counts, ``prompt_tokens_details.cached_tokens``
(the prompt tokens the Engine's prompt cache kept from the last request, not
prefilled again: one slot, so another conversation simply replaces it) and
``tfm``: the speculative decoding statistics of the generation (τ, tokens/s,
the speed-up over plain decoding, time split, the draft budget mode).
``completion_tokens`` counts every token the target emitted, an
end-of-generation token included. Streamed chunks carry the extension field
``x_tfm`` (report.py): on the finishing chunk, and on every text chunk with
``stream_options.x_tfm_live``. ``GET /`` is the chat page (page.py).

A chat conversation that outgrows the context loses its oldest turns, whole
(``conversation.fit_conversation``; the leading system messages and the last
turn stay, and ``conversation.answer_room`` tokens are left for the answer):
the answer then carries the header ``X-TFM-Dropped-Messages: N`` and
``usage.tfm.dropped_messages`` N (0 otherwise). With ``truncate=False``
(``tfm-serve --no-truncate``) nothing is left out and a conversation that
leaves no room for the answer is a 400 ``context_length_exceeded``.
"""
from __future__ import annotations

import time
import uuid
from contextlib import asynccontextmanager
from typing import Sequence

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from ..conversation import ConversationTooLong, answer_room
from ..decode.grammar import GrammarError, json_grammar
from ..decode.stats import GenerationStats
from .errors import APIError, install_handlers, validation_error
from .logprobs import chat_logprobs, completion_logprobs
from .middleware import BearerAuth, BodyLimit
from .messages import template_messages, template_renders_tools, template_takes_tools
from .page import add_page_routes
from .report import live_stats, plain_step_s
from .schemas import TOOL_CHOICE, ChatRequest, CompletionRequest, NamedToolChoice
from .stream import ClosingEventSourceResponse, EngineRunner, sse_body
from .tool_calls import CLOSE, OPEN, ToolCallStream, forced_call_grammar, parse_tool_calls, stream_deltas


#: Response header naming how many of a chat request's messages (its oldest turns) were left out.
DROPPED_HEADER = "X-TFM-Dropped-Messages"


class Service:
    """What the routes share: the runner, the model id, the context size, whether the chat template
    renders tool use in messages (``tools_ok``) and a request's tools (``tools_rendered``), and whether
    old turns are left out of a long conversation.

    Args:
        engine: a loaded Engine (closed by the app's shutdown).
        model_name: the id reported by /v1/models and required in requests.
        truncate: leave the oldest turns out of a chat that outgrows the context (else refuse it).
    """

    def __init__(self, engine, model_name: str, truncate: bool = True):
        self.runner = EngineRunner(engine)
        self.tok = engine.tok
        self.model_name = model_name
        self.truncate = truncate
        self.n_ctx = engine.target.n_ctx
        self.created = int(time.time())
        self.budget = "auto" if engine.auto is not None else engine.budget
        self.plain_only = engine.active_drafter is None and engine.auto is None  # every step a plain step
        self.tree = "plain" if self.plain_only else engine.tree_mode
        template = engine.target.model.meta("tokenizer.chat_template")
        self.tools_ok = template_renders_tools(template)
        self.tools_rendered = template_takes_tools(template)
        # a forced call's tags as the vocabulary's own tokens where it has them (Qwen2.5's <tool_call>)
        self.special_tags = all(len(engine.tok.encode(t, add_special=False)) == 1 for t in (OPEN, CLOSE))

    # -- checks made before a request queues --------------------------------------------
    def check_model(self, model: str) -> None:
        """Raise a 404 unless ``model`` is the served id."""
        if model != self.model_name:
            raise APIError(404, f"The model '{model}' does not exist; this server serves '{self.model_name}' "
                           "(GET /v1/models).", param="model", code="model_not_found")

    @staticmethod
    def check_supported(req) -> None:
        """Raise a 400 for a field whose value this server cannot honour (n > 1, tools...), or for
        ``top_logprobs`` without ``logprobs`` true (OpenAI's rule)."""
        if getattr(req, "top_logprobs", None) is not None and not req.logprobs:
            raise APIError(400, "'top_logprobs' needs 'logprobs' set to true.", param="top_logprobs",
                           code="invalid_value")
        name = req.unsupported()
        if name is None:
            return
        how = "leave it out."
        if name in TOOL_CHOICE or name in TOOL_CHOICE.values():
            how = ("it has no function calling here (chat completions take 'tools'). Leave out 'tools' and "
                   "'tool_choice', or send \"tool_choice\": \"none\" to have the tools ignored and a text answer.")
            if name in ("functions", "function_call"):
                how = ("it has no legacy function calling: send 'tools' instead, or \"function_call\": \"none\" "
                       "to have the functions ignored and a text answer (tool_choice works the same way).")
        raise APIError(400, f"'{name}' is not supported by this server; {how}", param=name,
                       code="unsupported_parameter")

    def chat_tools(self, req: ChatRequest) -> list[dict] | None:
        """The tool definitions the chat template renders for ``req``: None when there are none to
        render (no tools, or ``tool_choice`` "none": the tools are ignored).

        Raises APIError 400: tools or a forced ``tool_choice`` ("required", a named function) when the
        template does not render tools (unsupported_parameter); a forced ``tool_choice`` without
        tools, a named function not among them, or two tools of one name (invalid_value).
        """
        tools, choice = req.tools or [], req.tool_choice
        if not self.tools_rendered:
            if (tools and choice != "none") or req.forces_call():
                param = "tools" if tools else "tool_choice"
                raise APIError(400, f"'{param}' is not supported with this model: its chat template does not "
                               "render tools, so there is no function calling. Leave out 'tools' and "
                               "'tool_choice', or send \"tool_choice\": \"none\" to have the tools ignored and a "
                               "text answer.", param=param, code="unsupported_parameter")
            return None
        names = [t.function.name for t in tools]
        if req.forces_call() and not tools:
            raise APIError(400, "'tool_choice' asks for a tool call, but 'tools' lists none; send the tools too.",
                           param="tool_choice", code="invalid_value")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise APIError(400, f"'tool_choice.function.name': {choice.function.name!r} is not among the "
                           f"'tools' ({', '.join(names)}).", param="tool_choice.function.name",
                           code="invalid_value")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise APIError(400, f"'tools' names {', '.join(map(repr, twice))} more than once; each function "
                           "needs a name of its own.", param="tools", code="invalid_value")
        if not tools or choice == "none":
            return None
        return [t.definition() for t in tools]

    async def answer_grammar(self, req, tools: list[dict] | None = None) -> str | None:
        """The GBNF the answer must follow, None for free text: a forced call's (``tools``: the chat tools
        rendered, and ``tool_choice`` "required" or a named function; any ``response_format`` is then
        moot, as a call has no text), else the request's ``grammar``, else its ``response_format``'s
        (``json_object``: any JSON object; ``json_schema``: the schema's values).

        The grammar is compiled against the target's vocabulary here, before the request queues.
        Raises APIError 400 (invalid_value): ``grammar`` beside a non-text ``response_format`` or a
        forced call, a schema the converter refuses, a grammar llama.cpp cannot parse.
        """
        fmt = req.response_format if req.response_format is not None and req.response_format.type != "text" else None
        forced = tools is not None and req.forces_call()
        if req.grammar is not None and (fmt is not None or forced):
            other = "'response_format'" if fmt is not None else "a forced 'tool_choice'"
            raise APIError(400, f"'grammar' and {other} both constrain the answer; send one of them.",
                           param="grammar", code="invalid_value")
        try:
            if forced:
                param = "tools"
                name = req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else None
                gbnf = forced_call_grammar(tools, name, self.special_tags)
            elif req.grammar is not None:
                param, gbnf = "grammar", req.grammar
            elif fmt is not None:
                schema = fmt.json_schema.json_schema if fmt.type == "json_schema" else None
                param = "response_format.json_schema.schema" if schema is not None else "response_format"
                gbnf = json_grammar(schema)
            else:
                return None
            await self.runner.check_grammar(gbnf)
        except GrammarError as e:
            what = "a tool's 'parameters' schema" if param == "tools" else f"'{param}'"
            raise APIError(400, f"Invalid value for {what}: {e}.", param=param, code="invalid_value") from None
        return gbnf

    @staticmethod
    def completion_prompt(req: CompletionRequest) -> str:
        """The prompt string (a list must hold exactly one string)."""
        if isinstance(req.prompt, str):
            return req.prompt
        if len(req.prompt) != 1:
            raise APIError(400, "'prompt' must be a string or a list of exactly one string "
                           "(one completion per request).", param="prompt", code="invalid_value")
        return req.prompt[0]

    async def token_budget(self, prompt: str | list[dict], limit: int | None, param: str,
                           tools: list[dict] | None = None) -> int:
        """The max_tokens to generate: ``limit``, cut to what the context leaves after the prompt
        (rendered with ``tools`` when given; all of it when ``limit`` is None). A cut answer ends with
        finish_reason "length", as with llama.cpp's server and Ollama.

        Raises a 400 (code context_length_exceeded) when the prompt leaves no room to generate;
        a 400 when it holds no tokens or the template rejects the messages. ``param`` names the
        prompt's field in the errors ("messages" or "prompt").
        """
        try:
            n_prompt = len(await self.runner.prompt_tokens(prompt, tools))
        except ValueError as e:  # ChatTemplateError
            raise APIError(400, str(e), param=param, code="invalid_value") from None
        if n_prompt == 0:
            raise APIError(400, f"'{param}' holds no tokens; send some text.", param=param, code="invalid_value")
        room = self.n_ctx - n_prompt
        if room < 1:
            hint = (" (this server was started with --no-truncate: without it, the oldest turns would be left "
                    "out)") if param == "messages" and not self.truncate else ""
            raise APIError(400, f"This model's maximum context length is {self.n_ctx} tokens; '{param}' came to "
                           f"{n_prompt} tokens, and at least 1 must be left for the answer. Shorten '{param}'"
                           f"{hint}.", param=param, code="context_length_exceeded")
        return room if limit is None else min(limit, room)

    async def fit_chat(self, messages: list[dict], limit: int | None,
                       tools: list[dict] | None = None) -> tuple[list[dict], int]:
        """``messages`` without the oldest turns that do not fit with room for the answer (``limit``
        tokens, or ``conversation.answer_room``'s share when None) beside the rendered ``tools`` (when
        given), and how many messages were left out;
        ``messages`` unchanged and 0 when the service does not truncate.

        Raises a 400 (code context_length_exceeded) when the system messages and the last turn alone
        leave no room for the answer; a 400 when the template rejects the messages.
        """
        if not self.truncate:
            return messages, 0
        try:
            fitted = await self.runner.fit(messages, answer_room(self.n_ctx, limit), tools)
        except ConversationTooLong as e:
            what = "the system messages and the last turn of 'messages'" if e.n_dropped else "'messages'"
            raise APIError(400, f"This model's maximum context length is {self.n_ctx} tokens; {what} came to "
                           f"{e.n_tokens} tokens, and at least 1 must be left for the answer. Shorten the last "
                           "message.", param="messages", code="context_length_exceeded") from None
        except ValueError as e:  # ChatTemplateError
            raise APIError(400, str(e), param="messages", code="invalid_value") from None
        return fitted.messages, fitted.n_dropped

    # -- responses ----------------------------------------------------------------------
    def x_tfm(self, stats: GenerationStats) -> dict:
        """The ``x_tfm`` statistics (report.py) of a generation so far; read between pieces."""
        engine = self.runner.engine
        plain_s = plain_step_s(engine) if engine is not None and not self.plain_only else None
        return live_stats(stats, plain_s, self.plain_only)

    def usage(self, stats: GenerationStats, dropped: int = 0) -> dict:
        """OpenAI usage counts (the prompt's cached tokens in ``prompt_tokens_details``) plus ``tfm``: τ,
        tokens/s, the speed-up over plain decoding and plain decoding's tokens/s (report.py), seconds
        (prefill, draft, verify, total), budget, and ``dropped_messages`` (the oldest messages of the
        conversation left out, ``fit_chat``)."""
        x = self.x_tfm(stats)
        return {"prompt_tokens": stats.n_prompt, "completion_tokens": stats.n_generated,
                "total_tokens": stats.n_prompt + stats.n_generated,
                "prompt_tokens_details": {"cached_tokens": stats.n_cached},
                "tfm": {"tau": round(stats.tau, 4), "tokens_per_s": round(stats.tokens_per_s, 2),
                        "speedup": x["speedup"], "plain_tokens_per_s": x["plain_tokens_per_s"],
                        "prefill_s": round(stats.t_prefill, 6), "draft_s": round(stats.t_draft, 6),
                        "verify_s": round(stats.t_verify, 6), "total_s": round(stats.t_total, 6),
                        "drafted_tokens": stats.n_drafted, "verify_passes": stats.n_steps,
                        "budget": self.budget, "tree": self.tree, "dropped_messages": dropped}}

    async def run(self, request: Request, prompt, max_tokens: int,
                  kwargs: dict) -> tuple[str, GenerationStats, list] | None:
        """A whole generation → (text, stats, per-token records); None when the client went away (the
        generation is stopped). The records are ``Engine.logprobs`` ([] unless ``kwargs`` asks for them)."""
        parts: list[str] = []
        async with self.runner.generation(prompt, max_tokens, **kwargs) as gen:
            async for piece in gen:
                parts.append(piece)
                if await request.is_disconnected():
                    return None
        return "".join(parts), gen.stats, gen.new_records()


async def parse_body(request: Request, model: type[BaseModel]):
    """The request body validated as ``model`` (JSON whatever the Content-Type says).

    Raises APIError 400 for malformed JSON, a non-object body, missing fields or wrong types.
    """
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def finish_reason(generation: str, called: bool) -> str:
    """A chat answer's finish_reason: "tool_calls" when it made a call and the generation stopped by
    itself ("stop": an end-of-generation token or a stop string), else the generation's ("stop",
    "length": an answer cut at max_tokens or the context stays "length", calls or not)."""
    return "tool_calls" if called and generation == "stop" else generation


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def create_app(engine, model_name: str, api_key: str | None = None, max_body_bytes: int | None = None,
               cors_origins: Sequence[str] = (), truncate: bool = True) -> FastAPI:
    """The FastAPI application serving ``engine`` as model ``model_name``.

    ``truncate``: a chat conversation that outgrows the context loses its oldest turns (the module doc);
    False refuses it (a 400 when it leaves no room for the answer).
    ``api_key``: when set, /v1 paths need ``Authorization: Bearer <api_key>``.
    ``max_body_bytes``: when set, a request body over this many bytes is a 413 error, refused from
    its Content-Length before it is read, or once the bytes read pass the limit (chunked bodies).
    ``cors_origins``: web origins (``"http://localhost:3000"``, ``"*"``) whose pages may call the API
    from a browser (Starlette's CORSMiddleware: GET and POST, any request header, no cookies, the
    dropped-messages header readable);
    preflight requests need no key, and every answer, errors included, carries the CORS headers.
    The app closes the Engine at shutdown (after the running generation ends).
    """
    svc = Service(engine, model_name, truncate)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await svc.runner.aclose()

    app = FastAPI(title="tfm-serve", description="OpenAI-compatible API on a speculative llama.cpp engine",
                  lifespan=lifespan)
    app.state.service = svc
    install_handlers(app)
    add_page_routes(app)
    if max_body_bytes is not None:  # inside BearerAuth: a request without the key is a 401 whatever its size
        app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    if cors_origins:  # added last: outermost, so it answers preflights and marks the 401 / 413 answers too
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"], expose_headers=[DROPPED_HEADER])

    def model_card() -> dict:
        return {"id": svc.model_name, "object": "model", "created": svc.created, "owned_by": "tfm-local",
                "context_length": svc.n_ctx}

    @app.get("/health")
    async def health() -> dict:
        """Liveness and counters: status, model, busy (a generation runs or waits), waiting (how many
        requests hold or wait for the Engine), finished and cancelled generations since start (no API
        key needed)."""
        r = svc.runner
        return {"status": "ok", "model": svc.model_name, "busy": r.busy, "waiting": r.n_waiting,
                "finished": r.n_finished, "cancelled": r.n_cancelled}

    @app.get("/v1/models")
    async def list_models() -> dict:
        """The one served model."""
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str) -> dict:
        """The served model's card; 404 for any other id."""
        svc.check_model(model)
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        """Chat completion with the target's chat template; streamed when ``stream`` is true."""
        req = await parse_body(request, ChatRequest)
        svc.check_model(req.model)
        svc.check_supported(req)
        tools = svc.chat_tools(req)
        messages, dropped = await svc.fit_chat(template_messages(req.messages, svc.tools_ok), req.token_limit(),
                                               tools)
        max_tokens = await svc.token_budget(messages, req.token_limit(), "messages", tools)
        headers = {DROPPED_HEADER: str(dropped)} if dropped else {}
        kwargs = req.sampling_kwargs()
        if tools is not None:
            kwargs["tools"] = tools
        grammar = await svc.answer_grammar(req, tools)
        if grammar is not None:
            kwargs["grammar"] = grammar
        names = frozenset(t["function"]["name"] for t in tools or ())  # fenced calls must name one
        cid, created = _new_id("chatcmpl"), int(time.time())
        with_logprobs = kwargs["logprobs"] is not None

        def logprobs(records) -> dict | None:
            return chat_logprobs(svc.tok, records) if with_logprobs else None

        def chunk(delta: dict, finish: str | None, records=None) -> dict:
            """A chunk; ``records``: its tokens' (None, or [] in the last chunk: ``logprobs`` null)."""
            lp = logprobs(records) if records is not None and (records or finish is None) else None
            c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": svc.model_name,
                 "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
            if req.include_usage():
                c["usage"] = None
            return c

        if req.stream:
            live = req.live_stats()
            calls = ToolCallStream(names) if tools is not None else None  # None: the text is not parsed

            async def chunks():
                async with svc.runner.generation(messages, max_tokens, **kwargs) as gen:
                    yield chunk({"role": "assistant", "content": ""}, None)
                    async for piece in gen:
                        for delta in [{"content": piece}] if calls is None else stream_deltas(calls.feed(piece)):
                            c = chunk(delta, None, gen.new_records())
                            if live:
                                c["x_tfm"] = svc.x_tfm(gen.running)
                            yield c
                    for delta in [] if calls is None else stream_deltas(calls.finish()):
                        yield chunk(delta, None, gen.new_records())
                finish = finish_reason(gen.stats.finish_reason, calls is not None and calls.n_calls > 0)
                yield {**chunk({}, finish, gen.new_records()), "x_tfm": svc.x_tfm(gen.stats)}
                if req.include_usage():
                    yield {**chunk({}, None), "choices": [], "usage": svc.usage(gen.stats, dropped)}
            return ClosingEventSourceResponse(sse_body(chunks()), headers=headers)

        done = await svc.run(request, messages, max_tokens, kwargs)
        if done is None:
            return JSONResponse({}, status_code=499)  # nobody is listening
        text, stats, records = done
        message = {"role": "assistant", "content": text, "refusal": None}
        calls = []
        if tools is not None:
            message["content"], calls = parse_tool_calls(text, names)
        if calls:
            message["tool_calls"] = [c.message_entry() for c in calls]
        return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": svc.model_name,
                             "choices": [{"index": 0, "message": message, "logprobs": logprobs(records),
                                          "finish_reason": finish_reason(stats.finish_reason, bool(calls))}],
                             "usage": svc.usage(stats, dropped)}, headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request):
        """Text completion of a raw prompt (no chat template); streamed when ``stream`` is true."""
        req = await parse_body(request, CompletionRequest)
        svc.check_model(req.model)
        svc.check_supported(req)
        prompt = svc.completion_prompt(req)
        max_tokens = await svc.token_budget(prompt, req.token_limit(), "prompt")
        kwargs = req.sampling_kwargs()
        grammar = await svc.answer_grammar(req)
        if grammar is not None:
            kwargs["grammar"] = grammar
        cid, created = _new_id("cmpl"), int(time.time())

        def logprobs(records) -> dict | None:
            return completion_logprobs(svc.tok, records, len(prompt)) if kwargs["logprobs"] is not None else None

        def chunk(text: str, finish: str | None, records=None) -> dict:
            c = {"id": cid, "object": "text_completion", "created": created, "model": svc.model_name,
                 "choices": [{"index": 0, "text": text, "logprobs": logprobs(records or []),
                              "finish_reason": finish}]}
            if req.include_usage():
                c["usage"] = None
            return c

        if req.stream:
            live = req.live_stats()

            async def chunks():
                async with svc.runner.generation(prompt, max_tokens, **kwargs) as gen:
                    async for piece in gen:
                        c = chunk(piece, None, gen.new_records())
                        if live:
                            c["x_tfm"] = svc.x_tfm(gen.running)
                        yield c
                yield {**chunk("", gen.stats.finish_reason, gen.new_records()), "x_tfm": svc.x_tfm(gen.stats)}
                if req.include_usage():
                    yield {**chunk("", None), "choices": [], "usage": svc.usage(gen.stats)}
            return ClosingEventSourceResponse(sse_body(chunks()))

        done = await svc.run(request, prompt, max_tokens, kwargs)
        if done is None:
            return JSONResponse({}, status_code=499)
        text, stats, records = done
        return {"id": cid, "object": "text_completion", "created": created, "model": svc.model_name,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs(records),
                             "finish_reason": stats.finish_reason}],
                "usage": svc.usage(stats)}

    return app
