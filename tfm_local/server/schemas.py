"""Request bodies of the OpenAI-compatible endpoints (pydantic models, strict types).

Only the fields the engine can honour are declared; other OpenAI fields are
accepted and ignored (clients send many), except the few in
``UNSUPPORTED`` and ``TOOL_CHOICE`` whose non-default values would change
the answer's meaning (several choices, legacy functions to call, logit biases): those are
refused with a 400 rather than silently dropped. Chat completions declare ``tools`` and
``tool_choice`` (app.py decides whether the model's template can render them).

Types are strict: ``"max_tokens": "5"`` or ``1.5`` is a 400, not a coercion.
An explicit ``null`` for an optional field means the field is left out, as
in OpenAI's API (``"stream": null`` is no stream); for a required field it
is a 400.
Ranges follow OpenAI (temperature 0..2, top_p 0..1, penalties -2..2, top_logprobs
0..20). ``top_k``, ``min_p``, ``repeat_penalty`` and ``repeat_last_n`` are
extensions, as in llama.cpp's server; text completions take ``logprobs`` up to 20
(OpenAI's limit there is 5). Both endpoints take ``response_format`` (text, ``json_object``,
``json_schema``) and the extension ``grammar`` (GBNF text, as llama.cpp's server takes it); app.py
turns them into the generation's grammar (docs/structured-outputs.md).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..decode.logprobs import MAX_TOP_LOGPROBS

#: The largest max_tokens accepted (16 Mi tokens, beyond any context): a larger value is a client's error.
#: Within it, a max_tokens past the end of the context is cut to what the context leaves (app.py).
MAX_TOKENS = 1 << 24

#: Field → the values that mean "off" (None always does); any other value is refused as unsupported.
UNSUPPORTED = {"n": (1,), "tool_choice": ("none", "auto"), "function_call": ("none", "auto"),
               "best_of": (1,), "echo": (False,), "suffix": ("",), "logit_bias": ({},)}

#: Function calling where a request does not declare it (text completions; chat's legacy ``functions``):
#: a non-empty tool list is refused unless its choice field is "none", which tells the model not to call
#: them: the tools are then ignored. (``ChatRequest`` declares ``tools`` / ``tool_choice``, so they are
#: not extra fields there.)
TOOL_CHOICE = {"tools": "tool_choice", "functions": "function_call"}


class _Body(BaseModel):
    """A JSON object of a request: strict types, unknown fields ignored, null = an optional field left out."""

    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        """``data`` without the null values of optional fields (and of unknown ones); a required field's
        null stays, to fail its type check."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or (k in fields and fields[k].is_required())}


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage (and no choices);
    ``x_tfm_live`` (an extension) puts the running decoding statistics, ``x_tfm`` (report.py), on every
    chunk that carries text."""

    include_usage: bool = False
    x_tfm_live: bool = False


class TextPart(_Body):
    """One ``{"type": "text", "text": ...}`` part of a message's content."""

    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    """The function of a tool call: its name and ``arguments`` (a JSON string, or an object)."""

    name: str
    arguments: Union[str, dict[str, Any]] = "{}"


class ToolCall(_Body):
    """One tool call of an earlier assistant message (``messages[i].tool_calls``)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(_Body):
    """A function the model may call: ``name``, ``description`` and ``parameters`` (a JSON schema of its
    arguments object); ``strict`` is passed on to the template, not enforced."""

    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _arguments_are_an_object(self):
        kind = (self.parameters or {}).get("type", "object")
        if kind != "object":  # OpenAI's rule too: the arguments are one JSON object
            raise ValueError(f"the parameters of {self.name!r} must be a JSON schema of type \"object\", "
                             f"got type {kind!r}")
        return self


class Tool(_Body):
    """One entry of ``tools``: ``{"type": "function", "function": FunctionDef}``."""

    type: Literal["function"]
    function: FunctionDef

    def definition(self) -> dict:
        """The tool as the chat template gets it (OpenAI's shape, fields left out when not given)."""
        return self.model_dump(exclude_none=True)


class FunctionName(_Body):
    """``{"name": ...}`` of a named ``tool_choice``."""

    name: str


class NamedToolChoice(_Body):
    """``tool_choice`` naming the function to call: ``{"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"]
    function: FunctionName


class Message(_Body):
    """One chat message; ``content`` is a string or a list of text parts (images are refused).

    ``tool_calls`` (assistant) and ``tool_call_id`` (role "tool") carry earlier tool use (messages.py).
    """

    role: str
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined without separator; None → "")."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class JSONSchemaFormat(_Body):
    """``response_format.json_schema``: ``name`` (required, as OpenAI requires it), ``description``,
    ``schema`` (the JSON schema of the answer; left out: any JSON object) and ``strict`` (accepted; the
    grammar always enforces the schema)."""

    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}`` (a JSON
    object) or ``{"type": "json_schema", "json_schema": JSONSchemaFormat}`` (a JSON value of the schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("'json_schema' is required when 'type' is \"json_schema\"")
        return self


class _Sampling(_Body):
    """Fields shared by chat and text completions."""

    model_config = ConfigDict(strict=True, extra="allow")
    model: str
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    seed: int | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    repeat_last_n: Annotated[int, Field(ge=-1)] | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None

    def constrained(self) -> bool:
        """True when ``response_format`` or ``grammar`` asks for constrained output (not plain text)."""
        return self.grammar is not None or (self.response_format is not None and self.response_format.type != "text")

    def include_usage(self) -> bool:
        """True when a streamed answer ends with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def live_stats(self) -> bool:
        """True when every streamed chunk with text carries ``x_tfm`` (``stream_options.x_tfm_live``)."""
        return bool(self.stream and self.stream_options and self.stream_options.x_tfm_live)

    def unsupported(self) -> str | None:
        """Name of the first field set to a value this server cannot honour, else None."""
        extra = self.model_extra or {}
        for name, choice in TOOL_CHOICE.items():
            if extra.get(name) and extra.get(choice) != "none":
                return name
        for name, off in UNSUPPORTED.items():
            value = extra.get(name)
            if value is not None and not any(value == v and isinstance(value, bool) == isinstance(v, bool)
                                             for v in off):
                return name
        return None

    def sampling_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Engine.generate``: temperature, top_p, top_k, min_p, seed, stop, the
        penalties and ``logprobs`` (the alternatives per token, None when log-probabilities are off).

        top_p = 0 keeps only the most likely token, i.e. greedy decoding. A
        negative seed is mapped into the unsigned 64-bit range numpy accepts.
        """
        temperature = 1.0 if self.temperature is None else self.temperature
        top_p = 1.0 if self.top_p is None else self.top_p
        if top_p == 0:
            temperature, top_p = 0.0, 1.0
        seed = None if self.seed is None else self.seed % (1 << 64)
        return dict(temperature=temperature, top_p=top_p, top_k=self.top_k or 0, min_p=self.min_p or 0.0,
                    seed=seed, stop=self.stop, frequency_penalty=self.frequency_penalty or 0.0,
                    presence_penalty=self.presence_penalty or 0.0,
                    repeat_penalty=1.0 if self.repeat_penalty is None else self.repeat_penalty,
                    repeat_last_n=64 if self.repeat_last_n is None else self.repeat_last_n,
                    logprobs=self.n_logprobs())

    def n_logprobs(self) -> int | None:
        """The alternatives per token when log-probabilities are asked for, else None."""
        raise NotImplementedError


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` is OpenAI's newer name for ``max_tokens``."""

    messages: list[Message]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice] | None = None

    def forces_call(self) -> bool:
        """True when ``tool_choice`` asks for a call: "required" or a named function."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)

    def n_logprobs(self) -> int | None:
        """``top_logprobs`` (0 when not given) when ``logprobs`` is true, else None."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def token_limit(self) -> int | None:
        """max_completion_tokens, else max_tokens, else None (up to the end of the context)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: ``prompt`` is a string or a list holding one string."""

    prompt: Union[str, list[str]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    def n_logprobs(self) -> int | None:
        """``logprobs``: the alternatives per token (None = no log-probabilities)."""
        return self.logprobs

    def token_limit(self) -> int:
        """max_tokens, else OpenAI's default of 16 for text completions."""
        return 16 if self.max_tokens is None else self.max_tokens
